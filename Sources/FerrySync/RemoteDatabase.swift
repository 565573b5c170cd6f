import FerryCore
import FerryStore

/// What a replicator needs from the other side of a replication, in the verbs every
/// replication protocol has (CouchDB's `_changes`, `_revs_diff`, `_bulk_get`, `_bulk_docs`
/// with `new_edits=false`, `_local`, attachments); the pull and push workers know nothing else.
///
/// `FerryRemote` implements it over Ferry's message protocol. A remote speaking another
/// protocol implements the same verbs: sequences are opaque to the workers, revision and
/// document IDs are carried unchanged, and blobs are addressed by digest. Blobs are only
/// asked for right after `fetchRevisions` returned the revisions that refer to them, and
/// only sent right before `storeRevisions`, so a remote that keeps attachments inside
/// documents (CouchDB) can serve them from, or attach them to, those revisions.
package protocol RemoteDatabase: Sendable {
    /// Who the other side is and what it allows, known once the remote is open.
    var identity: RemoteIdentity { get }

    /// The other side's changes after `since`, one page; a live request waits up to its
    /// timeout for a change before answering, possibly with nothing (a heartbeat).
    func changes(_ request: RemoteChangesRequest) async throws -> RemoteChanges

    /// Of each document's given revisions, those the other side lacks, with the ancestors
    /// it holds with bodies (delta bases). Documents lacking nothing are left out.
    func revsDiff(_ docs: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions]

    /// The requested revisions in request order, each with its history (at most
    /// `maxHistory` ancestors) and its body, or a delta against one of the ancestors named
    /// when `deltas`; a revision the other side no longer has (or may not send) is `missing`.
    func fetchRevisions(_ requests: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision]

    /// Stores revisions with their history as they are (no new edits); one result each, in order.
    func storeRevisions(_ revisions: [WireRevision]) async throws -> [PutResult]

    /// Of these blobs, those the other side lacks.
    func missingBlobs(_ digests: [BlobDigest]) async throws -> [BlobDigest]
    /// A blob's content (unchecked: the caller checks it against the digest).
    func blob(_ digest: BlobDigest) async throws -> [UInt8]
    func putBlob(_ digest: BlobDigest, content: [UInt8]) async throws

    /// Whether blobs move in chunks that resume where they stopped (`blobChunk`,
    /// `putBlobChunk`, `missingBlobOffsets`) rather than whole. (Default: false.)
    var chunkedBlobs: Bool { get }
    /// Of these blobs, those the other side wants now, each with how many leading bytes of
    /// it the other side already holds; it may leave large ones to fetch on first read.
    /// (Default: `missingBlobs`, holding none.)
    func missingBlobOffsets(_ blobs: [BlobReference]) async throws -> [BlobDigest: Int64]
    /// Up to `count` bytes of a blob from `offset`, with the blob's whole length.
    func blobChunk(_ digest: BlobDigest, offset: Int64, count: Int) async throws -> BlobChunk
    /// Sends `bytes` of a blob `total` bytes long, starting at `offset`; returns how many
    /// leading bytes the other side now holds (`total` once it stored the verified blob).
    func putBlobChunk(_ digest: BlobDigest, offset: Int64, total: Int64, bytes: [UInt8]) async throws -> Int64

    /// A local (never replicated) document of the other side: where checkpoints live.
    func localDocument(_ id: String) async throws -> JSON?
    func putLocalDocument(_ id: String, value: JSON) async throws

    /// A checkpoint's copy on the other side, read saying which way the replication moves
    /// documents; for a push, also how far the other side already holds this side's feed.
    /// (Default: `localDocument`, no floor.)
    func checkpoint(_ id: String, direction: CheckpointDirection) async throws -> RemoteCheckpoint
    /// Writes a checkpoint's copy on the other side; `caughtUp` (push) says this side's feed
    /// ended at the checkpoint when it was written. (Default: `putLocalDocument`.)
    func putCheckpoint(_ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool) async throws
    /// As above, with the revisions a push left out as relays since its last checkpoint write.
    /// (Default: the report is dropped; such a remote states no coverage to keep honest.)
    func putCheckpoint(
        _ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool, skipped: [SkippedRelay], skipsLost: Bool
    ) async throws

    /// Ends the remote's use of its connections once the workers are done; `error` says why
    /// when they failed. (Default: nothing to close.)
    func close(error: SyncError?) async

    /// The bytes this remote's own transport moved, for a remote that is not reached through
    /// a `Connection` (whose traffic is counted there). (Default: nil.)
    var traffic: Locked<Connection.Counters>? { get }

    /// Told once the replicator has opened it: where a remote that moves blobs itself (a
    /// CouchDB server's attachments) counts their bytes, for progress. (Default: ignored.)
    func countBlobs(with counter: @escaping BlobCounter)
}

/// Adds to a replication's totals (blob bytes and counts as they move).
package typealias BlobCounter = @Sendable (_ change: (inout ReplicationSummary) -> Void) -> Void

extension RemoteDatabase {
    public var traffic: Locked<Connection.Counters>? { nil }

    package func countBlobs(with counter: @escaping BlobCounter) {}

    package func close(error: SyncError?) async {}

    package func putCheckpoint(
        _ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool, skipped: [SkippedRelay], skipsLost: Bool
    ) async throws {
        try await putCheckpoint(id, value: value, direction: direction, caughtUp: caughtUp)
    }
}

