import FerryCore
import FerryStore

/// The blobs one restricted peer may fetch or refer to in a session: those of revisions it
/// was sent (`served`) and those it sent itself (`proven`). A digest alone opens nothing: it
/// is a hash of content, which a restricted peer may know without being allowed to read it.
struct BlobGrants: Sendable {
    var served = Set<BlobDigest>()
    var proven = Set<BlobDigest>()

    func contains(_ digest: BlobDigest) -> Bool { served.contains(digest) || proven.contains(digest) }
}

/// Bounds on what one peer may keep in this node's checkpoint space.
public enum CheckpointQuota {
    /// Checkpoints per peer: one per direction, filter and document-ID set it replicates with,
    /// so a few in practice; far fewer than would fill a disk.
    public static let maxCheckpointsPerPeer = 256
    /// Canonical bytes of one checkpoint value: a sequence and a few fields in practice.
    public static let maxCheckpointBytes = 64 << 10
}

extension ResponderSession {
    /// Records the blobs a revision body refers to as fetchable by this (restricted) peer.
    func grantBlobs(of body: [UInt8]?) {
        guard let body, DocumentStore.mayReferenceBlobs(body), let json = try? JSON.parse(body),
            let refs = try? json.blobReferences(), !refs.isEmpty
        else { return }
        blobGrants.withLock { grants in for ref in refs { grants.served.insert(ref.digest) } }
    }

    /// Why a restricted peer may not store this revision for the blobs it refers to, or nil:
    /// it may refer only to blobs it was sent or has sent in this session, so it cannot read
    /// a blob it knows only by digest by writing a document that refers to it.
    func blobRefusal(_ rev: IncomingRevision) -> String? {
        guard !policy.read.admitsEverything, let refs = try? rev.body.blobReferences(), !refs.isEmpty else { return nil }
        let grants = blobGrants.withLock { $0 }
        guard let unproven = refs.first(where: { !grants.contains($0.digest) }) else { return nil }
        return "refers to blob \(unproven.digest), which this peer has neither sent nor been sent"
    }

    /// Refuses a checkpoint write past the peer's quota (a new key beyond the count, or an
    /// oversized value): checkpoints never expire, so without a bound a peer with no write
    /// access could still fill the disk through them.
    func checkCheckpointQuota(_ set: SetCheckpointRequest) throws(SyncError) {
        let bytes = set.value.canonicalBytes.count
        if bytes > CheckpointQuota.maxCheckpointBytes {
            throw SyncError.forbidden(
                "checkpoint of \(bytes) bytes exceeds the \(CheckpointQuota.maxCheckpointBytes)-byte limit")
        }
        let key = checkpointKey(set.id)
        do {
            if try store.localDocument(key) != nil { return }
            let held = try store.localDocuments(prefix: checkpointKey("")).count
            if held >= CheckpointQuota.maxCheckpointsPerPeer {
                throw SyncError.forbidden(
                    "this peer already has \(held) checkpoints here, the most one peer may keep")
            }
        } catch let e as SyncError {
            throw e
        } catch {
            throw SyncError.from(error)
        }
    }
}
