import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// Blobs larger than a chunk: moved in bounded chunks, resumed after a cut, verified at the end.
@Suite(.timeLimit(.minutes(5))) struct BlobChunkTests {
    static func randomBytes(_ count: Int, seed: UInt64) -> [UInt8] {
        var rng = SeededGenerator(seed: seed)
        return (0..<count).map { _ in UInt8.random(in: 0...255, using: &rng) }
    }

    /// A store holding one document that refers to a blob of `count` random bytes.
    static func storeWithBlob(_ count: Int) throws -> (DocumentStore, BlobReference, [UInt8]) {
        let store = try DocumentStore.inMemory()
        let content = randomBytes(count, seed: UInt64(count))
        let ref = try store.blobs.put(content)
        try store.put(docID("scan"), body: ["file": ref.json])
        return (store, ref, content)
    }

    /// The largest message one side sent, and whether it decoded as a getBlob or putBlob.
    final class Largest: Sendable {
        let bytes = Locked(0)
        func record(_ m: [UInt8]) -> [[UInt8]] {
            bytes.withLock { $0 = max($0, m.count) }
            return [m]
        }
    }

    @Test func aBlobLargerThanAChunkMovesInBoundedChunksBothWays() async throws {
        let (a, ref, content) = try Self.storeWithBlob(3 * SyncProtocol.blobChunkSize + 1234)
        // Pull: the responder's replies are the chunks.
        let b = try DocumentStore.inMemory()
        var link = Link(to: a)
        let served = Largest()
        link.faults = { _ in (.init(), .init(deliver: { served.record($0) })) }
        let pull = Replicator(store: b, connector: link.connector, configuration: .init(direction: .pull), clock: ImmediateClock())
        await pull.run()
        #expect(pull.status.error == nil)
        #expect(try b.blobs.get(ref.digest) == content)
        #expect(try b.document(docID("scan")) != nil)
        #expect(served.bytes.withLock { $0 } < SyncProtocol.blobChunkSize + 1024)
        #expect(pull.summary.blobsReceived == 1)
        #expect(pull.summary.blobBytesReceived == Int64(content.count))
        #expect(pull.summary.blobBytesToReceive == Int64(content.count))
        // Push: the requests are the chunks.
        let c = try DocumentStore.inMemory()
        var pushLink = Link(to: c)
        let sent = Largest()
        pushLink.faults = { _ in (.init(deliver: { sent.record($0) }), .init()) }
        let push = Replicator(store: a, connector: pushLink.connector, configuration: .init(direction: .push), clock: ImmediateClock())
        await push.run()
        #expect(push.status.error == nil)
        #expect(try c.blobs.get(ref.digest) == content)
        #expect(try c.document(docID("scan")) != nil)
        #expect(sent.bytes.withLock { $0 } < SyncProtocol.blobChunkSize + 1024)
        #expect(push.summary.blobBytesSent == Int64(content.count))
    }

    @Test func anEmptyBlobAndAOneByteBlobMoveInChunks() async throws {
        let a = try DocumentStore.inMemory()
        let empty = try a.blobs.put([])
        let one = try a.blobs.put([42])
        try a.put(docID("e"), body: ["f": empty.json, "g": one.json])
        let b = try DocumentStore.inMemory()
        let push = await sync(a, b, direction: .push)
        #expect(push.status.error == nil)
        #expect(try b.blobs.get(empty.digest) == [])
        #expect(try b.blobs.get(one.digest) == [42])
        let c = try DocumentStore.inMemory()
        let pull = await sync(c, a, direction: .pull)
        #expect(pull.status.error == nil)
        #expect(try c.document(docID("e")) != nil)
    }

    @Test func aLivePushSendsLaterDocumentsWhileABlobIsStillOnItsWay() async throws {
        let (a, ref, _) = try Self.storeWithBlob(8 * SyncProtocol.blobChunkSize)
        let b = try DocumentStore.inMemory()
        // The blob's chunks are held back (dropped) until `release`: its document cannot arrive.
        let held = Locked(true)
        let chunksHeld = Counter()
        var link = Link(to: b)
        link.faults = { _ in
            (.init(deliver: { m in
                guard m.count > SyncProtocol.blobChunkSize, held.withLock({ $0 }) else { return [m] }
                _ = chunksHeld.increment()
                return []
            }), .init())
        }
        var config = ReplicatorConfiguration(direction: .push)
        config.continuous = true
        let r = Replicator(store: a, connector: link.connector, configuration: config)
        r.start()
        try await waitUntil("the blob's first chunk was sent") { chunksHeld.current > 0 }
        try a.put(docID("note"), body: ["text": "written while the blob is on its way"])
        try await waitUntil("the later document arrived") { try b.document(docID("note")) != nil }
        #expect(try b.document(docID("scan")) == nil)
        #expect(b.blobs.state(ref.digest) != .present(length: ref.length))
        r.stop()
        await r.waitUntilStopped()
    }

    @Test(arguments: [ReplicatorConfiguration.Direction.pull, .push])
    func aTransferCutHalfWayResumesFromWhatArrived(direction: ReplicatorConfiguration.Direction) async throws {
        let total = 24 * SyncProtocol.blobChunkSize
        let (a, ref, content) = try Self.storeWithBlob(total)
        let b = try DocumentStore.inMemory()
        // The first connection breaks once half the blob's chunks went out.
        let chunksSent = Counter()
        let cut = Locked(false)
        var options = ReplicationResponder.Options()
        options.liveness.deadAfter = .milliseconds(300)
        options.liveness.interval = .milliseconds(100)
        var link = Link(to: direction == .pull ? a : b, options: options)
        let halfway: InMemoryEndpoint.Faults = .init(deliver: { m in
            if m.count > SyncProtocol.blobChunkSize, chunksSent.increment() == 12 { cut.withLock { $0 = true } }
            return cut.withLock { $0 } ? [] : [m]
        })
        link.faults = { attempt in
            guard attempt == 1 else { return (.init(), .init()) }
            return direction == .pull ? (.init(), halfway) : (halfway, .init())
        }
        var config = ReplicatorConfiguration(direction: direction)
        config.wiring.liveness.deadAfter = .milliseconds(300)
        config.wiring.liveness.interval = .milliseconds(100)
        // The dropped link goes silent: the heartbeat watchdog ends it and the replicator retries.
        let r = Replicator(store: direction == .pull ? b : a, connector: link.connector, configuration: config, clock: ContinuousClock())
        await r.run()
        #expect(r.status.error == nil)
        #expect(link.attempts.current >= 2)
        let receiver = b
        #expect(try receiver.blobs.get(ref.digest) == content)
        #expect(try receiver.document(docID("scan")) != nil)
        let moved = direction == .pull ? r.summary.blobBytesReceived : r.summary.blobBytesSent
        // Resumed: far less than twice the blob crossed (at most the window was in flight at the cut).
        #expect(moved <= Int64(total) + Int64(2 * SyncProtocol.blobChunkWindow * SyncProtocol.blobChunkSize))
        #expect(moved >= Int64(total))
    }

    @Test func aCorruptedChunkIsDetectedAndTheBlobFetchedAgain() async throws {
        let (a, ref, content) = try Self.storeWithBlob(5 * SyncProtocol.blobChunkSize)
        let b = try DocumentStore.inMemory()
        var link = Link(to: a)
        let flipped = Locked(false)
        link.faults = { _ in
            (.init(), .init(deliver: { m in
                guard m.count > SyncProtocol.blobChunkSize, !flipped.withLock({ $0 }) else { return [m] }
                flipped.withLock { $0 = true }
                var bad = m
                bad[bad.count - 100] ^= 0x01
                return [bad]
            }))
        }
        let r = Replicator(store: b, connector: link.connector, configuration: .init(direction: .pull), clock: ImmediateClock())
        await r.run()
        #expect(flipped.withLock { $0 })
        #expect(r.status.error == nil)
        #expect(try b.blobs.get(ref.digest) == content)
        #expect(try b.document(docID("scan")) != nil)
        #expect(r.summary.blobBytesReceived == 2 * Int64(content.count))
    }
}

extension ReplicatorConfiguration {
    init(direction: Direction) {
        self.init()
        self.direction = direction
    }
}
