import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// A `StoreRemote` with faults: `beforeChanges` and `beforeFetch` run before each changes
/// request and each revision fetch, and may throw (a link that drops, a server that dies).
final class FaultyRemote: RemoteDatabase {
    let inner: StoreRemote
    let beforeChanges: @Sendable (RemoteChangesRequest) throws -> Void
    let beforeFetch: @Sendable () throws -> Void
    init(
        _ inner: StoreRemote, beforeChanges: @escaping @Sendable (RemoteChangesRequest) throws -> Void = { _ in },
        beforeFetch: @escaping @Sendable () throws -> Void = {}
    ) {
        self.inner = inner
        self.beforeChanges = beforeChanges
        self.beforeFetch = beforeFetch
    }
    var identity: RemoteIdentity { inner.identity }
    func changes(_ r: RemoteChangesRequest) async throws -> RemoteChanges {
        try beforeChanges(r)
        return try await inner.changes(r)
    }
    func revsDiff(_ d: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] { try await inner.revsDiff(d) }
    func fetchRevisions(_ r: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        try beforeFetch()
        return try await inner.fetchRevisions(r, deltas: deltas, maxHistory: maxHistory)
    }
    func storeRevisions(_ r: [WireRevision]) async throws -> [PutResult] { try await inner.storeRevisions(r) }
    func missingBlobs(_ d: [BlobDigest]) async throws -> [BlobDigest] { try await inner.missingBlobs(d) }
    func blob(_ d: BlobDigest) async throws -> [UInt8] { try await inner.blob(d) }
    func putBlob(_ d: BlobDigest, content: [UInt8]) async throws { try await inner.putBlob(d, content: content) }
    func localDocument(_ id: String) async throws -> JSON? { try await inner.localDocument(id) }
    func putLocalDocument(_ id: String, value: JSON) async throws { try await inner.putLocalDocument(id, value: value) }
    func close(error: SyncError?) async {}

    static var transient: SyncError { SyncError(.other("connect_failed"), message: "the server went away", isTransient: true) }
}

@Suite(.timeLimit(.minutes(2))) struct ReplicatorRecoveryTests {
    /// A batch listed by an attempt that failed is listed again by the next one: counted
    /// once, so the recovered continuous replication reports idle with nothing left to do.
    @Test func aContinuousPullThatRecoversFromAFailedBatchShowsIdleAgain() async throws {
        let local = try DocumentStore.inMemory()
        let other = try DocumentStore.inMemory()
        for i in 0..<5 { try other.put(try DocumentID("doc-\(i)"), body: ["i": .int(Int64(i))]) }
        // The first revision fetch fails, as a server killed in the middle of a batch makes it fail.
        let failed = Locked(false)
        let remote = FaultyRemote(StoreRemote(other), beforeFetch: {
            if failed.withLock({ f in defer { f = true }; return !f }) { throw FaultyRemote.transient }
        })
        var config = ReplicatorConfiguration()
        config.direction = .pull
        config.continuous = true
        config.initialAttemptWait = .milliseconds(1)
        let replicator = Replicator(store: local, remote: { remote }, configuration: config, clock: ImmediateClock())
        replicator.start()
        let recovered = await eventually(60) {
            replicator.status.activity == .idle && (try? local.documentCount) == 5
        }
        let status = replicator.status
        replicator.stop()
        await replicator.waitUntilStopped()
        #expect(recovered, "after the failed batch: \(status)")
        #expect(status.completed == status.total && status.total == 5, "\(status)")
        #expect(replicator.summary.pulled == 5)
    }
}

@Suite(.timeLimit(.minutes(2))) struct CheckpointResetTests {
    /// `resetCheckpoint` starts the replication's first session from the beginning; a
    /// reconnect after it resumes from the checkpoint that session saved.
    @Test func aResetAppliesToTheFirstSessionOnlyNotToEveryReconnect() async throws {
        let local = try DocumentStore.inMemory()
        let other = try DocumentStore.inMemory()
        for i in 0..<5 { try other.put(try DocumentID("doc-\(i)"), body: ["i": .int(Int64(i))]) }
        // An earlier run's checkpoint, which the reset must ignore.
        await sync(local, other, direction: .pull)
        try local.purge(try DocumentID("doc-0"))
        // Records where each changes request starts; the first live one fails (the link drops
        // once the pull has caught up).
        let starts = Locked<[String]>([])
        let dropped = Locked(false)
        let remote = FaultyRemote(StoreRemote(other), beforeChanges: { r in
            starts.withLock { $0.append("\(r.since)") }
            if r.live, dropped.withLock({ d in defer { d = true }; return !d }) { throw FaultyRemote.transient }
        })
        var config = ReplicatorConfiguration()
        config.direction = .pull
        config.continuous = true
        config.resetCheckpoint = true
        config.initialAttemptWait = .milliseconds(1)
        let replicator = Replicator(store: local, remote: { remote }, configuration: config, clock: ImmediateClock())
        replicator.start()
        let reconnected = await eventually(60) { starts.withLock { $0.count } >= 3 && dropped.withLock { $0 } }
        await replicator.stop()
        #expect(reconnected)
        let listed = starts.withLock { $0 }
        #expect(try local.document(try DocumentID("doc-0")) != nil, "the reset pull lists the feed from its start")
        // The first session lists from the start; the session after the drop resumes past it.
        #expect(listed.first == "\(RemoteSequence.start)", "\(listed)")
        #expect(listed.dropFirst(2).allSatisfy { $0 != "\(RemoteSequence.start)" }, "a reconnect started over: \(listed)")
    }
}
