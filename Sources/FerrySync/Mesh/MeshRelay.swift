import FerryCore

/// The node-wide pair that makes a write cost O(K) in a mesh: the `MeshView` (who is linked
/// to whom, from heartbeats) and the `RelayLedger` (who sent each revision here). One per
/// node, shared by every replicator and the responder.
///
/// A revision received from S is not relayed to a peer P that reports a live full link to
/// S: S delivers it to P (or, by the same rule, skips P only because P is linked to the one
/// S got it from, and so on back to the author, who always delivers). Under the group's
/// access rules, a link both of whose halves follow the same version of them counts too, for
/// a node that judges P by that version: S then sends P what this node would.
public final class MeshRelay: Sendable {
    public let view: MeshView
    public let ledger: RelayLedger

    public init(clock: any Clock<Duration> = ContinuousClock(), limits: RelayLedger.Limits = .init()) {
        let ledger = RelayLedger(limits: limits, clock: clock)
        self.ledger = ledger
        view = MeshView(linksLost: { peer, lost in ledger.sendersLost(by: peer, lost) })
    }

    func peerReported(_ peer: String, links: Set<String>, rules: String? = nil) { view.peerReported(peer, links: links, rules: rules) }

    /// Whether a change of `id` with these leaves need not be offered to `target`: each leaf
    /// is held by the target, came from it, or came from a peer the target reports a live
    /// link to. Records the skips it relies on, for a re-offer if that link goes.
    func skipsRelay(of id: DocumentID, leaves: [RevisionID], to target: String, peerHeld: PeerHeldRevisions, rules: String? = nil) -> Bool {
        relaySkip(of: id, leaves: leaves, to: target, peerHeld: peerHeld, rules: rules) != nil
    }

    /// As `skipsRelay`; nil when the change is to be offered, else the leaves the skip relies
    /// on another link for (empty when the target holds or sent them all). Those are what the
    /// target must hold before its coverage of this node's feed may pass the change. `rules`:
    /// the version of the group's access rules this node judges the target by (nil: none).
    func relaySkip(of id: DocumentID, leaves: [RevisionID], to target: String, peerHeld: PeerHeldRevisions, rules: String? = nil)
        -> [RevisionID]?
    {
        guard let targetLinks = view.links(of: target, judgedBy: rules) else { return nil }
        var relied: [(DocumentID, RevisionID, String)] = []
        for leaf in leaves {
            if peerHeld.peerHolds(id, revision: leaf) { continue }
            guard let sender = ledger.sender(of: id, leaf) else { return nil }
            if sender == target { continue }
            guard targetLinks.contains(sender) else { return nil }
            relied.append((id, leaf, sender))
        }
        if relied.isEmpty { return [] }
        guard ledger.hasRoom(for: target, relied.count) else { return nil }
        ledger.rememberSkips(to: target, relied)
        // A report that dropped a sender between the check and the record scanned the skips
        // before this one was there: look again, and offer it again if so.
        let now = view.links(of: target, judgedBy: rules) ?? []
        let gone = Set(relied.map(\.2)).subtracting(now)
        if !gone.isEmpty { ledger.sendersLost(by: target, gone) }
        return relied.map(\.1)
    }
}
