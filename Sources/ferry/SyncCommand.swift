import ArgumentParser
import FerryCore
import FerryCouch
import FerryCouchClient
import FerryNode
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging

/// `ferry sync`: one replication with a directory, URL, Unix socket, command or CouchDB database.
struct Sync: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Replicate with another Ferry database or a CouchDB database: a data directory, a peer URL, a Unix socket, a command or an http(s):// database URL.",
        discussion: """
            TARGET is a data directory on this machine, wss://HOST:PORT/ferry/sync (with --pin \
            NODEID), unix:PATH (a `ferry serve --unix PATH`), or use --exec "COMMAND" to replicate \
            over a command's stdin/stdout (e.g. "ssh host ferry serve --stdio"). \
            http(s)://[USER:PASSWORD@]HOST:PORT/DATABASE replicates with a CouchDB-protocol \
            database (Apache CouchDB, Cloudant, PouchDB Server, a Ferry node's CouchDB API): give \
            the credentials in the URL, with --credentials-file FILE or --credentials-env NAME \
            (USER:PASSWORD); for a self-signed https server, --pin the SHA-256 of its certificate. \
            Push-and-pull and one-shot by default; running it twice in a row transfers nothing \
            the second time. See docs/couchdb-replication.md.
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "A data directory, wss://… URL, unix:PATH or http(s)://…/DATABASE URL.") var path: String?
    @Option(help: "The peer's node ID (for wss:// URLs), or the SHA-256 of the server certificate's DER in 64 hex digits (for https:// CouchDB URLs).")
    var pin: String?
    @Option(help: "Pin the peer's certificate from a PEM file instead of --pin.") var pinCert: String?
    @Option(help: "Replicate over this command's stdin/stdout.") var exec: String?
    @Option(help: "For a password-protected listener (wss://): USER:PASSWORD on the first line of this file (mode 0600). Or set FERRY_PASSWORD=USER:PASSWORD.")
    var passwordFile: String?
    /// Refused: a password in the command line is visible to every local user.
    @Option(help: .hidden) var password: String?
    @Flag(help: "Only push local changes to PATH.") var push = false
    @Flag(help: "Only pull changes from PATH.") var pull = false
    @Flag(help: "Keep replicating until interrupted (Ctrl-C).") var continuous = false
    @Option(help: "Conflict resolution: default or keepConflicts (keep conflicts visible), deletesWin, lastWriteWins or lww, merge.")
    var resolve: String = "default"
    @Flag(help: "Send every revision in full (no deltas).") var noDeltas = false
    @Flag(help: "Start from the beginning instead of the saved checkpoints.") var resetCheckpoint = false
    @Option(help: "Replicate only these documents (comma-separated IDs).") var docIds: String?
    @Option(help: "Replicate only documents matching this Mango selector (a JSON object), both ways.") var selector: String?
    @Option(help: "Read the CouchDB credentials USER:PASSWORD from this file (first line).") var credentialsFile: String?
    @Option(help: "Read the CouchDB credentials USER:PASSWORD from this environment variable.") var credentialsEnv: String?
    @Flag(help: "Create the CouchDB database when it does not exist (when pushing).") var createTarget = false

    /// Whether the target is a CouchDB-protocol database URL.
    var isCouch: Bool { path.map(CouchEndpoint.isCouchURL) ?? false }

    /// The document IDs of --doc-ids.
    func documentIDs() throws -> Set<DocumentID>? {
        guard let docIds else { return nil }
        var ids = Set<DocumentID>()
        for part in docIds.split(separator: ",", omittingEmptySubsequences: true) {
            let text = part.trimmingCharacters(in: .whitespaces)
            do { ids.insert(try DocumentID(text)) } catch { throw ValidationError("--doc-ids: \"\(text)\" is not a valid document ID") }
        }
        guard !ids.isEmpty else { throw ValidationError("--doc-ids needs at least one document ID") }
        return ids
    }

    /// The selector of --selector, checked.
    func selectorJSON() throws -> JSON? {
        guard let selector else { return nil }
        guard let json = try? JSON.parse(Array(selector.utf8)), json.objectValue != nil else {
            throw ValidationError("--selector must be a JSON object, such as '{\"type\":\"note\"}'")
        }
        do { _ = try SelectorFilter.filter(json) } catch { throw ValidationError("--selector is not a valid Mango selector: \(error.description)") }
        return json
    }

    /// The CouchDB options the flags give.
    var couchOptions: CouchReplicationOptions {
        var o = CouchReplicationOptions()
        o.credentialsFile = credentialsFile
        o.credentialsEnv = credentialsEnv
        o.pin = pin?.lowercased()
        o.createTarget = createTarget
        o.selector = try? selectorJSON()
        return o
    }

    func validate() throws {
        if (path == nil) == (exec == nil) { throw ValidationError("give either a TARGET or --exec COMMAND") }
        _ = try documentIDs()
        _ = try selectorJSON()
        if isCouch {
            if pinCert != nil { throw ValidationError("--pin-cert is for wss:// peers; for an https:// CouchDB give --pin SHA256HEX") }
            if password != nil || passwordFile != nil {
                throw ValidationError("--password-file is for password-protected Ferry listeners; give CouchDB credentials in the URL, with --credentials-file or --credentials-env")
            }
            let direction: ReplicatorConfiguration.Direction = push ? .push : pull ? .pull : .pushAndPull
            if let problem = couchOptions.problem(url: path!, direction: direction) {
                let flag = ["credentialsFile": "--credentials-file", "credentialsEnv": "--credentials-env", "pin": "--pin", "createTarget": "--create-target", "selector": "--selector", "url": "TARGET"][problem.key] ?? problem.key
                throw ValidationError("\(flag): \(problem.reason)")
            }
        } else {
            for (flag, given) in [("--credentials-file", credentialsFile != nil), ("--credentials-env", credentialsEnv != nil), ("--create-target", createTarget)] where given {
                throw ValidationError("\(flag) is for CouchDB targets (http:// or https:// URLs)")
            }
        }
        if password != nil { throw ValidationError(ListenerPassword.argvRefusal) }
        if passwordFile != nil, !(path.map { $0.hasPrefix("wss://") || $0.hasPrefix("ws://") } ?? false) {
            throw ValidationError("--password-file is for password-protected listeners (wss:// targets)")
        }
        if let path, path.hasPrefix("wss://") || path.hasPrefix("ws://"), pin == nil && pinCert == nil {
            throw ValidationError("a wss:// target needs --pin NODEID (the peer's `ferry id`) or --pin-cert FILE")
        }
        if push && pull { throw ValidationError("--push and --pull are exclusive; give neither for both") }
        if NodeConfiguration.resolver(named: resolve) == nil {
            let names = NodeConfiguration.resolverNames.joined(separator: ", ")
            throw ValidationError("unknown --resolve \"\(resolve)\": use one of \(names)")
        }
    }

    /// Serves the data directory at `path` in-process over an in-memory endpoint pair.
    func localConnector(path: String) throws -> Replicator.Connector {
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDir), isDir.boolValue else {
            throw CLIError(message: "no directory at \(path): give the path of another Ferry data directory")
        }
        let here = URL(fileURLWithPath: global.dataDirectory).standardizedFileURL.resolvingSymlinksInPath().path
        let there = URL(fileURLWithPath: path).standardizedFileURL.resolvingSymlinksInPath().path
        if here == there { throw CLIError(message: "cannot sync a data directory with itself (\(path))") }
        // A directory without a database gets a new one: said, so that a mistyped path that
        // happens to exist is noticed.
        let fresh = !FileManager.default.fileExists(atPath: (path as NSString).appendingPathComponent(DocumentStore.databaseFileName))
        let remote = try DocumentStore.open(directory: path)
        if fresh { FileHandle.standardError.write(Data("\(path) held no Ferry database: started a new one there\n".utf8)) }
        // The other directory answers as its own `serve --stdio` would, with this sync's resolver.
        var replicators = ReplicationFactory(
            store: remote, nodeID: remote.uuid, trust: try TrustStore(dataDirectory: path, configuration: NodeConfiguration()),
            configuration: NodeConfiguration(), logger: Logger(label: "ferry.sync.responder"))
        replicators.resolvers = ResolverSet(fallback: NodeConfiguration.resolver(named: resolve)!)
        let responder = replicators.responder(authenticated: false)
        return {
            let (client, server) = InMemoryEndpoint.pair()
            // Unowned: the responder's session ends when the in-memory pair closes, with the replication.
            Task { await responder.serve(server) }
            return client
        }
    }

    func run() async throws {
        // A sync copies a whole database: it may start a new data directory.
        let local = try global.openStore(creating: true)
        if isCouch { return try await runCouch(local) }
        let connector: Replicator.Connector
        var nodeID = local.uuid
        if let exec {
            connector = { try await ByteStreamTransport.exec(command: exec) }
        } else if let path, path.hasPrefix("unix:") {
            let socket = String(path.dropFirst(5))
            connector = { try await ByteStreamTransport.connectUnix(path: socket) }
        } else if let path, path.hasPrefix("wss://") || path.hasPrefix("ws://") {
            let identity = try NodeIdentity.loadOrCreate(directory: global.dataDirectory)
            nodeID = identity.nodeID
            let trust = try pinCert.map { try PeerTrust.pinnedCertificate(pemFile: $0) } ?? .pinned([pin!.lowercased()])
            var dialer = try WebSocketConnector(url: path, serverTrust: trust, identity: identity)
            if let credentials = try ListenerPassword.read(file: passwordFile) { dialer.credentials = credentials }
            connector = dialer.connector
        } else {
            connector = try localConnector(path: path!)
        }
        // The outcome is reported once, below; the replicator's own log lines only with
        // $FERRY_LOG_LEVEL.
        var logger = Logger(label: "ferry.sync")
        if LogLevel.environment == nil { logger.logLevel = .critical }
        // Built as `serve` builds its links: the pinned peer's trust-store policy bounds what it may write here.
        let trust = try TrustStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
        var replicators = ReplicationFactory(store: local, nodeID: nodeID, trust: trust, configuration: NodeConfiguration(), logger: logger)
        replicators.resolvers = ResolverSet(fallback: NodeConfiguration.resolver(named: resolve)!)
        let peerID = exec == nil && pinCert == nil ? pin?.lowercased() : nil
        let replicator = replicators.replicator(peerID: peerID, connector: connector) { config in
            config.direction = push ? .push : pull ? .pull : .pushAndPull
            config.continuous = continuous
            config.deltas = !noDeltas
            config.resetCheckpoint = resetCheckpoint
            config.heartbeat = .seconds(continuous ? 30 : 1)
            if !continuous { config.maxAttempts = 3 }
            config.documentIDs = try? documentIDs()
            if let selector = try? selectorJSON(), let filter = try? SelectorFilter.filter(selector) {
                config.pullFilter = config.pullFilter.map { node in RevisionFilter(name: "\(node.name)+\(filter.name)") { node.admits($0) && filter.admits($0) } } ?? filter
                config.pushFilter = filter
            }
        }
        try await drive(replicator)
    }

    /// Runs `replicator` to its end, then prints the summary or throws the failure.
    func drive(
        _ replicator: Replicator, hint: (SyncError) -> String? = { _ in nil }, onInterrupt: @escaping @Sendable () -> Void = {}
    ) async throws {
        let progress = ProgressBar(enabled: isatty(STDERR_FILENO) == 1 && !global.json)
        let statuses = replicator.statusChanges()
        let watcher = Task {
            for await status in statuses { progress.show(status, replicator.summary) }
        }
        // Blob bytes move between status changes: redraw on a tick too, so a long blob's
        // bytes and rate stay current.
        let ticker = Task {
            guard progress.enabled else { return }
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(250))
                progress.show(replicator.status, replicator.summary)
            }
        }
        let interruption = FirstSignal()
        let stop = SignalWatcher.onInterrupt { signal in
            interruption.record(signal)
            replicator.stop()
            onInterrupt()
        }
        // Started as its own task, so that a stop also ends a wait on a silent peer.
        replicator.start()
        await replicator.waitUntilStopped()
        stop.cancel()
        let interrupted = interruption.signal
        ticker.cancel()
        await watcher.value
        await ticker.value
        progress.finish()

        let s = replicator.summary
        let error = replicator.status.error
        if global.json {
            var out: [String: JSON] = [
                "pushed": .int(Int64(s.pushed)), "pulled": .int(Int64(s.pulled)), "rejected": .int(Int64(s.rejected)),
                "conflicts": .int(Int64(s.conflicts)), "resolved": .int(Int64(s.resolved)),
                "bytesSent": .int(Int64(s.bytesSent)), "bytesReceived": .int(Int64(s.bytesReceived)),
                "deltasSent": .int(Int64(s.deltasSent)), "deltasReceived": .int(Int64(s.deltasReceived)),
                "blobsSent": .int(Int64(s.blobsSent)), "blobsReceived": .int(Int64(s.blobsReceived)),
                "blobBytesSent": .int(s.blobBytesSent), "blobBytesReceived": .int(s.blobBytesReceived),
                "ok": .bool(error == nil && interrupted == nil),
            ]
            if let interrupted {
                out["interrupted"] = true
                out["error"] = .string("interrupted by \(SignalWatcher.name(interrupted))")
            } else if let error {
                out["error"] = .string(error.statusText)
            }
            Output.json(.object(out))
        } else if error == nil && interrupted == nil {
            Output.line(
                "pushed \(s.pushed), pulled \(s.pulled), rejected \(s.rejected), conflicts \(s.conflicts) (resolved with \(s.resolved) revisions); "
                    + "sent \(s.bytesSent) bytes, received \(s.bytesReceived) bytes, deltas \(s.deltasSent) sent / \(s.deltasReceived) received; "
                    + "blobs \(s.blobsSent) sent / \(s.blobsReceived) received, blob bytes \(s.blobBytesSent) sent / \(s.blobBytesReceived) received")
        }
        if let interrupted {
            // What was stored is checkpointed: the next sync resumes from there.
            throw CLIError(
                message: "sync interrupted by \(SignalWatcher.name(interrupted)) (pushed \(s.pushed), pulled \(s.pulled); the next sync resumes from there)",
                status: 128 + interrupted)
        }
        if let error { throw CLIError(message: "replication failed: \(error.statusText)\(hint(error).map { " (\($0))" } ?? "")") }
    }
}

/// A one-line progress display on stderr, shown only on a terminal: documents done/total,
/// blob bytes done/total and their rate, the time left, and the replicator's activity.
final class ProgressBar: Sendable {
    let enabled: Bool
    /// The blob bytes and time of the last rate sample, and the rate then (bytes/s).
    private let rate = Locked<(bytes: Int64, at: ContinuousClock.Instant, perSecond: Double)>((0, .now, 0))
    /// The same for documents (documents/s).
    private let docRate = Locked<(done: Int, at: ContinuousClock.Instant, perSecond: Double)>((0, .now, 0))
    init(enabled: Bool) { self.enabled = enabled }

    func show(_ status: ReplicatorStatus, _ summary: ReplicationSummary) {
        guard enabled else { return }
        FileHandle.standardError.write(Data(("\r" + line(status, summary) + "\u{1B}[K").utf8))
    }

    /// The progress line without its carriage return.
    func line(_ status: ReplicatorStatus, _ summary: ReplicationSummary, now: ContinuousClock.Instant = .now) -> String {
        let blobDone = summary.blobBytesSent + summary.blobBytesReceived
        let blobTotal = max(summary.blobBytesToSend + summary.blobBytesToReceive, blobDone)
        let perSecond = rate.withLock { r -> Double in
            let (whole, atto) = (now - r.at).components
            let elapsed = Double(whole) + Double(atto) / 1e18
            // A rate over at least a second, smoothed, so the figure does not flicker.
            if elapsed >= 1 {
                let sample = Double(blobDone - r.bytes) / elapsed
                r.perSecond = r.perSecond == 0 ? sample : 0.5 * r.perSecond + 0.5 * sample
                r.bytes = blobDone
                r.at = now
            }
            return r.perSecond
        }
        let docsPerSecond = docRate.withLock { r -> Double in
            let (whole, atto) = (now - r.at).components
            let elapsed = Double(whole) + Double(atto) / 1e18
            if elapsed >= 1 {
                let sample = Double(status.completed - r.done) / elapsed
                r.perSecond = r.perSecond == 0 ? sample : 0.5 * r.perSecond + 0.5 * sample
                r.done = status.completed
                r.at = now
            }
            return r.perSecond
        }
        // Time left: the longer of what the documents and the blob bytes still need.
        var left: Double = 0
        if status.total > status.completed, docsPerSecond > 0 { left = Double(status.total - status.completed) / docsPerSecond }
        if blobTotal > blobDone, perSecond > 0 { left = max(left, Double(blobTotal - blobDone) / perSecond) }
        let fraction: Double
        if blobTotal > 0 {
            fraction = Double(blobDone) / Double(blobTotal)
        } else {
            fraction = status.total == 0 ? 1.0 : Double(status.completed) / Double(status.total)
        }
        let width = 24
        let filled = max(0, min(width, Int(fraction * Double(width))))
        var text = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled) + "]"
        text += " docs \(status.completed)/\(status.total)"
        if blobTotal > 0 {
            text += ", blobs \(Self.bytes(blobDone))/\(Self.bytes(blobTotal))"
            if perSecond > 0 { text += " at \(Self.bytes(Int64(perSecond)))/s" }
        }
        if left >= 1 { text += ", \(Self.duration(left)) left" }
        return text + " " + status.activity.rawValue
    }

    /// A time left as `42 s`, `3 min 5 s` or `2 h 10 min`.
    static func duration(_ seconds: Double) -> String {
        let s = Int(seconds.rounded())
        if s < 60 { return "\(s) s" }
        if s < 3600 { return "\(s / 60) min \(s % 60) s" }
        return "\(s / 3600) h \((s % 3600) / 60) min"
    }

    /// Bytes in binary units, one decimal above KiB.
    static func bytes(_ n: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var value = Double(n)
        var unit = 0
        while value >= 1024 && unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(n) B" : String(format: "%.1f %@", value, units[unit])
    }

    func finish() {
        if enabled { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

/// The first interrupting signal received, if any, and whether another followed.
final class FirstSignal: Sendable {
    private let state = Locked<(first: Int32?, second: Bool)>((nil, false))
    /// Records `signal`; returns whether it was the first.
    @discardableResult
    func record(_ signal: Int32) -> Bool {
        state.withLock { s in
            guard s.first == nil else {
                s.second = true
                return false
            }
            s.first = signal
            return true
        }
    }
    var signal: Int32? { state.withLock { $0.first } }
    var second: Bool { state.withLock { $0.second } }
}

/// Runs an action, given the signal, on SIGINT or SIGTERM until cancelled. The signals come
/// from `ProcessSignals` (blocked in every thread, read from a signalfd): no SIG_IGN, which
/// every child would inherit (a `sync --exec` command could not then be stopped by SIGTERM).
struct SignalWatcher {
    static func onInterrupt(_ action: @escaping @Sendable (Int32) -> Void) -> SignalWatcher {
        ProcessSignals.deliver(to: action)
        return SignalWatcher()
    }

    static func name(_ signal: Int32) -> String {
        signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "signal \(signal)"
    }

    /// From now on a signal ends the process as its default action would.
    func cancel() { ProcessSignals.useDefaultAction() }
}
