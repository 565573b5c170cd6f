import ArgumentParser
import FerryCore
import FerryNode
import FerryStore
import Foundation
import Logging

/// The process's entry point: blocks SIGTERM and SIGINT before any thread exists (every
/// thread inherits the mask), then runs the command while this thread waits for it.
///
/// Not the async `main` of ArgumentParser: that ends in `dispatch_main`, whose main thread
/// waits in `sigsuspend` with an empty mask, so a signal that came before a command's
/// handler was registered took the default action (exit 130/143 in serve's first
/// milliseconds). Here the main thread keeps the signals blocked and `ProcessSignals`
/// reads them; nothing in Ferry runs on the main queue.
@main
enum FerryProcess {
    static func main() {
        ProcessSignals.blockInThisThread()
        ProcessSignals.start()
        let done = DispatchSemaphore(value: 0)
        // Unowned: the process's main task; `main` waits for it, then exits.
        Task.detached {
            await Ferry.main()
            done.signal()
        }
        done.wait()
        exit(0)
    }
}

/// The `ferry` command: a thin CLI over FerryStore (parse, call, print).
struct Ferry: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ferry",
        abstract: "Ferry: a peer-to-peer JSON document store for LANs.",
        discussion: """
            Data lives in --data DIR (default ./ferry-data, or $FERRY_DATA). \
            Every command accepts --json to print exactly one JSON value.
            Commands that only read (get, ls, changes, conflicts, info, check, watch, blob get, \
            status, peers, trust ls) never create a data directory: on one without Ferry data \
            they say so and exit 1.
            Exit status: 0 ok, 1 error, 3 not found, 4 conflict, 64 usage, 130/143 interrupted (sync).
            """,
        version: FerryVersion.current,
        subcommands: [
            Put.self, Get.self, Remove.self, List.self, Changes.self, Conflicts.self, Purge.self, Info.self,
            Import.self, BlobCommand.self, Compact.self, Check.self, Watch.self, Backup.self, Restore.self, Sync.self, ID.self, Serve.self,
            Status.self, Peers.self, Trust.self, Invite.self, Join.self, GroupCommand.self, CouchUserCommand.self, Find.self,
            IndexCommand.self, AccessCommand.self, UICommand.self,
        ]
    )

    static func main() async {
        // Everything Ferry creates (data directory, database, identity, trust and node files,
        // blobs) is its user's alone.
        umask(0o077)
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = LogLevel.current
            return StartupGatedLogHandler(inner: handler)
        }
        do {
            let arguments = Self.movingGlobalOptions(Array(CommandLine.arguments.dropFirst()))
            // Named here: with the global options moved behind it, ArgumentParser would
            // report `--data` as the unknown part.
            if let first = arguments.first, !first.hasPrefix("-"), first != "help",
                !configuration.subcommands.contains(where: { $0._commandName == first })
            {
                throw CLIError(message: "unknown command '\(first)' (ferry --help lists the commands)", status: 64)
            }
            var command = try parseAsRoot(arguments)
            if let reader = command as? any ReadsData { try reader.global.requireData() }
            if let named = command as? any NamesNode, let name = named.nodeName {
                do { try NodeName.validate(name) } catch { throw CLIError(message: "--name: \(error.description)", status: 64) }
            }
            if let serve = command as? Serve { serve.warnIfDataIsShared() }
            // `serve` takes the signals over for a graceful stop (ShutdownSignals); every
            // other command ends as the signal's default action would, unless it takes them
            // from ProcessSignals itself (sync, watch).
            if (command as? Serve)?.stdio ?? true { ProcessSignals.useDefaultAction() }
            if var async = command as? AsyncParsableCommand {
                try await async.run()
            } else {
                try command.run()
            }
        } catch let error as any FerryError {
            Output.fail(error.description, status: exitStatus(for: error))
        } catch let error as CLIError {
            Output.fail(error.message, status: error.status)
        } catch {
            let code = exitCode(for: error)
            // Help and --version print and exit 0 as ArgumentParser does.
            if code == .success { exit(withError: error) }
            // Every error starts `ferry:`, ArgumentParser's own (`Error: …`) too; its usage lines follow.
            var text = fullMessage(for: error)
            if text.hasPrefix("Error: ") { text = "ferry: " + text.dropFirst("Error: ".count) } else { text = "ferry: " + text }
            FileHandle.standardError.write(Data((text + "\n").utf8))
            Foundation.exit(code.rawValue)
        }
    }

    /// Lets the global options come before the subcommand (`ferry --data A put …`):
    /// ArgumentParser only accepts them on the subcommand, so they are moved there.
    static func movingGlobalOptions(_ args: [String]) -> [String] {
        var leading: [String] = []
        var i = 0
        while i < args.count {
            let a = args[i]
            if a == "--data", i + 1 < args.count {
                leading += [a, args[i + 1]]
                i += 2
            } else if a.hasPrefix("--data=") || a == "--json" || a == "--create" {
                leading.append(a)
                i += 1
            } else {
                break
            }
        }
        return Array(args[i...]) + leading
    }

    /// The exit status of a failure's kind (the one the HTTP APIs answer as 404 and 409):
    /// 3 not found, 4 conflict, 1 anything else.
    static func exitStatus(for error: any FerryError) -> Int32 {
        switch error.failure {
        case .notFound: return 3
        case .conflict: return 4
        default: return 1
        }
    }
}

