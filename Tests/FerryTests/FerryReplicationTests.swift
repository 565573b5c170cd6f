import Ferry
import Foundation
import Testing

/// The embedding front door over a message endpoint: settings reach the replicator, a reset
/// checkpoint makes the next run compare everything again, and a running replication
/// refuses a reset. Three minutes each: a parallel run's first burst of suites has held the
/// cooperative pool 34 s.
@Suite(.timeLimit(.minutes(3))) struct FerryReplicationTests {
    /// A target whose every attempt is served by a responder on `remote`.
    static func target(serving remote: DocumentStore) -> ReplicationTarget {
        .endpoint(open: {
            let (mine, theirs) = InMemoryEndpoint.pair()
            let responder = ReplicationResponder(store: remote, options: .init())
            Task { await responder.serve(theirs) }
            return mine
        })
    }

    static func run(_ replication: FerryReplication) async throws {
        replication.start()
        await replication.waitUntilStopped()
        if let error = replication.status.error { throw error }
    }

    @Test func aPullFilterSetInSettingsKeepsRevisionsOut() async throws {
        let (local, remote) = (try DocumentStore.inMemory(), try DocumentStore.inMemory())
        _ = try remote.put(DocumentID("kept"), body: ["n": 1])
        _ = try remote.put(DocumentID("draft"), body: ["draft": true])
        var settings = ReplicationSettings()
        settings.direction = .pull
        settings.pullFilter = RevisionFilter(name: "no-drafts") { $0.body["draft"] != .bool(true) }
        let replication = try FerryReplication(store: local, target: Self.target(serving: remote), settings: settings)
        try await Self.run(replication)
        #expect(try local.document(DocumentID("kept")) != nil)
        #expect(try local.document(DocumentID("draft")) == nil)
        #expect(replication.summary.pulled == 1 && replication.summary.rejected == 1, "\(replication.summary)")
    }

    @Test func aResetCheckpointMakesTheNextRunCompareEveryDocumentAgain() async throws {
        let (local, remote) = (try DocumentStore.inMemory(), try DocumentStore.inMemory())
        for i in 0..<5 { _ = try remote.put(DocumentID("doc-\(i)"), body: ["i": .int(Int64(i))]) }
        var settings = ReplicationSettings()
        settings.direction = .pull
        let replication = try FerryReplication(store: local, target: Self.target(serving: remote), settings: settings)
        try await Self.run(replication)
        #expect(replication.status.total == 5)

        // A second run resumes from the checkpoint: nothing to examine.
        let again = try FerryReplication(store: local, target: Self.target(serving: remote), settings: settings)
        try await Self.run(again)
        #expect(again.status.total == 0, "\(again.status)")

        // After a reset, every document is examined again (and none is stored twice).
        try again.resetCheckpoint()
        try await Self.run(again)
        #expect(again.status.total == 5, "\(again.status)")
        #expect(again.summary.pulled == 0)
    }

    @Test func aRunningReplicationRefusesAReset() async throws {
        let (local, remote) = (try DocumentStore.inMemory(), try DocumentStore.inMemory())
        var settings = ReplicationSettings()
        settings.continuous = true
        let replication = try FerryReplication(store: local, target: Self.target(serving: remote), settings: settings)
        replication.start()
        defer { replication.stop() }
        for await status in replication.statusChanges() where status.activity == .idle { break }
        #expect(throws: SyncError.self) { try replication.resetCheckpoint() }
        replication.stop()
        await replication.waitUntilStopped()
        try replication.resetCheckpoint()
    }

    @Test func aBadPeerURLIsRefusedWhenTheReplicationIsMade() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("front-door-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let identity = try NodeIdentity.loadOrCreate(directory: dir)
        #expect(throws: TransportError.self) {
            _ = try FerryReplication(
                store: try DocumentStore.inMemory(), target: .peer(url: "http://not-a-websocket", pin: identity.nodeID, identity: identity))
        }
        #expect(throws: (any Error).self) {
            _ = try FerryReplication(store: try DocumentStore.inMemory(), target: .couchDB(url: "ftp://nowhere/db"))
        }
    }
}
