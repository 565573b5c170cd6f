import FerryCore
import FerryStore

/// A `RemoteDatabase` reached through Ferry's message protocol (docs/protocol.md) over one
/// `Connection`: each verb is one typed request and its typed reply.
struct FerryRemote: RemoteDatabase {
    let connection: Connection
    let identity: RemoteIdentity

    /// Says hello on `connection` (stating `coverage`, when given) and returns the remote it opens.
    static func open(
        _ connection: Connection, nodeID: String, localDatabase: String, inlineWanted: Bool,
        features: [String] = SyncProtocol.features, coverage: CoverageSnapshot? = nil
    ) async throws(SyncError) -> FerryRemote {
        let hello = HelloRequest(
            nodeID: nodeID, database: localDatabase, protocols: SyncProtocol.versions, features: features, coverage: coverage)
        let reply = try await ask(hello, on: connection)
        let identity = RemoteIdentity(
            databaseID: reply.database, peerID: reply.nodeID, allowsPull: reply.allowPull, allowsPush: reply.allowPush,
            inline: inlineWanted && reply.features.contains("inline"),
            heartbeat: features.contains(SyncProtocol.heartbeatFeature) && reply.features.contains(SyncProtocol.heartbeatFeature),
            coverage: reply.coverage)
        var opened = identity
        opened.reportsSkips = reply.features.contains(SyncProtocol.skipReportsFeature)
        opened.accessEpoch = reply.accessEpoch
        opened.accessStamp = reply.accessStamp
        opened.acceptsRemovals =
            features.contains(SyncProtocol.accessRemovalFeature) && reply.features.contains(SyncProtocol.accessRemovalFeature)
        opened.blobChunks =
            features.contains(SyncProtocol.blobChunksFeature) && reply.features.contains(SyncProtocol.blobChunksFeature)
        return FerryRemote(connection: connection, identity: opened)
    }

    /// Sends one request and decodes the reply its type names.
    private static func ask<Request: SyncRequestBody>(_ body: Request, on connection: Connection) async throws(SyncError) -> Request.Reply {
        try Request.Reply(reply: try await connection.request(Request.profile, body: body.bytes))
    }

    private func ask<Request: SyncRequestBody>(_ body: Request) async throws(SyncError) -> Request.Reply {
        try await Self.ask(body, on: connection)
    }

    func changes(_ request: RemoteChangesRequest) async throws -> RemoteChanges {
        var asked = ChangesRequest()
        asked.since = request.since.json.intValue.map { UInt64(max(0, $0)) } ?? 0
        asked.limit = Int64(request.limit)
        asked.live = request.live
        let (seconds, atto) = request.timeout.components
        asked.timeoutMs = seconds * 1000 + atto / 1_000_000_000_000_000
        asked.inline = request.inlineLimit.map(Int64.init)
        asked.noDeltas = request.noDeltas
        asked.docIDs = request.documentIDs.map { $0.map(\.rawValue) }
        let reply = try await ask(asked)
        var changes: [RemoteChange] = []
        changes.reserveCapacity(reply.changes.count)
        for entry in reply.changes {
            guard let id = try? DocumentID(entry.id, allowReserved: true) else {
                throw SyncError.protocolViolation("changes entry is malformed")
            }
            let leaves = entry.leaves.compactMap { try? RevisionID($0) }
            // Inline revisions come for single-leaf documents only; a malformed one is fetched instead.
            var inline: WireRevision?
            if let o = entry.inline, leaves.count == 1 { inline = WireRevision(inline: o, id: entry.id, rev: leaves[0].description) }
            changes.append(RemoteChange(id: id, leaves: leaves, inline: inline))
        }
        var page = RemoteChanges(
            changes: changes, lastSequence: RemoteSequence(reply.lastSeq), caughtUp: reply.caughtUp, skipped: reply.skipped,
            skipsLost: reply.skipsLost)
        page.pending = reply.pending
        page.removed = reply.removed
        return page
    }

    /// Asks which of these held documents this side may no longer read.
    func checkAccess(_ held: [AccessCheckRequest.HeldDocument]) async throws -> [RemovalNotice] {
        try await ask(AccessCheckRequest(held: held)).removed
    }