/// Options every subcommand takes.
struct GlobalOptions: ParsableArguments {
    @Option(name: .long, help: "Data directory (default ./ferry-data, or $FERRY_DATA).")
    var data: String?

    @Flag(name: .long, help: "Print exactly one JSON value on stdout.")
    var json = false

    @Flag(
        name: .long,
        help: "Let a writing command create the data directory when it does not exist (without it, a missing directory is refused, so a mistyped --data writes nothing).")
    var create = false

    var dataDirectory: String {
        if let data { return data }
        if let env = ProcessInfo.processInfo.environment["FERRY_DATA"], !env.isEmpty { return env }
        return "ferry-data"
    }

    /// Opens the store for a command that writes, creating its database in an existing
    /// directory; a directory that does not exist is refused unless `--create` (or
    /// `creating`) says to make it: a mistyped `--data` must not write into the void.
    func openStore(creating: Bool = false) throws -> DocumentStore {
        if !creating && !create { try requireDirectory() }
        // A backup is written by `ferry backup` alone and read by `restore`; writing into it would fork a node.
        try DataDirectoryBackup.refuseUnusable(dataDirectory)
        return try DocumentStore.open(directory: dataDirectory)
    }

    /// Fails, naming a sibling data directory the name may have meant, when the data
    /// directory does not exist.
    func requireDirectory() throws {
        var isDirectory: ObjCBool = false
        guard !FileManager.default.fileExists(atPath: dataDirectory, isDirectory: &isDirectory) else {
            try requireFerryContents(isDirectory: isDirectory.boolValue)
            return
        }
        var message = "no data directory \(dataDirectory)"
        if let near = Self.nearestDataDirectory(to: dataDirectory) { message += "; did you mean \(near)?" }
        message += " (to start a new one there, pass --create, or run `ferry --data \(dataDirectory) serve`)"
        throw CLIError(message: message)
    }

    /// What marks a directory as Ferry's: any one of them.
    static let dataMarkers = [DocumentStore.databaseFileName, "identity", "trust.json", "node.json", "couch-users.json", "serve.lock"]

