import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// One replicator kept running: restarted after it stops on a permanent error (the peer
/// may be reconfigured), until `stop()`. The replicator itself retries transient failures,
/// and refusals by a peer that does not trust this node yet, with its own backoff.
final class ReplicationLink: Sendable {
    let url: String
    let peerID: String
    /// The peer's policy in the trust store when the link was made (nil: not in it).
    let policy: PeerPolicy?
    let replicator: Replicator
    let clock: any Clock<Duration>
    let logger: Logger
    private let task = Mutex<Task<Void, Never>?>(nil)
    private let stopped = Mutex(false)
    /// Ends a restart wait early; set when `redial()` comes while none is under way.
    private let wake = Mutex<(pending: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

    /// Wait after a replicator stops on a permanent error before starting it again.
    static let restartWait: Duration = .seconds(30)

    init(url: String, peerID: String, policy: PeerPolicy?, replicator: Replicator, clock: any Clock<Duration>, logger: Logger) {
        self.url = url
        self.peerID = peerID
        self.policy = policy
        self.replicator = replicator
        self.clock = clock
        self.logger = logger
    }

    func start() {
        let t = Task { [self] in
            while !stopped.withLock({ $0 }) {
                await replicator.run()
                if stopped.withLock({ $0 }) { break }
                // Without an error, the replicator finished (one-shot) or was stopped by the
                // node's graceful shutdown: nothing to restart.
                guard let error = replicator.status.error else { break }
                logger.warning(
                    "replication stopped on a permanent error; starting it again later",
                    metadata: [
                        "peer": "\(LogText.escape(peerID))", "error": "\(LogText.escape(describing: error))",
                        "retryIn": "\(Self.restartWait)",
                    ])
                await restartWait()
            }
        }
        task.withLock { $0 = t }
    }

    /// Sleeps `restartWait`, or less if `redial()` or `stop()` comes first.
    private func restartWait() async {
        let clock = self.clock
        _ = try? await Race.first({ try await clock.sleep(for: Self.restartWait) }, { await self.woken() })
        wake.withLock { $0.pending = false }
    }

    /// Returns once `redial()` is called (or was, since the last wait), or on cancellation.
    private func woken() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { c in
                let now = wake.withLock { w -> Bool in
                    if w.pending || Task.isCancelled {
                        w.pending = false
                        return true
                    }
                    w.waiter = c
                    return false
                }
                if now { c.resume() }
            }
        } onCancel: {
            wake.withLock { w -> CheckedContinuation<Void, Never>? in
                defer { w.waiter = nil }
                return w.waiter
            }?.resume()
        }
    }

    /// Dials at once: ends a restart wait, or the replicator's own retry wait, and resets its backoff.
    func redial() {
        let waiter = wake.withLock { w -> CheckedContinuation<Void, Never>? in
            defer { w.waiter = nil }
            if w.waiter == nil { w.pending = true }
            return w.waiter
        }
        waiter?.resume()
        replicator.retryNow()
    }

    func stop() {
        stopped.withLock { $0 = true }
        replicator.stop()
        task.withLock { $0 }?.cancel()
    }

    func wait() async { await task.withLock { $0 }?.value }
}

extension Logger {
    func with(_ key: String, _ value: String) -> Logger {
        var copy = self
        copy[metadataKey: key] = "\(value)"
        return copy
    }
}
