import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import ServiceLifecycle

/// One replicator kept running: restarted after it stops on a permanent error (the peer
/// may be reconfigured), until `stop()`. The replicator itself retries transient failures,
/// and refusals by a peer that does not trust this node yet, with its own backoff.
final class ReplicationLink: Sendable {
    /// A replicator, and what to do once it has stopped for good (close its HTTP client).
    struct Run: Sendable {
        var replicator: Replicator
        var finished: (@Sendable () async -> Void)?
    }

    /// The URL as shown (never with a password).
    let url: String
    /// The peer's node ID; empty for a CouchDB replication.
    let peerID: String
    /// The peer's policy in the trust store when the link was made (nil: not in it).
    let policy: PeerPolicy?
    /// What this node's own roles let it hold when the link was made (the group's rules): a
    /// change starts the link again, with checkpoints that re-examine what it may now read.
    let ownAccess: String
    private let current: Locked<Run>
    /// Makes the replicator anew for each restart (a CouchDB replication re-reads its
    /// credentials file or variable, which may have been fixed); nil: the same one runs again.
    private let rebuild: (@Sendable () -> Run)?
    let clock: any Clock<Duration>
    let logger: Logger
    private let task = Locked<Task<Void, Never>?>(nil)
    private let stopped = Locked(false)
    /// Ends a restart wait early; set when `redial()` comes while none is under way.
    private let wake = Locked<(pending: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

    /// Wait after a replicator stops on a permanent error before starting it again.
    static let restartWait: Duration = .seconds(30)

    init(
        url: String, peerID: String, policy: PeerPolicy?, ownAccess: String = "", replicator: Replicator, clock: any Clock<Duration>,
        logger: Logger
    ) {
        self.url = url
        self.peerID = peerID
        self.policy = policy
        self.ownAccess = ownAccess
        current = Locked(Run(replicator: replicator))
        rebuild = nil
        self.clock = clock
        self.logger = logger
    }

    /// A link whose replicator `make` builds, at the start and again for each restart.
    init(url: String, peerID: String, policy: PeerPolicy?, make: @escaping @Sendable () -> Run, clock: any Clock<Duration>, logger: Logger) {
        self.url = url
        self.peerID = peerID
        self.policy = policy
        ownAccess = ""
        current = Locked(make())
        rebuild = make
        self.clock = clock
        self.logger = logger
    }

    /// The replicator running now (or last).
    var replicator: Replicator { current.withLock { $0.replicator } }

    func start() {
        let t = Task { [self] in
            while !stopped.withLock({ $0 }) {
                await replicator.run()
                if stopped.withLock({ $0 }) { break }
                // Without an error, the replicator finished (one-shot) or was stopped by the
                // node's graceful shutdown: nothing to restart.
                guard let error = replicator.status.error else { break }
                // A CouchDB replication's logger names it already (replication, url).
                var metadata: Logger.Metadata = ["error": "\(LogText.escape(describing: error))", "retryIn": "\(Self.restartWait)"]
                if !peerID.isEmpty { metadata["peer"] = "\(LogText.escape(peerID))" }
                logger.warning("replication stopped on a permanent error; starting it again later", metadata: metadata)
                await restartWait()
                if let rebuild, !stopped.withLock({ $0 }) {
                    let old = current.withLock { c -> Run in
                        defer { c = rebuild() }
                        return c
                    }
                    await old.finished?()
                }
            }
            await current.withLock { $0.finished }?()
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