/// The other side's identity and capabilities.
/// A range of a blob's content, with the blob's whole length.
package struct BlobChunk: Sendable {
    package var bytes: [UInt8]
    package var total: Int64
    package init(bytes: [UInt8], total: Int64) {
        self.bytes = bytes
        self.total = total
    }
}

extension RemoteDatabase {
    package var chunkedBlobs: Bool { false }

    package func missingBlobOffsets(_ blobs: [BlobReference]) async throws -> [BlobDigest: Int64] {
        Dictionary(uniqueKeysWithValues: try await missingBlobs(blobs.map(\.digest)).map { ($0, 0) })
    }

    package func blobChunk(_ digest: BlobDigest, offset: Int64, count: Int) async throws -> BlobChunk {
        let whole = try await blob(digest)
        let start = Int(min(Int64(whole.count), offset))
        return BlobChunk(bytes: Array(whole[start..<min(whole.count, start + count)]), total: Int64(whole.count))
    }

    package func putBlobChunk(_ digest: BlobDigest, offset: Int64, total: Int64, bytes: [UInt8]) async throws -> Int64 {
        throw SyncError.protocolViolation("this remote takes blobs whole, not in chunks")
    }
}

package struct RemoteIdentity: Sendable, Equatable {
    /// The other database's UUID: part of every checkpoint key.
    package var databaseID: String
    /// The other node's ID, as it states it.
    package var peerID: String
    package var allowsPull: Bool
    package var allowsPush: Bool
    /// Whether small fresh revisions may travel inline (in live changes, and pushed without revsDiff).
    package var inline: Bool
    /// Whether both sides offered heartbeats in hello.
    package var heartbeat = false
    /// Whether the other side lists the relays it leaves out of changes replies (`skipReports`).
    package var reportsSkips = false
    /// The other side's coverage as its hello stated it; nil when it sent none.
    package var coverage: CoverageSnapshot? = nil
    /// Whether both sides offered `blobChunks` in hello.
    package var blobChunks = false
    /// Whether the other side takes removal notices (`accessRemoval`).
    package var acceptsRemovals = false
    /// How many documents the other side ever purged for access (nil: none, or it does not say).
    package var accessEpoch: Int64?
    /// What the other side's own roles let it hold, as it says (nil: everything, or it does not say).
    package var accessStamp: String?

    package init(
        databaseID: String, peerID: String, allowsPull: Bool, allowsPush: Bool, inline: Bool, heartbeat: Bool = false,
        coverage: CoverageSnapshot? = nil
    ) {
        self.databaseID = databaseID
        self.peerID = peerID
        self.allowsPull = allowsPull
        self.allowsPush = allowsPush
        self.inline = inline
        self.heartbeat = heartbeat
        self.coverage = coverage
    }
}

/// A position in the other side's changes feed. Opaque to the workers: they only keep it,
/// compare it for equality, and hand it back (a CouchDB `seq` is an opaque string).
package struct RemoteSequence: Sendable, Hashable, CustomStringConvertible {
    /// The value as the other side wrote it; also what a checkpoint stores.
    package let json: JSON

    package init(_ json: JSON) { self.json = json }
    package init(_ number: UInt64) { json = .int(Int64(number)) }

    /// The start of every feed.
    package static let start = RemoteSequence(UInt64(0))

    package var description: String { String(decoding: json.canonicalBytes, as: UTF8.self) }
}

/// One page request on the other side's changes feed.
package struct RemoteChangesRequest: Sendable {
    package var since: RemoteSequence
    package var limit: Int
    /// Wait up to `timeout` for a change when none is available.
    package var live = false
    package var timeout: Duration = .zero
    /// Only these documents (nil: all).
    package var documentIDs: Set<DocumentID>?
    /// Ask for inline revisions of at most this many bytes (nil: none).
    package var inlineLimit: Int?
    /// Inline revisions must not be deltas.
    package var noDeltas = false
    /// Only documents whose winning revision matches this Mango selector, as the other side
    /// judges it (CouchDB's `filter=_selector`); nil: no such filter. A remote that cannot
    /// filter sends everything: the pull filter still judges each revision here.
    package var selector: JSON?
}

/// One document changed on the other side.
package struct RemoteChange: Sendable {
    package var id: DocumentID
    /// Every leaf of the document's revision tree.
    package var leaves: [RevisionID]
    /// The single leaf's revision, when it came inline.
    package var inline: WireRevision?

    package init(id: DocumentID, leaves: [RevisionID], inline: WireRevision? = nil) {
        self.id = id
        self.leaves = leaves
        self.inline = inline
    }
}

/// One page of the other side's changes feed.
package struct RemoteChanges: Sendable {
    package var changes: [RemoteChange]
    /// Where the next page starts; past documents left out, too.
    package var lastSequence: RemoteSequence
    /// The feed had nothing more when it was read.
    package var caughtUp: Bool
    /// Revisions of this page the other side left out as relays, and whether it left out
    /// more than it listed.
    package var skipped: [SkippedRelay] = []
    package var skipsLost = false
    /// How many changes follow this page, when the other side says (a progress total).
    package var pending: Int?
    /// Documents this side may no longer read, by the other side's word.
    package var removed: [RemovalNotice] = []

    package init(
        changes: [RemoteChange], lastSequence: RemoteSequence, caughtUp: Bool, skipped: [SkippedRelay] = [], skipsLost: Bool = false
    ) {
        self.changes = changes
        self.lastSequence = lastSequence
        self.caughtUp = caughtUp
        self.skipped = skipped
        self.skipsLost = skipsLost
    }
}
