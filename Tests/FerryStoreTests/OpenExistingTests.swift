import FerryCore
import Foundation
import Testing

@testable import FerryStore

/// Opening a store for reading creates nothing, and deleting what is not there is "not found".
@Suite struct OpenExistingTests {
    @Test func openExistingOnADirectoryWithoutADatabaseFailsAndCreatesNothing() throws {
        let dir = TemporaryDirectory()
        let missing = dir.path + "/deep/dir"
        #expect(throws: StoreError.noDatabase(directory: missing)) { try DocumentStore.openExisting(directory: missing) }
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/deep"))
        #expect(throws: StoreError.noDatabase(directory: dir.path)) { try DocumentStore.openExisting(directory: dir.path) }
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path).isEmpty)
    }

    @Test func openExistingReadsWhatOpenWrote() throws {
        let dir = TemporaryDirectory()
        let written = try DocumentStore.open(directory: dir.path)
        try written.put(docID("a"), body: ["v": 1])
        let read = try DocumentStore.openExisting(directory: dir.path)
        #expect(try read.document(docID("a"))?.body == ["v": 1])
        #expect(read.uuid == written.uuid)
    }

    @Test func deletingAMissingDocumentIsNotFoundNotAConflict() throws {
        let store = try DocumentStore.inMemory()
        let rev = try RevisionID("1-" + String(repeating: "a", count: 64))
        #expect(throws: StoreError.notFound(docID("missing"))) { try store.delete(docID("missing"), revision: rev) }
    }
}
