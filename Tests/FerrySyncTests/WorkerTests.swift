import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// The pull and push workers against an in-memory `RemoteDatabase`, with no message protocol.
@Suite(.timeLimit(.minutes(2))) struct WorkerTests {
    @Test func thePullerCopiesEveryDocumentOverManyPagesAndChunksWithOpaqueSequences() async throws {
        let local = try DocumentStore.inMemory()
        let source = try DocumentStore.inMemory()
        for i in 0..<45 { try source.put(docID("d\(i)"), body: ["n": .int(Int64(i))]) }
        let remote = StoreRemote(source)
        let context = try await runWorker(.pull, local: local, remote: remote) {
            $0.batchSize = 10
            $0.maxRevisionsPerRequest = 3
        }
        #expect(try digest(local) == digest(source))
        #expect(context.progress.summary.pulled == 45)
        #expect(remote.count("fetchRevisions") == 18)  // pages of 10 (and 5) in chunks of 3
        // Both copies of the checkpoint hold the remote's own (string) sequence.
        let key = Checkpointer<UInt64>.key(
            localDatabase: local.uuid, remoteDatabase: source.uuid, direction: .pull, filterName: nil, documentIDs: nil)
        #expect(try await remote.localDocument(key)?["seq"] == .string("s-45"))
        #expect(try local.localDocument("checkpoint/\(key)")?["seq"] == .string("s-45"))
    }

    @Test func aSecondPullResumesFromTheCheckpointAndFetchesNothing() async throws {
        let local = try DocumentStore.inMemory()
        let source = try DocumentStore.inMemory()
        for i in 0..<5 { try source.put(docID("d\(i)"), body: [:]) }
        let remote = StoreRemote(source)
        _ = try await runWorker(.pull, local: local, remote: remote)
        let fetches = remote.count("fetchRevisions")
        try source.put(docID("late"), body: [:])
        let second = try await runWorker(.pull, local: local, remote: remote)
        #expect(second.progress.summary.pulled == 1)
        #expect(remote.count("fetchRevisions") == fetches + 1)
        #expect(try local.document(docID("late")) != nil)
    }

    @Test func aPulledRevisionWhoseBodyDoesNotMatchItsIDIsRejectedAtTheDigestStage() async throws {
        let local = try DocumentStore.inMemory()
        let source = try DocumentStore.inMemory()
        try source.put(docID("good"), body: ["n": 1])
        let remote = InterposedRemote.tampering(StoreRemote(source))
        let context = ReplicationContext(
            store: local, configuration: { var c = ReplicatorConfiguration(); c.direction = .pull; return c }(),
            clock: ContinuousClock(), logger: .init(label: "test"))
        let events = context.progress.eventBroadcaster.subscribe()
        try await Puller(context: context, remote: remote).run(checkpointKey: "k")
        #expect(try local.document(docID("good")) == nil)
        #expect(context.progress.summary.rejected == 1)
        var iterator = events.makeAsyncIterator()
        let event = await iterator.next()
        #expect(event?.rejection?.hasPrefix("digest:") == true)
    }

    @Test func thePusherSendsOnlyWhatTheRemoteLacksWithBlobsFirst() async throws {
        let local = try DocumentStore.inMemory()
        let target = try DocumentStore.inMemory()
        let ref = try local.blobs.put(Array("attached".utf8))
        try local.put(docID("with-blob"), body: ["file": ref.json])
        for i in 0..<8 { try local.put(docID("d\(i)"), body: ["n": .int(Int64(i))]) }
        let remote = StoreRemote(target)
        _ = try await runWorker(.pull, local: target, remote: StoreRemote(local)) { $0.documentIDs = [docID("d0"), docID("d1")] }
        let context = try await runWorker(.push, local: local, remote: remote) { $0.maxRevisionsPerRequest = 4 }
        #expect(try digest(local) == digest(target))
        #expect(context.progress.summary.pushed == 7)
        #expect(context.progress.summary.blobsSent == 1)
        #expect(remote.count("putBlob") == 1)
        // The six documents without blobs in two requests of at most four, then, after its
        // blob, the one that refers to it.
        #expect(remote.count("storeRevisions") == 3)
    }

    @Test func aRemoteRejectionReachesTheEventWithItsStage() async throws {
        let local = try DocumentStore.inMemory()
        try local.put(docID("refused"), body: [:])
        let remote = InterposedRemote.refusing(StoreRemote(try DocumentStore.inMemory()))
        let context = ReplicationContext(
            store: local, configuration: { var c = ReplicatorConfiguration(); c.direction = .push; return c }(),
            clock: ContinuousClock(), logger: .init(label: "test"))
        let events = context.progress.eventBroadcaster.subscribe()
        try await Pusher(context: context, remote: remote).run(checkpointKey: "k") { _ in }
        var iterator = events.makeAsyncIterator()
        let event = await iterator.next()
        #expect(event?.rejection == "policy: no")
        #expect(context.progress.summary.rejected == 1)
    }

    @Test func aCaughtUpCheckpointDefersTheRemoteCopyUntilItsDelayHasPassed() async throws {
        let clock = ManualClock()
        let local = try DocumentStore.inMemory()
        let remote = StoreRemote(try DocumentStore.inMemory())
        var checkpoint = Checkpointer<UInt64>(key: "k", store: local, remote: remote, delay: .seconds(5), clock: clock)
        #expect(try await checkpoint.start(reset: false) == 0)
        checkpoint.advance(to: 3)
        try await checkpoint.saveBoth()
        checkpoint.advance(to: 4)
        try checkpoint.saveLocal()
        checkpoint.deferRemote()
        #expect(checkpoint.remoteLags && !checkpoint.isDue && checkpoint.remaining == .seconds(5))
        #expect(try await remote.localDocument("k")?["seq"] == 3)
        clock.advance(by: .seconds(5))
        #expect(checkpoint.isDue)
        try await checkpoint.saveBoth()
        #expect(!checkpoint.remoteLags && checkpoint.remaining == nil)
        // A new run resumes from the lower of the two copies, or from 0 when reset.
        try await remote.putLocalDocument("k", value: ["seq": 2])
        var again = Checkpointer<UInt64>(key: "k", store: local, remote: remote, delay: .seconds(5), clock: clock)
        #expect(try await again.start(reset: false) == 2)
        #expect(try await again.start(reset: true) == 0)
    }

    @Test func anOpaqueCheckpointWhoseRemoteCopyLagsResumesFromTheRemoteCopyNotTheStart() async throws {
        let local = try DocumentStore.inMemory()
        let remote = StoreRemote(try DocumentStore.inMemory())
        let s = StoreRemote.sequence
        var checkpoint = Checkpointer<RemoteSequence>(key: "k", store: local, remote: remote, delay: .seconds(5), clock: ManualClock())
        #expect(try await checkpoint.start(reset: false) == .start)
        checkpoint.advance(to: s(10))
        try await checkpoint.saveBoth()
        // A crash after the next batch's local write, before its remote one.
        checkpoint.advance(to: s(20))
        try checkpoint.saveLocal()
        var again = Checkpointer<RemoteSequence>(key: "k", store: local, remote: remote, delay: .seconds(5), clock: ManualClock())
        #expect(try await again.start(reset: false) == s(10))
        // A remote copy this side never saved (another run's, or another database's) starts over.
        try await remote.putLocalDocument("k", value: ["seq": s(99).json])
        var stranger = Checkpointer<RemoteSequence>(key: "k", store: local, remote: remote, delay: .seconds(5), clock: ManualClock())
        #expect(try await stranger.start(reset: false) == .start)
    }

    @Test func opaqueCheckpointsResumeOnlyWhenBothCopiesAgree() {
        let a = RemoteSequence(.string("g1-abc"))
        let b = RemoteSequence(.string("g2-def"))
        #expect(RemoteSequence.resume(local: a, remote: a) == a)
        #expect(RemoteSequence.resume(local: a, remote: b) == nil)
        #expect(RemoteSequence.resume(local: RemoteSequence(UInt64(7)), remote: RemoteSequence(UInt64(5))) == RemoteSequence(UInt64(5)))
    }
}

