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

/// Pages after one whose documents wait for blobs go on; the checkpoint does not.
extension BlobPolicyTests {
    /// A source whose first change is a document with a 600 KiB blob, followed by `plain`
    /// documents without blobs, in a data directory (so the blob is a file).
    static func blobThenPlain(_ plain: Int) throws -> (DocumentStore, large: BlobReference, directory: String) {
        let directory = NSTemporaryDirectory() + "ferry-backlog-\(UUID().uuidString)"
        let a = try DocumentStore.open(directory: directory)
        let large = try a.blobs.put(BlobChunkTests.randomBytes(600 << 10, seed: 4))
        try a.put(docID("scan"), body: ["f": large.json])
        for i in 0..<plain { try a.put(docID("plain-\(i)"), body: ["n": .int(Int64(i))]) }
        return (a, large, directory)
    }

    @Test func documentsOfLaterPagesAreStoredWhileAnEarlierPagesBlobIsFetched() async throws {
        let (a, large, directory) = try Self.blobThenPlain(3)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let b = try DocumentStore.inMemory()
        var link = Link(to: a)
        // Each page holds one change: the plain documents come in pages after the blob's.
        // Blob chunks are held back (up to 5 s) until the last plain document is stored.
        let storedDuringBlob = Switch()
        link.faults = { _ in
            (.init(), .init(deliver: { m in
                guard m.count > 100_000 else { return [m] }
                for _ in 0..<500 {
                    if (try? b.document(docID("plain-2"))) != nil {
                        storedDuringBlob.turn(on: true)
                        break
                    }
                    try? await Task.sleep(for: .milliseconds(10))
                }
                return [m]
            }))
        }
        var configuration = ReplicatorConfiguration(direction: .pull)
        configuration.batchSize = 1
        let r = Replicator(store: b, connector: link.connector, configuration: configuration, clock: ImmediateClock())
        await r.run()
        #expect(r.status.error == nil)
        #expect(storedDuringBlob.isOn, "the later pages' documents waited for the blob")
        #expect(try b.blobs.get(large.digest) == a.blobs.get(large.digest))
        #expect(try b.documentCount == 4)
    }

    @Test func theCheckpointNeverPassesAPageWhoseBlobIsNotStored() async throws {
        let (a, large, directory) = try Self.blobThenPlain(3)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let file = try #require(a.blobs.directory).appending("/\(large.digest.hex.prefix(2))/\(large.digest.hex)")
        let good = try Data(contentsOf: URL(fileURLWithPath: file))
        // The source's blob file is damaged: every fetch of it fails its digest check.
        try Data(good.map { $0 ^ 0x5A }).write(to: URL(fileURLWithPath: file))
        let b = try DocumentStore.inMemory()
        let link = Link(to: a, quiet: true)
        var configuration = ReplicatorConfiguration(direction: .pull)
        configuration.batchSize = 1
        configuration.maxAttempts = 1
        let failed = Replicator(store: b, connector: link.connector, configuration: configuration, clock: ImmediateClock())
        await failed.run()
        #expect(failed.status.error != nil)
        #expect(try b.document(docID("scan")) == nil)
        // Repaired: the next run still asks for the page it could not finish.
        try good.write(to: URL(fileURLWithPath: file))
        let again = Replicator(store: b, connector: link.connector, configuration: configuration, clock: ImmediateClock())
        await again.run()
        #expect(again.status.error == nil, "\(String(describing: again.status.error))")
        #expect(try b.document(docID("scan")) != nil, "the checkpoint passed the page whose blob was never stored")
        #expect(try b.blobs.get(large.digest) == a.blobs.get(large.digest))
        #expect(try b.documentCount == 4)
    }
}

/// An eager peer pulling through a lazy node: the lazy node fetches the blob it deferred
/// when the peer asks for it, one hop only.
extension BlobPolicyTests {
    @Test func anEagerPeerPullingFromALazyNodeGetsTheBlobTheLazyNodeFetchesForIt() async throws {
        let (a, _, large) = try Self.source()
        let b = try DocumentStore.inMemory()
        var lazy = ReplicatorConfiguration(direction: .pull)
        lazy.continuous = true
        lazy.blobPolicy = .lazy
        let fromA = Replicator(store: b, connector: Link(to: a).connector, configuration: lazy)
        fromA.start()
        defer { fromA.stop() }
        try await waitUntil("B has the documents, the large blob deferred") { (try? b.documentCount) == 2 }
        #expect(b.blobs.state(large.digest) == .deferred(length: large.length, partial: 0))

        var options = ReplicationResponder.Options()
        options.fetchDeferredBlob = { ref, _ in try await fromA.fetchDeferredBlob(ref) }
        let c = try DocumentStore.inMemory()
        let r = Replicator(
            store: c, connector: Link(to: b, options: options).connector, configuration: .init(direction: .pull), clock: ImmediateClock())
        await r.run()
        #expect(r.status.error == nil, "\(String(describing: r.status.error))")
        #expect(try c.blobs.get(large.digest) == a.blobs.get(large.digest))
        #expect(try c.documentCount == 2)
        // B holds it now too: the peer's read counted as B's first read.
        #expect(b.blobs.state(large.digest) == .present(length: large.length))
    }

    @Test func aLazyNodeAskedOnBehalfOfAPeerDoesNotFetchInTurn() async throws {
        let (a, _, large) = try Self.source()
        let b = try DocumentStore.inMemory()
        var lazy = ReplicatorConfiguration(direction: .pull)
        lazy.blobPolicy = .lazy
        _ = await Replicator(store: b, connector: Link(to: a).connector, configuration: lazy, clock: ImmediateClock()).run()
        #expect(b.blobs.state(large.digest) == .deferred(length: large.length, partial: 0))
        let asked = Counter()
        var options = ReplicationResponder.Options()
        options.fetchDeferredBlob = { _, _ in
            asked.increment()
            return false
        }
        let c = try DocumentStore.inMemory()
        var eager = ReplicatorConfiguration(direction: .pull)
        eager.maxAttempts = 1
        // C's fetch from B is itself on behalf of another peer: B answers from its store only.
        let r = Replicator(store: c, connector: Link(to: b, options: options, quiet: true).connector, configuration: eager, clock: ImmediateClock())
        await BlobProperty.$fetchingOnBehalf.withValue(true) { await r.run() }
        #expect(asked.current == 0)
        #expect(r.status.error != nil)
        #expect(try c.document(docID("scan")) == nil)
        // Asked directly, B tries; with no peer to fetch from, the error is transient.
        let again = Replicator(store: c, connector: Link(to: b, options: options, quiet: true).connector, configuration: eager, clock: ImmediateClock())
        await again.run()
        #expect(asked.current >= 1)
        #expect(again.status.error?.isTransient == true, "\(String(describing: again.status.error))")
    }
}
