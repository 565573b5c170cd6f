import FerryCore

/// Remembers, for one connection, the revision each document last received from or sent
/// by the peer, so that a revision is not offered back to the peer that already holds it.
///
/// In a mesh every node that receives a revision would otherwise announce it straight
/// back to where it came from: a changes entry or a push per link, per write, for nothing.
final class PeerHeldRevisions: Sendable {
    private let held = Locked<[DocumentID: RevisionID]>([:])

    func record(_ id: DocumentID, _ revision: RevisionID) {
        held.withLock {
            if $0.count >= ReplicatorTuning.peerHeldRevisions { $0.removeAll(keepingCapacity: true) }
            $0[id] = revision
        }
    }

    /// True when the document's only leaf is a revision the peer is known to hold.
    func peerHolds(_ id: DocumentID, leaves: [RevisionID]) -> Bool {
        leaves.count == 1 && held.withLock { $0[id] } == leaves[0]
    }

    /// True when `revision` is the one the peer is known to hold for the document.
    func peerHolds(_ id: DocumentID, revision: RevisionID) -> Bool { held.withLock { $0[id] } == revision }

    func reset() { held.withLock { $0.removeAll() } }
}
