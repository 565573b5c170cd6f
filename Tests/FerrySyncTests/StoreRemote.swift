import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
@testable import FerrySync

/// A `RemoteDatabase` that is another `DocumentStore` in the same process, with no message
/// protocol in between; its sequences are opaque strings (`"s-N"`), as a CouchDB feed's
/// are, and it records what the workers asked of it.
final class StoreRemote: RemoteDatabase {
    let store: DocumentStore
    let identity: RemoteIdentity
    private let localDocuments = Locked<[String: JSON]>([:])
    private let calls = Locked<[String: Int]>([:])

    init(_ store: DocumentStore, allowsPush: Bool = true, allowsPull: Bool = true) {
        self.store = store
        identity = RemoteIdentity(
            databaseID: store.uuid, peerID: "in-memory", allowsPull: allowsPull, allowsPush: allowsPush, inline: false)
    }

    /// How many times each verb was called.
    func count(_ verb: String) -> Int { calls.withLock { $0[verb] ?? 0 } }
    private func called(_ verb: String) { calls.withLock { $0[verb, default: 0] += 1 } }

    static func sequence(_ n: UInt64) -> RemoteSequence { RemoteSequence(.string("s-\(n)")) }
    static func number(_ s: RemoteSequence) -> UInt64 {
        guard case .string(let text) = s.json else { return 0 }
        return UInt64(text.dropFirst(2)) ?? 0
    }

    func changes(_ request: RemoteChangesRequest) async throws -> RemoteChanges {
        called("changes")
        let since = Self.number(request.since)
        var page = try store.changesWithLeaves(since: since, limit: request.limit)
        if page.isEmpty && request.live {
            let store = self.store
            let limit = request.limit
            page = try await firstOf({
                try await store.waitForCommit(past: since)
                return try store.changesWithLeaves(since: since, limit: limit)
            }, timeout: request.timeout, clock: ContinuousClock()) ?? []
        }
        let changes = page.filter { request.documentIDs?.contains($0.0.id) ?? true }.map {
            RemoteChange(id: $0.0.id, leaves: $0.1, inline: nil)
        }
        return RemoteChanges(
            changes: changes, lastSequence: Self.sequence(page.last?.0.sequence ?? since), caughtUp: page.count < request.limit)
    }

    func revsDiff(_ docs: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] {
        called("revsDiff")
        return RevsDiffReply(store: try store.revsDiff(docs)).entries
    }

    func fetchRevisions(_ requests: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        called("fetchRevisions")
        let trees = try store.revisionTrees(requests.map(\.id))
        return requests.map { r in
            guard let tree = trees[r.id],
                let (wire, _) = WireRevision.make(
                    id: r.id, revision: r.rev, tree: tree, receiverHas: r.ancestors, useDeltas: deltas, maxHistory: maxHistory)
            else { return .missing(id: r.id.rawValue, rev: r.rev.description) }
            return wire
        }
    }

    func storeRevisions(_ revisions: [WireRevision]) async throws -> [PutResult] {
        called("storeRevisions")
        let trees = try store.revisionTrees(Set(revisions.compactMap { try? DocumentID($0.id, allowReserved: true) }))
        let pipeline = IncomingPipeline(policy: .trusted, filter: nil, maxBodyBytes: store.options.maxBodyBytes)
        var results: [PutResult] = []
        var accepted: [(Int, IncomingRevision)] = []
        for wire in revisions {
            switch pipeline.check(wire, baseBody: { id, base in trees[id]?.revision(base)?.body.flatMap { try? JSON.parse($0).objectValue } }) {
            case .accepted(let rev):
                accepted.append((results.count, rev))
                results.append(PutResult(id: wire.id, rev: wire.rev, status: .stored))
            case .rejected(_, _, let rejection): results.append(PutResult(id: wire.id, rev: wire.rev, status: .rejected(rejection)))
            case .needFull: results.append(PutResult(id: wire.id, rev: wire.rev, status: .needFull))
            }
        }
        let outcomes = try store.insertRevisions(accepted.map(\.1))
        for ((index, _), outcome) in zip(accepted, outcomes) {
            switch outcome {
            case .inserted: break
            case .alreadyPresent: results[index].status = .exists
            case .rejected(let e): results[index].status = .rejected(Rejection(storeError: e))
            }
        }
        return results
    }

    func missingBlobs(_ digests: [BlobDigest]) async throws -> [BlobDigest] {
        called("missingBlobs")
        return digests.filter { !store.blobs.has($0) }
    }

    func blob(_ digest: BlobDigest) async throws -> [UInt8] {
        called("blob")
        guard let content = try store.blobs.get(digest) else { throw SyncError(.notFound, message: "no blob", isTransient: false) }
        return content
    }

    func putBlob(_ digest: BlobDigest, content: [UInt8]) async throws {
        called("putBlob")
        try store.blobs.put(content)
    }

    func localDocument(_ id: String) async throws -> JSON? { localDocuments.withLock { $0[id] } }
    func putLocalDocument(_ id: String, value: JSON) async throws { localDocuments.withLock { $0[id] = value } }
}

/// Runs one worker of a one-shot replication against `remote`, without any message protocol.
func runWorker(
    _ direction: CheckpointDirection, local: DocumentStore, remote: StoreRemote,
    configure: (inout ReplicatorConfiguration) -> Void = { _ in }
) async throws -> ReplicationContext {
    var config = ReplicatorConfiguration()
    configure(&config)
    config.direction = direction == .pull ? .pull : .push
    let context = ReplicationContext(store: local, configuration: config, clock: ImmediateClock(), logger: .init(label: "test"))
    let key = Checkpointer<UInt64>.key(
        localDatabase: local.uuid, remoteDatabase: remote.identity.databaseID, direction: direction, filterName: nil, documentIDs: nil)
    switch direction {
    case .pull: try await Puller(context: context, remote: remote).run(checkpointKey: key)
    case .push: try await Pusher(context: context, remote: remote).run(checkpointKey: key) { _ in }
    }
    return context
}
