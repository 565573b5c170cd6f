import Dispatch
import FerryCore
import FerryStore

/// A node's content digests kept fresh off the hot path (the whole store's, and one per
/// reader view that a link under the group's rules asks for), and the digest each peer last
/// reported in a heartbeat: what anti-entropy compares, and what status shows per peer.
///
/// A digest is `DocumentStore.contentDigests(views:)` (O(documents); a view judged by bodies
/// decodes every revision tree), so it is computed on a thread of its own, one computation
/// (every wanted digest in one scan) at a time, no more often than `minInterval`, and only
/// once the store has been quiet (no commit, no purge) for `minInterval` when asked: a node under a
/// stream of writes computes nothing, and its digests are unknown until the writes pause.
public final class MeshDigests: Sendable {
    /// A digest and the store's content version it was computed at.
    struct Computed {
        var digest: String?
        var version: ContentVersion?
        func current(at now: ContentVersion) -> String? { version == now ? digest : nil }
    }

    /// A reader view some link compares, and when a link last asked for it.
    struct WantedView {
        var rule: AccessRule
        var computed = Computed()
        var lastAsked: Duration
    }

    /// What a peer last reported: its whole store's digest (view nil) or its digest over a
    /// view (the rule this node judges that link by); digest nil: the last one no longer holds.
    struct Report {
        var digest: String?
        var view: AccessRule?
    }

    /// The cached digests and the peers' reports, behind one lock.
    struct State {
        var full = Computed()
        var views: [String: WantedView] = [:]
        var computing = false
        var lastStarted: Duration?
        /// The last content version seen, and when it was first seen: how long the store has been quiet.
        var observed: ContentVersion?
        var observedAt: Duration = .zero
        var peers: [String: Report] = [:]
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
    public func current() -> String? { current(view: nil) }

    /// This store's digest over the documents `view` admits (`DocumentAccess` reading: every
    /// live leaf admitted), or over every document when `view` is nil or admits everything;
    /// nil while unknown, as `current()`.
    public func current(view: AccessRule?) -> String? {
        // From memory, never a read: heartbeats ask, and must not wait on the store.
        let now = store.contentVersion
        let key = view.flatMap { $0.admitsEverything ? nil : $0.fingerprint }
        let (start, known) = state.withLock { s -> (Bool, String?) in
            let t = elapsed()
            var known = s.full.current(at: now)
            if let key, let view {
                var wanted = s.views[key] ?? WantedView(rule: view, lastAsked: t)
                wanted.lastAsked = t
                s.views[key] = wanted
                known = wanted.computed.current(at: now)
            }
            if known != nil || s.computing { return (false, known) }
            if s.observed != now {
                s.observed = now
                s.observedAt = t
                return (false, nil)
            }
            if t - s.observedAt < minInterval { return (false, nil) }
            if let last = s.lastStarted, t - last < minInterval { return (false, nil) }
            s.computing = true
            s.lastStarted = t
            return (true, nil)
        }
        if start { compute() }
        return known
    }

    /// Computes every wanted digest now, on the caller's thread (tests, and the first status read).
    public func refresh() {
        let before = store.contentVersion
        let wanted = state.withLock { s -> [(String, AccessRule)] in
            let t = elapsed()
            s.views = s.views.filter { t - $0.value.lastAsked < ReplicatorTuning.digestViewKeptFor }
            return s.views.map { ($0.key, $0.value.rule) }
        }
        let views = wanted.map { _, rule in
            ContentView { id, tree in
                // By ID alone when the rule allows; a tree that cannot be read is not admitted.
                guard rule.needsBodies else { return rule.admits(id: id, body: nil) }
                guard let t = try? tree() else { return false }
                return DocumentAccess.admitsDocument(rule, id, tree: t)
            }
        }
        let digests = try? store.contentDigests(views: views)
        let after = store.contentVersion
        state.withLock { s in
            s.computing = false
            // A commit during the scan leaves a digest of no single state: keep none.
            guard let digests, before == after else { return }
            s.full = Computed(digest: digests.full, version: before)
            for ((key, _), digest) in zip(wanted, digests.views) { s.views[key]?.computed = Computed(digest: digest, version: before) }
        }
    }

    private func compute() {
        // A thread outside Swift's cooperative pool: the scan reads every document row.
        DispatchQueue.global(qos: .utility).async { self.refresh() }
    }

    /// Records the digest `peer` reported (nil: it said its last one no longer holds): over
    /// its whole store (`view` nil), or over what `view` admits.
    func peerReported(_ peer: String, digest: String?, view: AccessRule? = nil) {
        state.withLock { $0.peers[peer] = Report(digest: digest, view: view) }
    }

    /// The whole-store digest `peer` last reported; nil when none, or when its last report was over a view.
    public func digest(of peer: String) -> String? { state.withLock { s in s.peers[peer].flatMap { $0.view == nil ? $0.digest : nil } } }

    /// The digest `peer` last reported over `view`; nil when none, or when its last report was over another.
    func digest(of peer: String, view: AccessRule) -> String? {
        state.withLock { s in s.peers[peer].flatMap { $0.view?.fingerprint == view.fingerprint ? $0.digest : nil } }
    }

    /// Whether `peer`'s last reported digest equals this store's now, over the same documents
    /// (the whole store, or the view of the link it came over); nil when either is unknown.
    public func matches(_ peer: String) -> Bool? {
        guard let report = state.withLock({ $0.peers[peer] }), let theirs = report.digest, let mine = current(view: report.view) else { return nil }
        return theirs == mine
    }
}
