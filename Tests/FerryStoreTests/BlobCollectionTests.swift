import FerryCore
import Foundation
import Testing
@testable import FerryStore

/// Collection of unreferenced blobs: nothing a stored revision refers to is ever removed
/// (winner, conflicts, tombstoned branches, ancestors kept for deltas, revisions stored
/// while it runs), and what nothing refers to goes once its grace period is over.
@Suite struct BlobCollectionTests {
    /// Sets a blob file's modification time `seconds` into the past, as if stored then.
    static func age(_ store: DocumentStore, _ digest: BlobDigest, by seconds: TimeInterval) throws {
        let path = try #require(store.blobs.path(for: digest))
        try FileManager.default.setAttributes([.modificationDate: Date().addingTimeInterval(-seconds)], ofItemAtPath: path)
    }

    static func blob(_ store: DocumentStore, _ text: String, age seconds: TimeInterval = 7200) throws -> BlobReference {
        let ref = try store.blobs.put(Array(text.utf8))
        try age(store, ref.digest, by: seconds)
        return ref
    }

    @Test func blobsOfConflictsTombstonedBranchesAndRetainedAncestorsSurviveCollection() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let ancestor = try Self.blob(store, "ancestor kept for deltas")
        let winner = try Self.blob(store, "winner")
        let conflict = try Self.blob(store, "conflict")
        let tombstoned = try Self.blob(store, "tombstone keeps its properties")
        let orphan = try Self.blob(store, "nobody refers to me")
        let id = docID("d")
        let r1 = try store.put(id, body: ["f": ancestor.json])
        let r2 = try store.put(id, body: ["f": winner.json], parent: r1)
        // Two replicated branches from r1: a live conflict and a branch later tombstoned.
        for (blob, n) in [(conflict, 1), (tombstoned, 2)] {
            let body: JSON = ["f": blob.json, "n": .int(Int64(n))]
            let rev = RevisionID.compute(parent: r1, deleted: false, canonicalBody: body.canonicalBytes)
            _ = try store.insertRevisions([IncomingRevision(id: id, revision: rev, history: [r1], deleted: false, body: body)])
            if n == 2 { try store.delete(id, revision: rev, keepProperties: true) }
        }
        #expect(try store.revisionTree(id)?.revision(r1)?.body != nil)
        #expect(try store.document(id)?.revision == r2 || (try store.conflicts(of: id)).contains(r2))
        let removed = try store.collectBlobs(minimumAge: 3600)
        #expect(removed.count == 1)
        #expect(removed.bytes == orphan.length)
        for kept in [ancestor, winner, conflict, tombstoned] { #expect(store.blobs.has(kept.digest)) }
        #expect(!store.blobs.has(orphan.digest))
    }

    @Test func aBlobIsKeptThroughItsGracePeriodAndCollectedAfter() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let young = try Self.blob(store, "just uploaded, its revision is on its way", age: 60)
        #expect(try store.collectBlobs(minimumAge: 3600).count == 0)
        #expect(try store.collectBlobs(minimumAge: 3600, now: Date().addingTimeInterval(3600)).count == 1)
        #expect(!store.blobs.has(young.digest))
    }

    @Test func aBlobStoredOrAskedForAgainStartsItsGracePeriodAgain() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        // A peer stores a blob that an old, deleted document left behind, then its revision:
        // the second store must count, or collection could remove it in between.
        let reput = try Self.blob(store, "stored again")
        try store.blobs.put(Array("stored again".utf8))
        // A replicator finds a blob present and so does not fetch it before inserting.
        let asked = try Self.blob(store, "found present")
        #expect(store.blobs.has(asked.digest))
        let old = try Self.blob(store, "left alone")
        let removed = try store.collectBlobs(minimumAge: 3600)
        #expect(removed.count == 1)
        #expect(removed.bytes == old.length)
        #expect(store.blobs.length(reput.digest) != nil)
        #expect(store.blobs.length(asked.digest) != nil)
    }

    @Test func aRevisionStoredWhileCollectionRunsKeepsItsBlob() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let late = try Self.blob(store, "referenced after the scan")
        let removed = try store.collectBlobs(minimumAge: 3600, now: Date()) {
            // Between the scan and the removal a revision that refers to the old blob arrives.
            let body: JSON = ["f": late.json]
            let rev = RevisionID.compute(parent: nil, deleted: false, canonicalBody: body.canonicalBytes)
            let outcomes = try store.insertRevisions([IncomingRevision(id: docID("late"), revision: rev, history: [], deleted: false, body: body)])
            #expect(outcomes == [.inserted(sequence: 1, branched: false)])
        }
        #expect(removed.count == 0)
        #expect(store.blobs.has(late.digest))
        #expect(try store.document(docID("late")) != nil)
    }

    @Test func purgedDocumentsAndCompactedHistoryReleaseTheirBlobs() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.retainedAncestorBodies = 0
        let store = try DocumentStore.open(directory: dir.path, options: options)
        let purged = try Self.blob(store, "of a purged document")
        let replaced = try Self.blob(store, "of an edited-away revision")
        let current = try Self.blob(store, "current")
        try store.put(docID("gone"), body: ["f": purged.json])
        try store.purge(docID("gone"))
        let r1 = try store.put(docID("kept"), body: ["f": replaced.json])
        try store.put(docID("kept"), body: ["f": current.json], parent: r1)
        let removed = try store.collectBlobs(minimumAge: 3600)
        #expect(removed.count == 2)
        #expect(removed.bytes == purged.length + replaced.length)
        #expect(store.blobs.has(current.digest))
    }

    @Test func anAbandonedTemporaryFileIsRemovedAfterADay() throws {
        let dir = TemporaryDirectory()
        let store = try DocumentStore.open(directory: dir.path)
        let tmp = try #require(store.blobs.directory) + "/tmp/abandoned"
        #expect(FileManager.default.createFile(atPath: tmp, contents: Data(count: 100)))
        #expect(try store.collectBlobs(minimumAge: 0).count == 0)
        try FileManager.default.setAttributes([.modificationDate: Date().addingTimeInterval(-90_000)], ofItemAtPath: tmp)
        let removed = try store.collectBlobs(minimumAge: 0)
        #expect(removed.count == 1 && removed.bytes == 100)
        #expect(!FileManager.default.fileExists(atPath: tmp))
    }
}
