import FerryCore
import Foundation
import Testing
@testable import FerryStore

/// Partial blobs: resumed at their recorded length, checked at the end, finished or removed by tidying.
@Suite struct IncomingBlobTests {
    static func content(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) } }

    @Test(arguments: [true, false])
    func aSuspendedBlobResumesWhereItStopped(onDisk: Bool) throws {
        let dir = TemporaryDirectory()
        let store = onDisk ? try DocumentStore.open(directory: dir.path) : try DocumentStore.inMemory()
        let bytes = Self.content(300_000)
        let digest = BlobDigest.of(bytes)
        let first = try #require(try store.blobs.receive(digest, total: Int64(bytes.count)))
        // One receiver per digest at a time.
        #expect(try store.blobs.receive(digest, total: Int64(bytes.count)) == nil)
        try first.append(bytes[0..<100_000])
        first.suspend()
        #expect(store.blobs.partialLength(digest) == 100_000)
        let second = try #require(try store.blobs.receive(digest, total: Int64(bytes.count)))
        #expect(second.length == 100_000)
        try second.append(bytes[100_000...])
        try second.complete()
        #expect(try store.blobs.get(digest) == bytes)
        #expect(store.blobs.partialLength(digest) == 0)
    }

    @Test func bytesPastTheRecordedLengthAreCutOffAfterACrash() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let bytes = Self.content(200_000)
        let digest = BlobDigest.of(bytes)
        let incoming = try #require(try store.blobs.receive(digest, total: Int64(bytes.count)))
        try incoming.append(bytes[0..<50_000])
        try incoming.checkpoint()
        // Written but never made durable, then the process dies: the tail may be torn.
        try incoming.append(Array(repeating: 0xEE, count: 30_000))
        store.blobs.releaseIncoming(digest)
        let resumed = try #require(try store.blobs.receive(digest, total: Int64(bytes.count)))
        #expect(resumed.length == 50_000)
        try resumed.append(bytes[50_000...])
        try resumed.complete()
        #expect(try store.blobs.get(digest) == bytes)
    }

    @Test func contentThatDoesNotMatchTheDigestIsDiscardedNotStored() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let bytes = Self.content(10_000)
        let digest = BlobDigest.of(bytes)
        let incoming = try #require(try store.blobs.receive(digest, total: Int64(bytes.count)))
        var bad = bytes
        bad[5_000] ^= 1
        try incoming.append(bad)
        #expect(throws: StoreError.blobCorrupt(digest)) { try incoming.complete() }
        #expect(!store.blobs.has(digest))
        #expect(store.blobs.partialLength(digest) == 0)
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/blobs/partial/\(digest.hex)"))
        // Nothing past the declared length is taken.
        let again = try #require(try store.blobs.receive(digest, total: Int64(bytes.count)))
        #expect(throws: StoreError.self) { try again.append(Self.content(10_001)) }
        again.discard()
    }

    @Test func aCompletePartialLeftByACrashBeforeTheMoveIsFinishedWhenTidied() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let bytes = Self.content(70_000)
        let digest = BlobDigest.of(bytes)
        let incoming = try #require(try store.blobs.receive(digest, total: Int64(bytes.count)))
        try incoming.append(bytes)
        try incoming.checkpoint()
        store.blobs.releaseIncoming(digest)  // the crash: complete() never ran
        #expect(!store.blobs.has(digest))
        let reopened = try DocumentStore.open(directory: dir.path)
        reopened.blobs.tidyPartials(removingUnwrittenSince: .distantPast)
        #expect(try reopened.blobs.get(digest) == bytes)
    }

    @Test func tidyingRemovesOnlyPartialsUnwrittenSinceTheCutoff() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let old = Self.content(1000)
        let fresh = Self.content(2000)
        for bytes in [old, fresh] {
            let incoming = try #require(try store.blobs.receive(BlobDigest.of(bytes), total: Int64(bytes.count)))
            try incoming.append(bytes[0..<500])
            incoming.suspend()
        }
        let oldPath = dir.path + "/blobs/partial/\(BlobDigest.of(old).hex)"
        try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSinceNow: -7200)], ofItemAtPath: oldPath)
        let removed = store.blobs.tidyPartials(removingUnwrittenSince: Date(timeIntervalSinceNow: -3600))
        #expect(removed.count == 1)
        #expect(removed.bytes == 500)
        #expect(store.blobs.partialLength(BlobDigest.of(old)) == 0)
        #expect(store.blobs.partialLength(BlobDigest.of(fresh)) == 500)
    }

    @Test func aReaderServesRangesWithoutLoadingTheBlob() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let bytes = Self.content(100_000)
        let ref = try store.blobs.put(bytes)
        let reader = try #require(try store.blobs.reader(ref.digest))
        #expect(reader.length == 100_000)
        #expect(try reader.read(offset: 99_990, count: 100) == Array(bytes[99_990...]))
        #expect(try reader.read(offset: 100_000, count: 10) == [])
        #expect(try reader.read(offset: 10, count: 5) == Array(bytes[10..<15]))
        #expect(try store.blobs.reader(BlobDigest.of([1])) == nil)
    }
}
