import Foundation

/// A child process spawned with posix_spawn whose exit is awaited asynchronously with a
/// deadline, so a test never blocks a thread of Swift's cooperative pool and never waits
/// forever.
///
/// Hand-rolled rather than Foundation's `Process`: its `waitUntilExit` blocks the calling
/// thread (on a 2-core machine the cooperative pool has two, so two waiting tests stall
/// every other test in the process), and it was seen to miss a child's exit and hang.
/// Output goes to files, so no pipe can fill up and stall the child.
public final class ChildProcess: @unchecked Sendable {
    // @unchecked: `status` is only touched under `lock`.
    public let pid: pid_t
    public let command: String
    private let lock = NSLock()
    private var status: Int32?

    private init(pid: pid_t, command: String) {
        self.pid = pid
        self.command = command
    }

    /// Starts `executable ARGS` with `environment` (default: this process's, without
    /// FERRY_DATA). Standard input is `stdinPath` (or /dev/null); standard
    /// output and error are appended to the given files (or discarded).
    public static func spawn(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        stdinPath: String? = nil, stdoutPath: String? = nil, stderrPath: String? = nil
    ) throws -> ChildProcess {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdinPath ?? "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdoutPath ?? "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0o600)
        if let stderrPath, stderrPath == stdoutPath {
            posix_spawn_file_actions_adddup2(&actions, 1, 2)
        } else {
            posix_spawn_file_actions_addopen(&actions, 2, stderrPath ?? "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0o600)
        }
        // Inherited, minus FERRY_DATA (a test's node must never touch the caller's data).
        let env = environment ?? ProcessInfo.processInfo.environment.filter { $0.key != "FERRY_DATA" }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for p in argv { free(p) }
            for p in envp { free(p) }
        }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, envp)
        guard rc == 0 else { throw HarnessError("cannot run \(executable): \(String(cString: strerror(rc)))") }
        return ChildProcess(pid: pid, command: ([executable] + arguments).joined(separator: " "))
    }

    /// The exit status once the child has exited (128 + N after signal N); nil while it runs.
    public var exitStatus: Int32? {
        lock.lock()
        defer { lock.unlock() }
        if let status { return status }
        var raw: Int32 = 0
        var rc: pid_t
        repeat { rc = waitpid(pid, &raw, WNOHANG) } while rc < 0 && errno == EINTR
        guard rc == pid else { return nil }
        let decoded = (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
        status = decoded
        return decoded
    }

    public var isRunning: Bool { exitStatus == nil }

    /// Waits up to `timeout` seconds for the child to exit; its status, or nil if it still runs.
    public func wait(timeout: Double) async -> Int32? {
        _ = await eventually(timeout, every: .milliseconds(10)) { exitStatus != nil }
        return exitStatus
    }

    public func signal(_ sig: Int32) {
        if isRunning { kill(pid, sig) }
    }

    /// Sends `sig` and waits for the exit; after `grace` seconds it is SIGKILLed, so this
    /// always returns. `graceful` is false when the kill was needed.
    public func stop(_ sig: Int32 = SIGTERM, grace: Double = 30) async -> (status: Int32, graceful: Bool) {
        signal(sig)
        if let s = await wait(timeout: grace) { return (s, true) }
        kill(pid, SIGKILL)
        let s = await wait(timeout: 30) ?? 128 + SIGKILL
        return (s, false)
    }

    deinit {
        // Never leave a child (or a zombie) behind.
        if isRunning {
            kill(pid, SIGKILL)
            var raw: Int32 = 0
            _ = waitpid(pid, &raw, 0)
        }
    }
}

/// Runs programs to completion and collects their output.
public enum Shell {
    /// Runs `executable ARGS`, with `stdin` as its input, and waits at most `timeout`
    /// seconds (then it is killed and the result says so).
    public static func run(
        _ arguments: [String], executable: String, stdin: String? = nil,
        environment: [String: String]? = nil, timeout: Double = 120
    ) async throws -> Ferry.Result {
        let dir = NSTemporaryDirectory() + "ferry-shell-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let outPath = dir + "/out", errPath = dir + "/err", inPath = dir + "/in"
        if let stdin { _ = FileManager.default.createFile(atPath: inPath, contents: Data(stdin.utf8)) }
        let child = try ChildProcess.spawn(
            executable, arguments, environment: environment, stdinPath: stdin == nil ? nil : inPath,
            stdoutPath: outPath, stderrPath: errPath)
        var status = await child.wait(timeout: timeout)
        var timedOut = ""
        if status == nil {
            status = await child.stop(SIGKILL, grace: 10).status
            timedOut = "\n[harness: \(child.command) killed after \(Int(timeout)) s]"
        }
        let out = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
        let err = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        return Ferry.Result(status: status ?? -1, stdout: out, stderr: err + timedOut)
    }

    /// `bash -c COMMAND`.
    public static func bash(_ command: String, timeout: Double = 120) async throws -> Ferry.Result {
        try await run(["-c", command], executable: "/bin/bash", timeout: timeout)
    }
}
