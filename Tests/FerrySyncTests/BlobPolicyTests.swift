import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// Lazy and size-threshold blob policies: documents first, blob content on first read.
@Suite(.timeLimit(.minutes(5))) struct BlobPolicyTests {
    /// A store with a small (100 B) and a large (600 KiB) blob, each in its own document.
    static func source() throws -> (DocumentStore, small: BlobReference, large: BlobReference) {
        let a = try DocumentStore.inMemory()
        let small = try a.blobs.put(BlobChunkTests.randomBytes(100, seed: 1))
        let large = try a.blobs.put(BlobChunkTests.randomBytes(600 << 10, seed: 2))
        try a.put(docID("note"), body: ["f": small.json])
        try a.put(docID("scan"), body: ["f": large.json])
        return (a, small, large)
    }

    @Test func aSizeThresholdFetchesSmallBlobsBeforeStoringAndLeavesLargeOnesForLater() async throws {
        let (a, small, large) = try Self.source()
        let b = try DocumentStore.inMemory()
        let r = await sync(b, a, direction: .pull) { $0.blobPolicy = .eagerUpTo(1000) }
        #expect(r.status.error == nil)
        #expect(try b.documentCount == 2)
        #expect(b.blobs.state(small.digest) == .present(length: 100))
        #expect(b.blobs.state(large.digest) == .deferred(length: large.length, partial: 0))
        #expect(r.summary.blobsDeferred == 1)
        #expect(r.summary.blobBytesReceived == 100)
        // The document referring to a deferred blob can be edited like any other.
        let doc = try #require(try b.document(docID("scan")))
        try b.put(docID("scan"), body: ["f": large.json, "seen": true], parent: doc.revision)
    }

    @Test func aLazyReplicatorFetchesADeferredBlobOnFirstReadOverItsOpenConnection() async throws {
        let (a, _, large) = try Self.source()
        let b = try DocumentStore.inMemory()
        var config = ReplicatorConfiguration(direction: .pull)
        config.continuous = true
        config.blobPolicy = .lazy
        let link = Link(to: a)
        let r = Replicator(store: b, connector: link.connector, configuration: config)
        // Not connected yet: nothing to fetch from.
        #expect(try await r.fetchDeferredBlob(large) == false)
        r.start()
        try await waitUntil("documents arrived") { (try? b.documentCount) == 2 }
        #expect(b.blobs.state(large.digest) == .deferred(length: large.length, partial: 0))
        #expect(try await r.fetchDeferredBlob(large))
        #expect(b.blobs.state(large.digest) == .present(length: large.length))
        #expect(try b.blobs.get(large.digest) == a.blobs.get(large.digest))
        // A blob the peer does not have is a plain no.
        let unknown = BlobReference(digest: BlobDigest.of([9, 9]), length: 2)
        #expect(try await r.fetchDeferredBlob(unknown) == false)
        r.stop()
        await r.waitUntilStopped()
    }

    @Test func aResponderWithALazyPolicyTakesPushedDocumentsWithoutTheirLargeBlobs() async throws {
        let (a, small, large) = try Self.source()
        let b = try DocumentStore.inMemory()
        var options = ReplicationResponder.Options()
        options.blobPolicy = .eagerUpTo(1000)
        let r = await sync(a, b, direction: .push, responder: options)
        #expect(r.status.error == nil)
        #expect(try b.documentCount == 2)
        #expect(b.blobs.state(small.digest) == .present(length: 100))
        #expect(b.blobs.state(large.digest) == .deferred(length: large.length, partial: 0))
        #expect(r.summary.blobBytesSent == 100)
    }

    @Test func aPolicyIsReadFromEagerLazyOrASize() throws {
        #expect(try BlobFetchPolicy(parsing: "eager") == .eager)
        #expect(try BlobFetchPolicy(parsing: "LAZY") == .lazy)
        #expect(try BlobFetchPolicy(parsing: "5MB") == .eagerUpTo(5_000_000))
        #expect(try BlobFetchPolicy(parsing: "64KiB") == .eagerUpTo(65536))
        #expect(try BlobFetchPolicy(parsing: "1234") == .eagerUpTo(1234))
        #expect(throws: SyncError.self) { try BlobFetchPolicy(parsing: "sometimes") }
        #expect(throws: SyncError.self) { try BlobFetchPolicy(parsing: "-5MB") }
    }
}

extension BlobPolicyTests {
    @Test func aDocumentWithoutBlobsIsStoredBeforeAnotherDocumentsBlobArrives() async throws {
        let (a, _, large) = try Self.source()
        try a.put(docID("plain"), body: ["n": 1])
        let b = try DocumentStore.inMemory()
        var link = Link(to: a)
        // Watches the receiver's store each time a blob chunk is delivered.
        let sawPlainDuringBlob = Switch()
        link.faults = { _ in
            (.init(), .init(deliver: { m in
                if m.count > 100_000, (try? b.document(docID("plain"))) != nil {
                    sawPlainDuringBlob.turn(on: true)
                }
                return [m]
            }))
        }
        let r = Replicator(store: b, connector: link.connector, configuration: .init(direction: .pull), clock: ImmediateClock())
        await r.run()
        #expect(r.status.error == nil)
        #expect(sawPlainDuringBlob.isOn)
        #expect(try b.blobs.get(large.digest) == a.blobs.get(large.digest))
        #expect(try b.documentCount == 3)
    }
}

extension BlobPolicyTests {
    @Test func aPushedDocumentWithoutBlobsIsStoredBeforeAnotherDocumentsBlobIsSent() async throws {
        let (a, _, large) = try Self.source()
        try a.put(docID("plain"), body: ["n": 1])
        let b = try DocumentStore.inMemory()
        var link = Link(to: b)
        let plainFirst = Switch()
        link.faults = { _ in
            (.init(deliver: { m in
                if m.count > 100_000, (try? b.document(docID("plain"))) != nil { plainFirst.turn(on: true) }
                return [m]
            }), .init())
        }
        let r = Replicator(store: a, connector: link.connector, configuration: .init(direction: .push), clock: ImmediateClock())
        await r.run()
        #expect(r.status.error == nil)
        #expect(plainFirst.isOn)
        #expect(try b.blobs.get(large.digest) == a.blobs.get(large.digest))
        #expect(try b.documentCount == 3)
    }
}