    /// Sends removal notices (the peer listed `accessRemoval` in its hello reply).
    func tellAccessRemoved(_ notices: [RemovalNotice]) async throws {
        _ = try await ask(AccessRemovedRequest(removed: notices))
    }

    func revsDiff(_ docs: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] {
        try await ask(RevsDiffRequest(docs: docs)).entries
    }

    func fetchRevisions(_ requests: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        try await ask(GetRevsRequest(revs: requests, deltas: deltas, maxHistory: Int64(maxHistory))).revisions
    }

    func storeRevisions(_ revisions: [WireRevision]) async throws -> [PutResult] {
        let reply = try await connection.request(SyncProtocol.Profile.putRevs, body: WireRevision.encodeBatch(revisions))
        let results = try PutRevsReply(try reply.json()).results
        guard results.count == revisions.count else {
            throw SyncError.protocolViolation("putRevs reply does not answer every revision")
        }
        return results
    }

    func missingBlobs(_ digests: [BlobDigest]) async throws -> [BlobDigest] {
        try await ask(HasBlobsRequest(digests: digests)).missing
    }

    func blob(_ digest: BlobDigest) async throws -> [UInt8] {
        try await connection.request(SyncProtocol.Profile.getBlob, properties: [(BlobProperty.name, digest.description)]).body
    }

    func putBlob(_ digest: BlobDigest, content: [UInt8]) async throws {
        _ = try await connection.request(SyncProtocol.Profile.putBlob, properties: [(BlobProperty.name, digest.description)], body: content)
    }

    var chunkedBlobs: Bool { identity.blobChunks }

    func missingBlobOffsets(_ blobs: [BlobReference]) async throws -> [BlobDigest: Int64] {
        let reply = try await ask(HasBlobsRequest(digests: blobs.map(\.digest), lengths: blobs.map(\.length)))
        return Dictionary(uniqueKeysWithValues: reply.missing.map { ($0, reply.partial[$0] ?? 0) })
    }

    func blobChunk(_ digest: BlobDigest, offset: Int64, count: Int) async throws -> BlobChunk {
        var properties = [(BlobProperty.name, digest.description), (BlobProperty.offset, "\(offset)"), (BlobProperty.length, "\(count)")]
        if BlobProperty.fetchingOnBehalf { properties.append((BlobProperty.onBehalf, "1")) }
        let reply = try await connection.request(SyncProtocol.Profile.getBlob, properties: properties)
        guard let total = try BlobProperty.number(reply, BlobProperty.total) else {
            throw SyncError.protocolViolation("getBlob reply lacks \(BlobProperty.total)")
        }
        return BlobChunk(bytes: reply.body, total: total)
    }

    func putBlobChunk(_ digest: BlobDigest, offset: Int64, total: Int64, bytes: [UInt8]) async throws -> Int64 {
        let reply = try await connection.request(
            SyncProtocol.Profile.putBlob,
            properties: [
                (BlobProperty.name, digest.description), (BlobProperty.offset, "\(offset)"), (BlobProperty.total, "\(total)"),
            ], body: bytes)
        return PutBlobReply(try reply.json()).have
    }

    func localDocument(_ id: String) async throws -> JSON? {
        try await ask(GetCheckpointRequest(id: id)).value
    }

    func putLocalDocument(_ id: String, value: JSON) async throws {
        _ = try await ask(SetCheckpointRequest(id: id, value: value))
    }

    func checkpoint(_ id: String, direction: CheckpointDirection) async throws -> RemoteCheckpoint {
        let answer = try await ask(GetCheckpointRequest(id: id, direction: direction))
        return RemoteCheckpoint(value: answer.value, holds: direction == .push ? answer.holds : nil)
    }

    func putCheckpoint(_ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool) async throws {
        _ = try await ask(SetCheckpointRequest(id: id, value: value, direction: direction, caughtUp: caughtUp))
    }

    func putCheckpoint(
        _ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool, skipped: [SkippedRelay], skipsLost: Bool
    ) async throws {
        var set = SetCheckpointRequest(id: id, value: value, direction: direction, caughtUp: caughtUp)
        set.skipped = skipped
        set.skipsLost = skipsLost
        _ = try await ask(set)
    }
}