    /// Fails when the existing path is not a Ferry data directory: a file, or a directory
    /// that holds other things and none of Ferry's (a mistyped `--data ~/Documents` must not
    /// gain a database). An empty directory (made for a node) is fine.
    func requireFerryContents(isDirectory: Bool) throws {
        guard isDirectory else { throw CLIError(message: "\(dataDirectory) is a file, not a data directory") }
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: dataDirectory), !entries.isEmpty else { return }
        guard !Self.dataMarkers.contains(where: entries.contains) else { return }
        throw CLIError(
            message: "\(dataDirectory) is not a Ferry data directory (it holds other files and no Ferry data); pass --create to start one there anyway, or name the data directory with --data")
    }

    /// A directory beside `path` whose name is at most two edits from its name and that
    /// holds Ferry data; nil when there is none.
    static func nearestDataDirectory(to path: String) -> String? {
        let url = URL(fileURLWithPath: path)
        let name = url.lastPathComponent
        let parent = url.deletingLastPathComponent().path
        guard let siblings = try? FileManager.default.contentsOfDirectory(atPath: parent) else { return nil }
        let candidates = siblings.filter { sibling in
            FileManager.default.fileExists(atPath: "\(parent)/\(sibling)/\(DocumentStore.databaseFileName)")
        }
        let scored = candidates.map { ($0, editDistance(name, $0)) }.filter { $0.1 <= 2 }.sorted { $0.1 < $1.1 }
        guard let best = scored.first?.0 else { return nil }
        return path.contains("/") ? "\(URL(fileURLWithPath: path).deletingLastPathComponent().relativePath)/\(best)" : best
    }

    /// Levenshtein distance between two short names.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a), b = Array(b)
        var row = Array(0...b.count)
        for i in 1...max(a.count, 1) where !a.isEmpty {
            var previous = row[0]
            row[0] = i
            for j in stride(from: 1, through: b.count, by: 1) {
                let current = row[j]
                row[j] = min(row[j] + 1, row[j - 1] + 1, previous + (a[i - 1] == b[j - 1] ? 0 : 1))
                previous = current
            }
        }
        return a.isEmpty ? b.count : row[b.count]
    }

    /// Opens the store for a command that only reads: creates nothing, and a read-only
    /// data directory is opened read-only.
    func openExistingStore() throws -> DocumentStore {
        try DocumentStore.openExisting(directory: dataDirectory)
    }

    /// Fails unless the data directory holds something of Ferry's (a database, an identity,
    /// a trust store or a running node's node.json), so a mistyped --data is reported.
    func requireData() throws {
        var st = stat()
        if stat(dataDirectory, &st) == 0, access(dataDirectory, R_OK | X_OK) != 0 {
            throw CLIError(message: "cannot read the data directory \(dataDirectory): permission denied (run the CLI as the node's user)")
        }
        let markers = [DocumentStore.databaseFileName, "identity", "trust.json", "node.json"]
        guard markers.contains(where: { FileManager.default.fileExists(atPath: "\(dataDirectory)/\($0)") }) else {
            throw StoreError.noDatabase(directory: dataDirectory)
        }
    }
}

/// A command that only reads a data directory, so it must never create one: `main`
/// checks that the directory holds Ferry data before running it.
protocol ReadsData {
    var global: GlobalOptions { get }
}

extension Get: ReadsData {}
extension List: ReadsData {}
extension Changes: ReadsData {}
extension Conflicts: ReadsData {}
extension Info: ReadsData {}
extension Check: ReadsData {}
extension Watch: ReadsData {}
extension BlobGet: ReadsData {}
extension Status: ReadsData {}
extension Peers: ReadsData {}
extension TrustList: ReadsData {}

/// A command that names this node (`--name`), which `main` refuses when it holds control
/// or format characters (`NodeName`).
protocol NamesNode {
    var nodeName: String? { get }
}

extension ID: NamesNode {
    var nodeName: String? { name }
}

extension Serve: NamesNode {
    var nodeName: String? { name }

    /// Logs a warning when the data directory (an existing one: a new one is created
    /// owner-only) may be read or entered by other users.
    func warnIfDataIsShared() {
        let configured = config.flatMap { try? NodeConfiguration.load(file: $0).dataDirectory }
        let dir = global.data ?? configured ?? global.dataDirectory
        var st = stat()
        guard stat(dir, &st) == 0, st.st_mode & 0o077 != 0 else { return }
        Logger(label: "ferry").warning(
            "the data directory is accessible to other users; restrict it with chmod 700",
            metadata: ["directory": "\(dir)", "mode": "\(String(st.st_mode & 0o777, radix: 8))"])
    }
}

