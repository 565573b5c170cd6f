import Foundation

/// This test process's own D-Bus and avahi-daemon, in a private network and mount namespace
/// (scripts/avahi-loopback.sh), with a lease so that a test which restarts the daemon never
/// runs beside one that uses it.
///
/// The daemons never meet the machine's own avahi-daemon or another test run's: their
/// mDNS stays on the namespace's `lo`. Processes outside reach them through the bus socket
/// in `state` (`DBUS_SYSTEM_BUS_ADDRESS`, set for this process and so inherited by its
/// children); they start with the first lease and stop when the last one ends, or when
/// this process exits. All test targets run in one process and their suites run in
/// parallel, so `.serialized` on a suite is not enough: the lease is process-wide.
public enum LoopbackAvahi {
    /// Whether this machine must run the discovery tests (root or CI): there a daemon that
    /// cannot start is a test failure, never a skip. Use as `.enabled(if: LoopbackAvahi.required)`.
    public static var required: Bool { getuid() == 0 || ProcessInfo.processInfo.environment["CI"] != nil }

    /// The control script, found from this file's place in the repository.
    public static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../scripts/avahi-loopback.sh").standardized.path

    /// This process's instance: pids, configs and the bus socket.
    public static let state = "/var/tmp/ferry-avahi-\(getpid())"

    /// The D-Bus address of the instance's system bus, usable outside the namespace.
    public static var busAddress: String { "unix:path=\(state)/system_bus_socket" }

    /// Runs `body` holding the daemon: shared with other users, or alone when `exclusive`
    /// (a test that stops and restarts it). `body` gets nil when the daemon runs, else why not.
    public static func withDaemon<T: Sendable>(
        exclusive: Bool = false, _ body: @Sendable (String?) async throws -> T
    ) async throws -> T {
        await lease.acquire(exclusive: exclusive)
        let why = await instance.enter()
        do {
            let result = try await body(why)
            await instance.leave()
            await lease.release(exclusive: exclusive)
            return result
        } catch {
            await instance.leave()
            await lease.release(exclusive: exclusive)
            throw error
        }
    }

    /// `argv` run inside the namespace (its `lo` and /run), e.g. an mDNS client of its own.
    public static func inside(_ argv: [String]) -> [String] { ["env", "FERRY_AVAHI_STATE=\(state)", script, "run"] + argv }

    /// Stops avahi-daemon only (the bus stays); nil when done, else why not. Only under an
    /// exclusive lease.
    public static func stopDaemon() async -> String? { await control(["stop-avahi"]) }

    /// Starts avahi-daemon again and waits until it runs; nil when it does, else why not.
    public static func startDaemon() async -> String? { await control(["start-avahi"]) }

    /// The pid recorded for `name` (`avahi`, `dbus`) by scripts/avahi-loopback.sh.
    public static func recordedPID(_ name: String) -> pid_t? {
        (try? String(contentsOfFile: "\(state)/\(name).pid", encoding: .utf8))
            .flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// Whether `pid` has exited (gone, or a zombie nobody has reaped yet).
    public static func hasExited(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else {
            return true
        }
        return stat[close...].hasPrefix(") Z")
    }

    static func control(_ arguments: [String]) async -> String? {
        do {
            var env = ProcessInfo.processInfo.environment
            env["FERRY_AVAHI_STATE"] = state
            let r = try await Shell.run([script] + arguments, executable: "/bin/bash", environment: env, timeout: 60)
            return r.status == 0 ? nil : r.stderr + r.stdout
        } catch {
            return "cannot run \(script): \(error)"
        }
    }

    private static let lease = ReadWriteLease()
    private static let instance = Instance()
}

/// Starts the namespace for the first user and stops it after the last, one transition at a time.
private actor Instance {
    private var users = 0
    /// Set once, before the first client connects, and never changed: the test process's
    /// own clients (libdbus reads it on connecting) and its children then use this bus.
    private static let exported: Void = { setenv("DBUS_SYSTEM_BUS_ADDRESS", LoopbackAvahi.busAddress, 1) }()
    /// The latest start or stop; each waits for the one before.
    private var transition: Task<String?, Never>?

    func enter() async -> String? {
        users += 1
        if users == 1 {
            _ = Self.exported
            // With this process's pid the namespace also stops if the process dies first.
            then { await LoopbackAvahi.control(["start", String(getpid())]) }
        }
        return await transition?.value
    }

    /// After the last user, returns once everything has stopped: the process may exit next.
    func leave() async {
        users -= 1
        guard users == 0 else { return }
        then { await LoopbackAvahi.control(["stop"]) }
        _ = await transition?.value
    }

    private func then(_ step: @escaping @Sendable () async -> String?) {
        let previous = transition
        transition = Task {
            _ = await previous?.value
            return await step()
        }
    }
}

/// A first-come-first-served shared/exclusive lock for async code: it suspends, never blocks a thread.
actor ReadWriteLease {
    private var readers = 0
    private var writing = false
    private var waiting: [(exclusive: Bool, resume: CheckedContinuation<Void, Never>)] = []

    func acquire(exclusive: Bool) async {
        if waiting.isEmpty && canEnter(exclusive: exclusive) {
            enter(exclusive: exclusive)
            return
        }
        await withCheckedContinuation { waiting.append((exclusive, $0)) }
    }

    func release(exclusive: Bool) {
        if exclusive { writing = false } else { readers -= 1 }
        // Admit waiters in order while they fit: several readers at once, or one writer.
        while let next = waiting.first, canEnter(exclusive: next.exclusive) {
            waiting.removeFirst()
            enter(exclusive: next.exclusive)
            next.resume.resume()
        }
    }

    private func canEnter(exclusive: Bool) -> Bool { exclusive ? !writing && readers == 0 : !writing }

    private func enter(exclusive: Bool) {
        if exclusive { writing = true } else { readers += 1 }
    }
}
