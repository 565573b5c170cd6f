import FerryCore
import FerryStore

/// The responder's part in heartbeats and relay suppression: it arms the watchdog after
/// hello, records who sent each stored revision, and leaves out of its changes feed what
/// the peer gets from its own link to the sender.
extension ResponderSession {
    /// The node's mesh relay, for a peer whose node ID the transport proved: a claimed ID
    /// could speak for another node, make this one skip it, or be taken for its sender.
    var mesh: MeshRelay? { authenticatedPeer == nil ? nil : options.mesh }

    /// Arms heartbeats when both hellos offer them; they start once hello's reply is sent.
    func armLiveness(peerOffers features: [String]) {
        let settings = options.liveness
        guard settings.enabled, features.contains(SyncProtocol.heartbeatFeature), let peer = peerID,
            let connection = connection.withLock({ $0 })
        else { return }
        let policy = self.policy
        // This side's half of a full link takes and serves every document of this peer; of a
        // link under the group's rules, every document they grant it.
        let both = options.allowPush && options.allowPull && !options.readOnly
        var logger = responder.logger
        logger[metadataKey: "peer"] = "\(LogText.escape(peer))"
        connection.armLiveness(
            LivenessPlan(
                settings: settings, clock: responder.clock, logger: logger, peerID: peer, mesh: mesh, localFull: both && policy.admitsEverything,
                rules: policy.groupRules?.version, localGrant: both && policy.followsGroupRules != nil, digests: options.digests,
                view: LivenessPlan.view(localGrant: both && policy.followsGroupRules != nil, peerRead: policy.read, ownRead: options.ownRead())))
    }

    /// Remembers that the peer sent these revisions, before they are inserted: a relay
    /// reading the commit must already find who sent them. Only revisions this store lacked
    /// are recorded, so that the sender is always one that held the revision before this
    /// node did (the induction relay suppression rests on).
    func recordRelayed(_ revs: [IncomingRevision], absentFrom trees: [DocumentID: RevisionTree]) {
        guard let mesh, let peer = peerID else { return }
        for rev in revs where trees[rev.id]?.revision(rev.revision) == nil {
            mesh.ledger.recordReceived(rev.id, rev.revision, from: peer)
        }
    }

    /// Whether a change need not be offered to this session's peer (`MeshRelay.relaySkip`),
    /// judged by `rules` (the version of the group's rules in the peer's policy): nil when it
    /// is to be offered, else the leaves the skip relies on.
    func relaySkip(_ id: DocumentID, leaves: [RevisionID], rules: String?) -> [RevisionID]? {
        guard let mesh, let peer = peerID else { return nil }
        return mesh.relaySkip(of: id, leaves: leaves, to: peer, peerHeld: peerHeld, rules: rules)
    }

    /// The documents to offer this peer again, as changes entries after `sequence` (their
    /// order in the feed does not matter to the peer: it asks for what it lacks).
    func reofferedEntries(at sequence: UInt64, docIDs: Set<String>?) throws -> [ChangeEntry] {
        guard let mesh, let peer = peerID else { return [] }
        let ids = mesh.ledger.takeReoffers(for: peer).filter { docIDs?.contains($0.rawValue) ?? true }
        guard !ids.isEmpty else { return [] }
        let trees = try store.revisionTrees(Array(ids))
        let access = DocumentAccess(policy)
        var entries: [ChangeEntry] = []
        for id in ids.sorted() {
            guard let tree = trees[id], let winner = tree.winner, access.mayRead(id, tree: tree) else { continue }
            entries.append(
                ChangeEntry(
                    sequence: sequence, id: id.rawValue, leaves: tree.leaves.map(\.id.description), deleted: winner.deleted,
                    size: Int64(winner.body?.count ?? 0)))
        }
        return entries
    }
}