/// The log level of loggers created from now on: $FERRY_LOG_LEVEL if set, else the
/// config's (for serve), else warning.
enum LogLevel {
    static let environment = ProcessInfo.processInfo.environment["FERRY_LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:))
    private static let box = Locked<Logger.Level>(environment ?? .warning)
    static var current: Logger.Level { box.withLock { $0 } }
    static func set(_ level: Logger.Level) {
        if environment == nil { box.withLock { $0 = level } }
    }
}

/// A CLI-level error with its exit status.
struct CLIError: Error {
    let message: String
    var status: Int32 = 1
}

/// Owns SIGTERM and SIGINT for the whole process: blocked in every thread from the first
/// line of `main`, read by one DispatchSource each (libdispatch reads blocked signals
/// through a signalfd), and handed on as the command decides.
///
/// Until it decides, signals are held. `deliver(to:)` passes them (the held ones first) to
/// a handler; `useDefaultAction()` ends the process by the signal, as if it had never been
/// blocked, unless the command has set SIG_IGN to read the signal with a DispatchSource of
/// its own (that source gets the signal too). So no command is left unkillable by the mask.
enum ProcessSignals {
    static let signals: [Int32] = [SIGTERM, SIGINT]

    private enum Route {
        case holding([Int32])
        case handler(@Sendable (Int32) -> Void)
        case defaultAction
    }

    private static let route = Locked(Route.holding([]))
    nonisolated(unsafe) private static var sources: [any DispatchSourceSignal] = []

    /// Blocks SIGTERM and SIGINT in the calling thread and in every thread it starts after.
    static func blockInThisThread() {
        var set = sigset_t()
        sigemptyset(&set)
        for sig in signals { sigaddset(&set, sig) }
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Starts reading the signals (once, from `main`, before the command runs).
    static func start() {
        sources = signals.map { sig in
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { received(sig) }
            source.resume()
            return source
        }
    }

    /// From now on each signal goes to `handler`; those received so far go first.
    static func deliver(to handler: @escaping @Sendable (Int32) -> Void) {
        let held = route.withLock { route -> [Int32] in
            defer { route = .handler(handler) }
            if case .holding(let held) = route { return held }
            return []
        }
        for sig in held { handler(sig) }
    }

    /// From now on a signal ends the process as its default action would (a held one at once).
    static func useDefaultAction() {
        let held = route.withLock { route -> [Int32] in
            defer { route = .defaultAction }
            if case .holding(let held) = route { return held }
            return []
        }
        if let first = held.first { terminate(by: first) }
    }

    private static func received(_ sig: Int32) {
        let handler = route.withLock { route -> (@Sendable (Int32) -> Void)?? in
            switch route {
            case .holding(let held):
                route = .holding(held + [sig])
                return nil
            case .handler(let handler):
                return .some(handler)
            case .defaultAction:
                return .some(nil)
            }
        }
        switch handler {
        case .none: return
        case .some(.some(let handler)): handler(sig)
        case .some(.none): if !isIgnored(sig) { terminate(by: sig) }
        }
    }

    /// Whether the command set SIG_IGN for `sig` (to read it with its own DispatchSource).
    private static func isIgnored(_ sig: Int32) -> Bool {
        var action = sigaction()
        sigaction(sig, nil, &action)
        return unsafeBitCast(action.__sigaction_handler.sa_handler, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self)
    }

    /// Ends the process by `sig`, as the default action does (the parent sees the signal).
    static func terminate(by sig: Int32) -> Never {
        signal(sig, SIG_DFL)
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, sig)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
        raise(sig)
        _exit(128 + sig)
    }
}
