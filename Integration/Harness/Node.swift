import FerryCore
import Foundation

/// One real `ferry serve` process with its own temporary data directory, driven through
/// its admin API: started with ephemeral ports, awaited through DATA/node.json (never a
/// fixed sleep), stopped with SIGTERM or killed with SIGKILL, and restarted.
public final class Node: @unchecked Sendable {
    // @unchecked: a Node is driven by one test at a time; `process` is only touched by it.
    public let name: String
    public let dataDirectory: String
    public let logPath: String
    /// Where the node runs: this machine's namespaces, or a LAN-lab host.
    public let host: LabHost?
    public private(set) var info: JSON = .null
    private var process: ChildProcess?
    private var arguments: [String] = []
    /// The listen port the next start takes (0, any free one, when nil).
    private var keptPort: Int?
    private var environment: [String: String] = [:]
    private var launcher: [String] = []
    private var readinessTimeout: Double = 60

    public init(name: String, root: String, host: LabHost? = nil) {
        self.name = name
        self.host = host
        dataDirectory = "\(root)/\(name)"
        logPath = "\(root)/\(name).log"
        try? FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
    }

    public var id: String {
        get async throws {
            let r = try await Ferry.run(["--data", dataDirectory, "id", "--name", name])
            guard r.status == 0 else { throw HarnessError("ferry id failed: \(r.stderr)") }
            return r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    public var url: String { info["url"]?.stringValue ?? "" }
    public var pid: Int32? { process?.pid }
    public var isRunning: Bool { process?.isRunning ?? false }
    public var admin: AdminClient { AdminClient(base: info["adminURL"]?.stringValue ?? "", host: host, key: adminKey) }
    /// The CouchDB API's loopback base URL from node.json (`http://127.0.0.1:PORT/`).
    public var couchURL: String { info["couchURL"]?.stringValue ?? "" }

    /// The node's admin key, read from its data directory (nil before its first start).
    public var adminKey: String? {
        (try? String(contentsOfFile: dataDirectory + "/admin.key", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Starts `ferry serve` with ephemeral ports and waits for readiness: node.json naming
    /// this process, and the admin API answering.
    /// Starts the node. `launcher` is a program (and its arguments) that execs `ferry` with
    /// the rest of the command line, such as `/usr/bin/env` (on this machine only).
    public func start(_ extra: [String] = [], environment: [String: String] = [:], launcher: [String] = [], timeout: Double = 60) async throws {
        arguments = extra
        self.environment = environment
        self.launcher = launcher
        readinessTimeout = timeout
        try await launch()
    }

    /// Starts again with the same arguments (and the same data directory).
    public func restart(_ extra: [String]? = nil) async throws {
        if let extra { arguments = extra }
        try await launch()
    }

    /// Starts the node again on the listen port it had, so that peers' addresses for it stay
    /// right (a restart on a new port leans on the address record and discovery to tell them).
    public func restartOnSamePort() async throws {
        keptPort = info["port"]?.intValue.map(Int.init)
        defer { keptPort = nil }
        try await launch()
    }

    /// Starts the node again on another listen port than it had, then waits up to `within`
    /// seconds until each of `peers` has a live connection with it again: they must learn
    /// where it listens now (its address record, DNS-SD) and dial it there.
    public func restartOnNewPort(reconnectingWith peers: [Node], within: Double = 5) async throws {
        let oldPort = info["port"]?.intValue
        try await launch()
        guard info["port"]?.intValue != oldPort else { throw HarnessError("\(name) took its old port \(oldPort ?? 0) again") }
        let me = try await admin.get("/")["id"]?.stringValue ?? ""
        let newPort = info["port"]?.intValue ?? 0
        let started = ContinuousClock.now
        do {
            try await waitUntil("\(peers.map(\.name).joined(separator: ", ")) connected to \(name) at its new port", timeout: within) {
                for peer in peers {
                    guard case .array(let list)? = try await peer.admin.get("/peers")["peers"] else { return false }
                    // Connected, and a peer that dials this node dials it at its new port.
                    guard let entry = list.first(where: { $0["id"]?.stringValue == me }), entry["connected"]?.boolValue == true,
                        entry["url"]?.stringValue.map({ $0.contains(":\(newPort)/") }) ?? true
                    else { return false }
                }
                return true
            }
            print("\(name) moved from port \(oldPort ?? 0) to \(newPort); its peers were connected again after \(ContinuousClock.now - started)")
        } catch {
            print("\(name) log:\n\(logTail(60))\n" + peers.map { "\($0.name) log:\n\($0.logTail(60))" }.joined(separator: "\n"))
            throw error
        }
    }

    private func launch() async throws {
        try? FileManager.default.removeItem(atPath: dataDirectory + "/node.json")
        var args = ["--data", dataDirectory, "serve", "--port", "\(keptPort ?? 0)", "--admin-port", "0", "--couch-port", "0", "--name", name] + arguments
        if !args.contains("--discovery") && !args.contains("--config") { args.append("--no-discovery") }
        if host == nil && !args.contains("--interface") { args += ["--interface", "127.0.0.1"] }
        let executable = host == nil ? launcher.first ?? Ferry.binary : "/usr/bin/nsenter"
        let argv = host.map { $0.nsenterArguments + [Ferry.binary] + args } ?? (launcher.isEmpty ? args : launcher.dropFirst() + [Ferry.binary] + args)
        var env = host == nil ? ProcessInfo.processInfo.environment.filter { $0.key != "FERRY_DATA" } : LabHost.environment
        env["FERRY_LOG_LEVEL"] = env["FERRY_LOG_LEVEL"] ?? "info"
        for (k, v) in environment { env[k] = v }
        appendToLog("=== start \(Date()) \(args.joined(separator: " "))")
        let p = try ChildProcess.spawn(executable, argv, environment: env, stdoutPath: logPath, stderrPath: logPath)
        process = p
        let ready = try await eventually(readinessTimeout) {
            if let data = FileManager.default.contents(atPath: dataDirectory + "/node.json"),
                let json = try? JSON.parse(Array(data)), let pid = json["pid"]?.intValue,
                host != nil || pid == Int64(p.pid)
            {
                info = json
                if (try? await admin.get("/")["id"]) != nil { return true }
            }
            if !p.isRunning { throw HarnessError("\(name) exited during start-up:\n\(logTail())") }
            return false
        }
        if ready { return }
        throw HarnessError("\(name) did not become ready:\n\(logTail())")
    }

    /// SIGTERM and wait; returns the exit status (0 is a graceful stop). A node that has
    /// not stopped after `grace` seconds is killed, and the status says so (137).
    @discardableResult
    public func stop(grace: Double = 60) async -> Int32 { await signal(SIGTERM, grace: grace) }

    /// SIGKILL and wait: a crash.
    @discardableResult
    public func kill() async -> Int32 { await signal(SIGKILL, grace: 30) }

    /// SIGKILL without waiting for the exit (for `defer`); the child is reaped when released.
    public func killNow() {
        process?.signal(SIGKILL)
        process = nil
    }

    private func signal(_ sig: Int32, grace: Double) async -> Int32 {
        guard let p = process else { return -1 }
        // Under nsenter the node is nsenter's child (same pid after exec).
        let (status, graceful) = await p.stop(sig, grace: grace)
        if !graceful { appendToLog("=== harness: no exit \(Int(grace)) s after signal \(sig); killed") }
        process = nil
        return status
    }

    /// A harness line in the node's log, between its own lines.
    private func appendToLog(_ line: String) {
        guard let log = FileHandle(forWritingAtPath: logPath) else { return }
        log.seekToEndOfFile()
        log.write(Data((line + "\n").utf8))
        try? log.close()
    }

    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    public func logTail(_ lines: Int = 40) -> String {
        log.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
    }

    /// Lines that mean the node crashed or misbehaved: Swift runtime traps, sanitizer
    /// reports, and error-level log lines not matched by `allowed`.
    public func problems(allowed: [String] = []) -> [String] {
        log.split(separator: "\n").map(String.init).filter { line in
            let bad = line.contains("Fatal error") || line.contains("Sanitizer") || line.contains("SUMMARY:")
                || line.contains("Illegal instruction") || line.contains("Segmentation fault")
                || line.contains(" error ferry") || line.contains(" critical ferry")
            return bad && !allowed.contains { line.contains($0) }
        }
    }

    deinit {
        process?.signal(SIGKILL)
    }
}

/// A harness failure with a readable reason.
public struct HarnessError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// The built `ferry` binary, and a way to run it once.
public enum Ferry {
    /// Beside the test bundle (SwiftPM builds it first), or $FERRY_BINARY.
    public static let binary: String = {
        if let env = ProcessInfo.processInfo.environment["FERRY_BINARY"] { return env }
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = (exe as NSString).deletingLastPathComponent
        while !dir.isEmpty && dir != "/" {
            let candidate = dir + "/ferry"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            dir = (dir as NSString).deletingLastPathComponent
        }
        fatalError("cannot find the ferry binary near \(exe); run `swift build` first or set FERRY_BINARY")
    }()

    public struct Result: Sendable {
        public let status: Int32
        public let stdout: String
        public let stderr: String
    }

    /// Runs `ferry ARGS` (optionally on a lab host) and waits for it.
    public static func run(_ arguments: [String], host: LabHost? = nil, stdin: String? = nil, timeout: Double = 120) async throws -> Result {
        try await Shell.run(
            host.map { $0.nsenterArguments + [binary] + arguments } ?? arguments,
            executable: host == nil ? binary : "/usr/bin/nsenter", stdin: stdin,
            environment: host == nil ? nil : LabHost.environment, timeout: timeout)
    }
}
