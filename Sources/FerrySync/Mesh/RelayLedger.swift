import FerryCore

/// Remembers which peer each recently stored revision came from, and which revisions this
/// node chose not to relay to which peer, so that those can be offered again when the
/// reason for skipping them (the peer's link to the sender) goes away.
///
/// Bounded in memory whatever the database size: the newest `receivedCapacity` senders,
/// and per target at most `skipCapacity` skips younger than `rememberSkipsFor`. A revision
/// whose sender was forgotten is relayed as usual; a target whose skip memory is full is
/// not skipped for until room frees up, so a bound never loses a revision.
public final class RelayLedger: Sendable {
    /// How much the ledger keeps.
    public struct Limits: Sendable {
        /// Stored revisions whose sender is remembered. Default 100 000.
        public var receivedCapacity = 100_000
        /// Skipped revisions remembered per target peer. Default 100 000.
        public var skipCapacity = 100_000
        /// How long a skip is remembered: by then the link it relied on has delivered. Default 5 min.
        public var rememberSkipsFor: Duration = .seconds(300)
        public init() {}
    }

    /// One revision of one document.
    struct RevisionKey: Hashable, Sendable {
        let id: DocumentID
        let rev: RevisionID
    }

    /// A revision not relayed to a target because the target has a link to `sender`.
    struct Skip {
        let at: Duration
        let key: RevisionKey
        let sender: String
    }

    /// One target's skips (oldest first, from `head`) and the documents to offer it again.
    struct TargetSkips {
        var entries: [Skip] = []
        var head = 0
        var reoffer = Set<DocumentID>()
        var live: Int { entries.count - head }
    }

    /// Senders in arrival order (a ring) and skips per target, behind one lock.
    struct State {
        var senders: [RevisionKey: String] = [:]
        var ring: [RevisionKey] = []
        var next = 0
        var targets: [String: TargetSkips] = [:]
    }

    public let limits: Limits
    private let state = Locked(State())
    private let elapsed: @Sendable () -> Duration
    /// Per target peer: announces documents to be offered to it again.
    private let signals = Locked<[String: Broadcaster<Void>]>([:])

    init(limits: Limits, clock: any Clock<Duration>) {
        self.limits = limits
        elapsed = Stopwatch.start(on: clock).elapsed
    }

    /// Records that `rev` of `id` was stored here as received from `sender`.
    func recordReceived(_ id: DocumentID, _ rev: RevisionID, from sender: String) {
        let key = RevisionKey(id: id, rev: rev)
        state.withLock { s in
            if s.ring.count < limits.receivedCapacity {
                s.ring.append(key)
            } else {
                let old = s.ring[s.next]
                s.senders.removeValue(forKey: old)
                s.ring[s.next] = key
                s.next = (s.next + 1) % limits.receivedCapacity
            }
            s.senders[key] = sender
        }
    }

    /// The peer `rev` of `id` was received from, while remembered.
    public func sender(of id: DocumentID, _ rev: RevisionID) -> String? {
        state.withLock { $0.senders[RevisionKey(id: id, rev: rev)] }
    }

    /// Whether `count` more skips toward `target` can be remembered (expired ones are dropped first).
    func hasRoom(for target: String, _ count: Int) -> Bool {
        let now = elapsed()
        return state.withLock { s in
            guard s.targets[target] != nil else { return count <= limits.skipCapacity }
            // Mutated in place: a copy taken out of the dictionary would copy every skip.
            expire(&s.targets[target, default: TargetSkips()], now: now)
            return (s.targets[target]?.live ?? 0) + count <= limits.skipCapacity
        }
    }

    /// Remembers revisions not relayed to `target`, each with the sender it relied on.
    func rememberSkips(to target: String, _ skips: [(DocumentID, RevisionID, String)]) {
        let now = elapsed()
        state.withLock { s in
            // Appended in place: a copy taken out of the dictionary would copy every skip.
            s.targets[target, default: TargetSkips()].entries.append(
                contentsOf: skips.map { Skip(at: now, key: RevisionKey(id: $0.0, rev: $0.1), sender: $0.2) })
        }
    }

    /// `target` no longer reports links to `senders`: what was skipped on their account is
    /// to be offered to it again.
    func sendersLost(by target: String, _ senders: Set<String>) {
        let now = elapsed()
        let any = state.withLock { s -> Bool in
            guard var t = s.targets.removeValue(forKey: target) else { return false }
            expire(&t, now: now)
            var kept: [Skip] = []
            var moved = false
            for skip in t.entries[t.head...] {
                if senders.contains(skip.sender) {
                    t.reoffer.insert(skip.key.id)
                    moved = true
                } else {
                    kept.append(skip)
                }
            }
            t.entries = kept
            t.head = 0
            s.targets[target] = t
            return moved || !t.reoffer.isEmpty
        }
        if any { signal(for: target).send(()) }
    }

    /// Takes the documents to offer `target` again (empty when none).
    func takeReoffers(for target: String) -> Set<DocumentID> {
        state.withLock { s in
            guard s.targets[target]?.reoffer.isEmpty == false else { return [] }
            let ids = s.targets[target]?.reoffer ?? []
            s.targets[target]?.reoffer = []
            return ids
        }
    }

    private func signal(for target: String) -> Broadcaster<Void> {
        signals.withLock { s in
            if let b = s[target] { return b }
            let b = Broadcaster<Void>()
            s[target] = b
            return b
        }
    }

    /// Yields each time documents become due to be offered to `target` again. Subscribe
    /// before checking `hasReoffers`, so that none is missed in between.
    func reofferSignal(for target: String) -> AsyncStream<Void> { signal(for: target).subscribe() }

    /// Whether documents are due to be offered to `target` again.
    func hasReoffers(for target: String) -> Bool { state.withLock { $0.targets[target]?.reoffer.isEmpty == false } }

    /// Skips toward `target` remembered now (each a revision not relayed to it).
    public func rememberedSkips(for target: String) -> Int { state.withLock { $0.targets[target]?.live ?? 0 } }

    private func expire(_ t: inout TargetSkips, now: Duration) {
        while t.head < t.entries.count && now - t.entries[t.head].at > limits.rememberSkipsFor { t.head += 1 }
        if t.head > 1024 && t.head * 2 > t.entries.count {
            t.entries.removeFirst(t.head)
            t.head = 0
        }
    }
}