/// Passes every verb through to a `StoreRemote`, but for the fetch and store it is given.
struct InterposedRemote: RemoteDatabase {
    let inner: StoreRemote
    /// Fetch whole bodies, never deltas (a body rewritten after the fact cannot be a delta).
    var fullBodies = false
    var fetched: @Sendable ([WireRevision]) -> [WireRevision] = { $0 }
    var store: (@Sendable ([WireRevision]) -> [PutResult])?

    /// Serves revisions with a body that does not match their ID.
    static func tampering(_ inner: StoreRemote) -> InterposedRemote {
        InterposedRemote(inner: inner, fullBodies: true, fetched: { revisions in
            revisions.map {
                var w = $0
                w.content = Array(#"{"n":2}"#.utf8)
                return w
            }
        })
    }

    /// Refuses every stored revision at the policy stage.
    static func refusing(_ inner: StoreRemote) -> InterposedRemote {
        InterposedRemote(inner: inner, store: { r in
            r.map { PutResult(id: $0.id, rev: $0.rev, status: .rejected(Rejection(stage: .policy, reason: "no"))) }
        })
    }

    var identity: RemoteIdentity { inner.identity }
    func changes(_ r: RemoteChangesRequest) async throws -> RemoteChanges { try await inner.changes(r) }
    func revsDiff(_ d: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] { try await inner.revsDiff(d) }
    func fetchRevisions(_ r: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        fetched(try await inner.fetchRevisions(r, deltas: deltas && !fullBodies, maxHistory: maxHistory))
    }
    func storeRevisions(_ r: [WireRevision]) async throws -> [PutResult] {
        if let store { return store(r) }
        return try await inner.storeRevisions(r)
    }
    func missingBlobs(_ d: [BlobDigest]) async throws -> [BlobDigest] { try await inner.missingBlobs(d) }
    func blob(_ d: BlobDigest) async throws -> [UInt8] { try await inner.blob(d) }
    func putBlob(_ d: BlobDigest, content: [UInt8]) async throws { try await inner.putBlob(d, content: content) }
    func localDocument(_ id: String) async throws -> JSON? { try await inner.localDocument(id) }
    func putLocalDocument(_ id: String, value: JSON) async throws { try await inner.putLocalDocument(id, value: value) }
}
