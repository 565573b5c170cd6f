import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// A `StoreRemote` whose first revision fetch fails with a transient error, as a server
/// killed in the middle of a batch makes it fail; later fetches are served.
final class FirstFetchFailsRemote: RemoteDatabase {
    let inner: StoreRemote
    let failuresLeft: Locked<Int>
    init(_ inner: StoreRemote, failures: Int) {
        self.inner = inner
        failuresLeft = Locked(failures)
    }
    var identity: RemoteIdentity { inner.identity }
    func changes(_ r: RemoteChangesRequest) async throws -> RemoteChanges { try await inner.changes(r) }
    func revsDiff(_ d: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] { try await inner.revsDiff(d) }
    func fetchRevisions(_ r: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        let fail = failuresLeft.withLock { left -> Bool in
            defer { left = max(0, left - 1) }
            return left > 0
        }
        if fail { throw SyncError(.other("connect_failed"), message: "the server went away", isTransient: true) }
        return try await inner.fetchRevisions(r, deltas: deltas, maxHistory: maxHistory)
    }
    func storeRevisions(_ r: [WireRevision]) async throws -> [PutResult] { try await inner.storeRevisions(r) }
    func missingBlobs(_ d: [BlobDigest]) async throws -> [BlobDigest] { try await inner.missingBlobs(d) }
    func blob(_ d: BlobDigest) async throws -> [UInt8] { try await inner.blob(d) }
    func putBlob(_ d: BlobDigest, content: [UInt8]) async throws { try await inner.putBlob(d, content: content) }
    func localDocument(_ id: String) async throws -> JSON? { try await inner.localDocument(id) }
    func putLocalDocument(_ id: String, value: JSON) async throws { try await inner.putLocalDocument(id, value: value) }
    func close(error: SyncError?) async {}
}

@Suite(.timeLimit(.minutes(2))) struct ReplicatorRecoveryTests {
    /// A batch listed by an attempt that failed is listed again by the next one: counted
    /// once, so the recovered continuous replication reports idle with nothing left to do.
    @Test func aContinuousPullThatRecoversFromAFailedBatchShowsIdleAgain() async throws {
        let local = try DocumentStore.inMemory()
        let other = try DocumentStore.inMemory()
        for i in 0..<5 { try other.put(try DocumentID("doc-\(i)"), body: ["i": .int(Int64(i))]) }
        let remote = FirstFetchFailsRemote(StoreRemote(other), failures: 1)
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
