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
    private var process: Process?
    private var arguments: [String] = []
    private var environment: [String: String] = [:]

    public init(name: String, root: String, host: LabHost? = nil) {
        self.name = name
        self.host = host
        dataDirectory = "\(root)/\(name)"
        logPath = "\(root)/\(name).log"
        try? FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        FileManager.default.createFile(atPath: logPath, contents: nil)
    }

    public var id: String {
        get throws {
            let r = try Ferry.run(["--data", dataDirectory, "id", "--name", name])
            guard r.status == 0 else { throw HarnessError("ferry id failed: \(r.stderr)") }
            return r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    public var url: String { info["url"]?.stringValue ?? "" }
    public var pid: Int32? { process?.processIdentifier }
    public var isRunning: Bool { process?.isRunning ?? false }
    public var admin: AdminClient { AdminClient(base: info["adminURL"]?.stringValue ?? "", host: host) }

    /// Starts `ferry serve` with ephemeral ports and waits for readiness: node.json naming
    /// this process, and the admin API answering.
    public func start(_ extra: [String] = [], environment: [String: String] = [:], timeout: Double = 60) async throws {
        arguments = extra
        self.environment = environment
        try await launch()
    }

    /// Starts again with the same arguments (and the same data directory).
    public func restart(_ extra: [String]? = nil) async throws {
        if let extra { arguments = extra }
        try await launch()
    }

    private func launch() async throws {
        try? FileManager.default.removeItem(atPath: dataDirectory + "/node.json")
        var args = ["--data", dataDirectory, "serve", "--port", "0", "--admin-port", "0", "--name", name] + arguments
        if !args.contains("--discovery") && !args.contains("--config") { args.append("--no-discovery") }
        if host == nil && !args.contains("--interface") { args += ["--interface", "127.0.0.1"] }
        let p = Process()
        if let host {
            p.executableURL = URL(fileURLWithPath: "/usr/bin/nsenter")
            p.arguments = host.nsenterArguments + [Ferry.binary] + args
        } else {
            p.executableURL = URL(fileURLWithPath: Ferry.binary)
            p.arguments = args
        }
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "FERRY_DATA")
        env["FERRY_LOG_LEVEL"] = env["FERRY_LOG_LEVEL"] ?? "info"
        for (k, v) in environment { env[k] = v }
        p.environment = env
        let log = FileHandle(forWritingAtPath: logPath)!
        log.seekToEndOfFile()
        log.write(Data("=== start \(Date()) \(args.joined(separator: " "))\n".utf8))
        p.standardOutput = log
        p.standardError = log
        try p.run()
        process = p
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            if let data = FileManager.default.contents(atPath: dataDirectory + "/node.json"),
                let json = try? JSON.parse(Array(data)), let pid = json["pid"]?.intValue,
                host != nil || pid == Int64(p.processIdentifier)
            {
                info = json
                if (try? await admin.get("/")["id"]) != nil { return }
            }
            if !p.isRunning { throw HarnessError("\(name) exited during start-up:\n\(logTail())") }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw HarnessError("\(name) did not become ready:\n\(logTail())")
    }

    /// SIGTERM and wait; returns the exit status (0 is a graceful stop).
    @discardableResult
    public func stop() -> Int32 { signal(SIGTERM) }

    /// SIGKILL and wait: a crash.
    @discardableResult
    public func kill() -> Int32 { signal(SIGKILL) }

    private func signal(_ sig: Int32) -> Int32 {
        guard let p = process else { return -1 }
        if p.isRunning {
            // Under nsenter the node is nsenter's child (same pid after exec).
            Foundation.kill(p.processIdentifier, sig)
        }
        p.waitUntilExit()
        process = nil
        return p.terminationReason == .uncaughtSignal ? 128 + p.terminationStatus : p.terminationStatus
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
        if let p = process, p.isRunning { Foundation.kill(p.processIdentifier, SIGKILL) }
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
    public static func run(_ arguments: [String], host: LabHost? = nil) throws -> Result {
        try Shell.run(host.map { $0.nsenterArguments + [binary] + arguments } ?? arguments, executable: host == nil ? binary : "/usr/bin/nsenter")
    }
}

/// Runs programs and collects their output.
///
/// Hand-rolled over posix_spawn and waitpid rather than Foundation's Process: with scripts
/// that leave daemons behind (the lab's avahi and D-Bus), Process.waitUntilExit was seen
/// to miss the child's exit and hang with the child a zombie.
public enum Shell {
    public static func run(_ arguments: [String], executable: String) throws -> Ferry.Result {
        let dir = NSTemporaryDirectory() + "ferry-shell-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let outPath = dir + "/out", errPath = dir + "/err"
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "FERRY_DATA")
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for p in argv { free(p) }
            for p in envp { free(p) }
        }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, envp)
        guard rc == 0 else { throw HarnessError("cannot run \(executable): errno \(rc)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let exitStatus = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        let out = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
        let err = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        return Ferry.Result(status: exitStatus, stdout: out, stderr: err)
    }

    /// `bash -c COMMAND`.
    public static func bash(_ command: String) throws -> Ferry.Result {
        try run(["-c", command], executable: "/bin/bash")
    }
}

/// Bytes filled in by one reader thread and read after it finished (DispatchGroup.wait).
final class DataBox: @unchecked Sendable {
    var data = Data()
}
