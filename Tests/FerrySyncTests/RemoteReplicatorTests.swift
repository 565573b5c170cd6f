import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// Counts how often a remote opener ran and how its remotes were closed.
final class OpenerLedger: Sendable {
    private let state = Locked<(opened: Int, closed: [SyncError?], failuresLeft: Int)>((0, [], 0))
    init(failFirst: Int = 0) { state.withLock { $0.failuresLeft = failFirst } }
    var opened: Int { state.withLock { $0.opened } }
    var closed: [SyncError?] { state.withLock { $0.closed } }
    /// Counts an attempt; throws a transient error while failures are left.
    func attempt() throws {
        let fail = state.withLock { s -> Bool in
            s.opened += 1
            guard s.failuresLeft > 0 else { return false }
            s.failuresLeft -= 1
            return true
        }
        if fail { throw SyncError(.other("connect_failed"), message: "the server is down", isTransient: true) }
    }
    func noteClose(_ error: SyncError?) { state.withLock { $0.closed.append(error) } }
}

/// A `StoreRemote` that tells its ledger when it is closed.
struct LedgerRemote: RemoteDatabase {
    let inner: StoreRemote
    let ledger: OpenerLedger
    var identity: RemoteIdentity { inner.identity }
    func changes(_ r: RemoteChangesRequest) async throws -> RemoteChanges { try await inner.changes(r) }
    func revsDiff(_ d: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] { try await inner.revsDiff(d) }
    func fetchRevisions(_ r: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        try await inner.fetchRevisions(r, deltas: deltas, maxHistory: maxHistory)
    }
    func storeRevisions(_ r: [WireRevision]) async throws -> [PutResult] { try await inner.storeRevisions(r) }
    func missingBlobs(_ d: [BlobDigest]) async throws -> [BlobDigest] { try await inner.missingBlobs(d) }
    func blob(_ d: BlobDigest) async throws -> [UInt8] { try await inner.blob(d) }
    func putBlob(_ d: BlobDigest, content: [UInt8]) async throws { try await inner.putBlob(d, content: content) }
    func localDocument(_ id: String) async throws -> JSON? { try await inner.localDocument(id) }
    func putLocalDocument(_ id: String, value: JSON) async throws { try await inner.putLocalDocument(id, value: value) }
    func close(error: SyncError?) async { ledger.noteClose(error) }
}

@Suite(.timeLimit(.minutes(2))) struct RemoteReplicatorTests {
    @Test func aReplicatorOverAnOpenedRemoteSyncsBothWaysRetriesAFailedOpenAndClosesTheRemote() async throws {
        let local = try DocumentStore.inMemory()
        let other = try DocumentStore.inMemory()
        for i in 0..<3 { try local.put(try DocumentID("mine-\(i)"), body: ["i": .int(Int64(i))]) }
        for i in 0..<4 { try other.put(try DocumentID("theirs-\(i)"), body: ["i": .int(Int64(i))]) }
        let remote = StoreRemote(other)
        let ledger = OpenerLedger(failFirst: 1)
        var config = ReplicatorConfiguration()
        config.initialAttemptWait = .milliseconds(1)
        let replicator = Replicator(
            store: local,
            remote: {
                try ledger.attempt()
                return LedgerRemote(inner: remote, ledger: ledger)
            }, configuration: config, clock: ImmediateClock())
        await replicator.run()
        #expect(replicator.status.error == nil)
        #expect(ledger.opened == 2)
        #expect(ledger.closed.count == 1 && ledger.closed.first! == nil)
        #expect(replicator.summary.pulled == 4 && replicator.summary.pushed == 3)
        #expect(try local.document(try DocumentID("theirs-3")) != nil)
        #expect(try other.document(try DocumentID("mine-2")) != nil)
    }
}
