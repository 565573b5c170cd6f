import Dispatch
import FerryCore
import FerryStore

/// A node's content digest kept fresh off the hot path, and the digest each peer last
/// reported in a heartbeat: what anti-entropy compares, and what status shows per peer.
///
/// The digest is `DocumentStore.contentDigest()` (O(documents)), so it is computed on a
/// thread of its own, one computation at a time, no more often than `minInterval`, and only
/// once the store has been quiet (no commit) for `minInterval` when asked: a node under a
/// stream of writes computes nothing, and its digest is unknown until the writes pause.
public final class MeshDigests: Sendable {
    /// The cached digest and the peers' reports, behind one lock.
    struct State {
        var digest: String?
        /// The store's last change sequence the cached digest was computed at.
        var sequence: UInt64?
        var computing = false
        var lastStarted: Duration?
        /// The last change sequence seen, and when it was first seen: how long the store has been quiet.
        var observed: UInt64?
        var observedAt: Duration = .zero
        var peers: [String: String] = [:]
    }

    let store: DocumentStore
    let minInterval: Duration
    private let elapsed: @Sendable () -> Duration
    private let state = Locked(State())

    public init(store: DocumentStore, clock: any Clock<Duration> = ContinuousClock(), minInterval: Duration = .seconds(1)) {
        self.store = store
        self.minInterval = minInterval
        elapsed = Stopwatch.start(on: clock).elapsed
    }

    /// This store's digest if it describes the store as it is now; otherwise nil, and a
    /// computation starts when none runs and `minInterval` has passed since the last.
    public func current() -> String? {
        // From memory, never a read: heartbeats ask, and must not wait on the store.
        let now = store.lastAnnouncedSequence
        let start = state.withLock { s -> Bool in
            if s.sequence == now, s.digest != nil { return false }
            if s.computing { return false }
            let t = elapsed()
            if s.observed != now {
                s.observed = now
                s.observedAt = t
                return false
            }
            if t - s.observedAt < minInterval { return false }
            if let last = s.lastStarted, t - last < minInterval { return false }
            s.computing = true
            s.lastStarted = elapsed()
            return true
        }
        if start { compute() }
        return state.withLock { $0.sequence == now ? $0.digest : nil }
    }

    /// Computes the digest now, on the caller's thread (tests, and the first status read).
    public func refresh() {
        let before = store.lastAnnouncedSequence
        let digest = try? store.contentDigest()
        let after = store.lastAnnouncedSequence
        state.withLock { s in
            s.computing = false
            // A commit during the scan leaves a digest of no single state: keep none.
            if let digest, before == after {
                s.digest = digest
                s.sequence = before
            }
        }
    }

    private func compute() {
        // A thread outside Swift's cooperative pool: the scan reads every document row.
        DispatchQueue.global(qos: .utility).async { self.refresh() }
    }

    /// Records the digest `peer` reported (nil: it said its last one no longer holds).
    func peerReported(_ peer: String, digest: String?) { state.withLock { $0.peers[peer] = digest } }

    /// The digest `peer` last reported; nil when none.
    public func digest(of peer: String) -> String? { state.withLock { $0.peers[peer] } }

    /// Whether `peer`'s last reported digest equals this store's now; nil when either is unknown.
    public func matches(_ peer: String) -> Bool? {
        guard let theirs = digest(of: peer), let mine = current() else { return nil }
        return theirs == mine
    }
}
