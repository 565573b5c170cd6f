import FerryCore

/// A node's picture of the mesh around it: which of its peers it is linked to now, and, for
/// each peer, the live links that peer last reported in a heartbeat.
///
/// A link counts only when both of its ends replicate every document both ways ("full"), or
/// every document the same version of the group's access rules grants, since relay
/// suppression relies on it to deliver. A report is relied on only by a node judging by the
/// same rules as the reporter. What a peer reported is forgotten when this node's last
/// connection to it ends: an unknown view means "do not rely on it".
public final class MeshView: Sendable {
    /// The view and the watchers of this node's own links, behind one lock.
    struct State {
        /// Peer → the links it reported last.
        var reported: [String: Set<String>] = [:]
        /// Peer → the version of the group's rules it judged by when it reported them (absent: none).
        var reportedRules: [String: String] = [:]
        /// Peer → full links to it up now (two while one connection replaces another).
        var fullLinks: [String: Int] = [:]
        /// Peer → connections to it with heartbeats (full or not).
        var connections: [String: Int] = [:]
        var watchers: [Int: @Sendable () -> Void] = [:]
        var nextToken = 0
        /// Momentary withdrawals, numbered (the newest `maxWithdrawals`).
        var withdrawals: [(number: Int, peer: String)] = []
        var withdrawalCount = 0
    }

    /// Withdrawals a connection that fell further behind sees as one of all links.
    static let maxWithdrawals = 64

    private let state = Locked(State())
    /// Told which peer's report dropped which links (the relay ledger re-offers what it skipped).
    let linksLost: @Sendable (_ peer: String, _ lost: Set<String>) -> Void

    init(linksLost: @escaping @Sendable (_ peer: String, _ lost: Set<String>) -> Void = { _, _ in }) {
        self.linksLost = linksLost
    }

    /// The peers this node has a live full link to.
    public var localLinks: Set<String> { state.withLock { Set($0.fullLinks.keys) } }

    /// The links `peer` reported last; nil when it reported none since this node's link to it came up.
    public func links(of peer: String) -> Set<String>? { state.withLock { $0.reported[peer] } }

    /// The links `peer` reported last, if it judged by the same group rules (`rules`, nil for
    /// none) as the caller: only then does it read what the caller would send it.
    func links(of peer: String, judgedBy rules: String?) -> Set<String>? {
        state.withLock { s in s.reportedRules[peer] == rules ? s.reported[peer] : nil }
    }

    /// Records `peer`'s report; links it no longer lists (or all it listed, when it now judges
    /// by other rules) are passed to `linksLost`.
    func peerReported(_ peer: String, links: Set<String>, rules: String? = nil) {
        let lost = state.withLock { s -> Set<String> in
            let before = s.reported[peer] ?? []
            let rulesChanged = s.reportedRules[peer] != rules
            s.reported[peer] = links
            s.reportedRules[peer] = rules
            return rulesChanged ? before : before.subtracting(links)
        }
        if !lost.isEmpty { linksLost(peer, lost) }
    }

    func connectionOpened(_ peer: String) { state.withLock { $0.connections[peer, default: 0] += 1 } }

    /// The last connection to `peer` ended: what it reported no longer holds.
    func connectionClosed(_ peer: String) {
        let lost = state.withLock { s -> Set<String>? in
            let n = (s.connections[peer] ?? 1) - 1
            guard n <= 0 else {
                s.connections[peer] = n
                return nil
            }
            s.connections[peer] = nil
            s.reportedRules[peer] = nil
            return s.reported.removeValue(forKey: peer)
        }
        if let lost, !lost.isEmpty { linksLost(peer, lost) }
    }

    /// A full link to `peer` came up; every connection's next heartbeat says so at once.
    func linkUp(_ peer: String) {
        let changed = state.withLock { s -> Bool in
            s.fullLinks[peer, default: 0] += 1
            return s.fullLinks[peer] == 1
        }
        if changed { notifyWatchers() }
    }

    func linkDown(_ peer: String) {
        let changed = state.withLock { s -> Bool in
            let n = (s.fullLinks[peer] ?? 1) - 1
            s.fullLinks[peer] = n > 0 ? n : nil
            return n <= 0
        }
        if changed { notifyWatchers() }
    }

    /// This node refused a revision `peer` sent, for its write policy: whoever skipped relaying
    /// to this node because `peer` would deliver it may hold a copy this node never takes
    /// from `peer`. Every connection's next heartbeat leaves `peer` out of this node's links,
    /// and the one after it puts it back: each peer that relied on the link offers again
    /// what it skipped on its account (`RelayLedger.sendersLost`), so it learns the verdict
    /// for itself, or delivers what this node now takes.
    func withdrawMomentarily(_ peer: String) {
        let known = state.withLock { s -> Bool in
            guard s.fullLinks[peer] != nil else { return false }
            s.withdrawalCount += 1
            s.withdrawals.append((s.withdrawalCount, peer))
            if s.withdrawals.count > Self.maxWithdrawals { s.withdrawals.removeFirst(s.withdrawals.count - Self.maxWithdrawals) }
            return true
        }
        if known { notifyWatchers() }
    }

    /// The peers withdrawn after withdrawal number `seen` (all linked peers when more than
    /// were kept), and the newest number.
    func withdrawals(after seen: Int) -> (peers: Set<String>, newest: Int) {
        state.withLock { s in
            guard s.withdrawalCount > seen else { return ([], seen) }
            if let oldest = s.withdrawals.first?.number, oldest > seen + 1 { return (Set(s.fullLinks.keys), s.withdrawalCount) }
            return (Set(s.withdrawals.filter { $0.number > seen }.map(\.peer)), s.withdrawalCount)
        }
    }

    /// Calls `changed` whenever this node's own links change, until `unwatch`.
    func watchLocalLinks(_ changed: @escaping @Sendable () -> Void) -> Int {
        state.withLock { s in
            s.nextToken += 1
            s.watchers[s.nextToken] = changed
            return s.nextToken
        }
    }

    func unwatch(_ token: Int) { _ = state.withLock { $0.watchers.removeValue(forKey: token) } }

    private func notifyWatchers() {
        let watchers = state.withLock { Array($0.watchers.values) }
        for w in watchers { w() }
    }
}
