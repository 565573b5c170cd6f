import Foundation

/// The one loopback-confined avahi-daemon that discovery tests share (scripts/avahi-loopback.sh),
/// with a lease so that a test which restarts it never runs beside one that uses it.
///
/// All test targets run in one process and their suites run in parallel, so `.serialized`
/// on a suite is not enough: the lease is process-wide.
public enum LoopbackAvahi {
    /// Whether this machine must run the discovery tests (root or CI): there a missing
    /// daemon is a test failure, never a silent skip.
    public static var required: Bool { getuid() == 0 || ProcessInfo.processInfo.environment["CI"] != nil }

    /// The control script, found from this file's place in the repository.
    public static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../scripts/avahi-loopback.sh").standardized.path

    /// Runs `body` holding the daemon: shared with other users, or alone when `exclusive`
    /// (a test that stops and restarts it). `body` gets nil when the daemon runs, else why not.
    public static func withDaemon<T: Sendable>(
        exclusive: Bool = false, _ body: @Sendable (String?) async throws -> T
    ) async throws -> T {
        await lease.acquire(exclusive: exclusive)
        do {
            let result = try await body(await start())
            await lease.release(exclusive: exclusive)
            return result
        } catch {
            await lease.release(exclusive: exclusive)
            throw error
        }
    }

    /// Starts the daemon if it is not running (idempotent); nil when running, else why not.
    public static func start() async -> String? { await control("start") }

    /// Stops the daemon; nil when done, else why not. Only under an exclusive lease.
    public static func stop() async -> String? { await control("stop") }

    private static func control(_ verb: String) async -> String? {
        do {
            let r = try await Shell.run([script, verb], executable: "/bin/bash", timeout: 60)
            return r.status == 0 ? nil : r.stderr + r.stdout
        } catch {
            return "cannot run \(script): \(error)"
        }
    }

    private static let lease = ReadWriteLease()
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
