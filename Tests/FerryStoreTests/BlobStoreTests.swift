import FerryCore
import Foundation
import Testing
@testable import FerryStore

@Suite struct BlobStoreTests {
    @Test(arguments: [true, false])
    func blobsRoundTripByDigest(onDisk: Bool) throws {
        let dir = TemporaryDirectory()
        let store = onDisk ? try DocumentStore.open(directory: dir.path) : try DocumentStore.inMemory()
        let content = Array("the quick brown fox".utf8)
        let ref = try store.blobs.put(content, contentType: "text/plain")
        #expect(ref.digest == BlobDigest.of(content))
        #expect(ref.length == Int64(content.count))
        #expect(try store.blobs.get(ref.digest) == content)
        #expect(store.blobs.has(ref.digest))
        #expect(store.blobs.length(ref.digest) == Int64(content.count))
        #expect(try store.blobs.put(content) == BlobReference(digest: ref.digest, length: ref.length))
        #expect(try store.blobs.get(BlobDigest.of([1, 2, 3])) == nil)
    }

    @Test func aFileIsStoredByStreamingIt() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let source = dir.path + "/input.bin"
        var rng = SystemRandomNumberGenerator()
        let content = (0..<(3 << 20)).map { _ in UInt8.random(in: 0...255, using: &rng) }
        FileManager.default.createFile(atPath: source, contents: Data(content))
        let ref = try store.blobs.put(fileAt: source)
        #expect(ref.digest == BlobDigest.of(content))
        #expect(try store.blobs.get(ref.digest) == content)
    }

    @Test func aCorruptBlobFileIsDetectedOnRead() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let ref = try store.blobs.put(Array("original".utf8))
        let path = try #require(store.blobs.path(for: ref.digest))
        FileManager.default.createFile(atPath: path, contents: Data("tampered".utf8))
        #expect(throws: StoreError.blobCorrupt(ref.digest)) { try store.blobs.get(ref.digest) }
    }

    @Test func aDocumentCannotReferToAMissingOrMismeasuredBlob() throws {
        let store = try DocumentStore.inMemory()
        let content = Array("abc".utf8)
        let ref = BlobReference(digest: BlobDigest.of(content), length: 3)
        #expect(throws: StoreError.missingBlob(ref.digest)) {
            try store.put(docID("d"), body: ["file": ref.json])
        }
        _ = try store.blobs.put(content)
        let wrong = BlobReference(digest: ref.digest, length: 4)
        #expect(throws: StoreError.blobLengthMismatch(ref.digest, declared: 4, actual: 3)) {
            try store.put(docID("d"), body: ["file": wrong.json])
        }
        _ = try store.put(docID("d"), body: ["file": ref.json])
        #expect(try store.documentCount == 1)
    }

    @Test func unreferencedBlobsAreCollectedAndReferencedOnesKept() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let kept = try store.blobs.put(Array("kept".utf8))
        let dropped = try store.blobs.put(Array("dropped".utf8))
        let inHistory = try store.blobs.put(Array("old version".utf8))
        let r1 = try store.put(docID("d"), body: ["file": inHistory.json])
        _ = try store.put(docID("d"), body: ["file": kept.json], parent: r1)
        // Too young to collect: a blob stored just before its document must survive.
        #expect(try store.collectBlobs(minimumAge: 3600).count == 0)
        let result = try store.collectBlobs(minimumAge: 0)
        #expect(result.count == 1)
        #expect(result.bytes == dropped.length)
        #expect(store.blobs.has(kept.digest))
        #expect(store.blobs.has(inHistory.digest))  // the retained ancestor body still refers to it
        #expect(!store.blobs.has(dropped.digest))
    }
}
