import FerryCore
import FerryStore
import Testing

@Suite struct CouchStoreTests {
    @Test func changeEntriesReadEitherDirectionWithTreesAndCounts() throws {
        let store = try DocumentStore.inMemory()
        let a = try store.put(docID("a"), body: ["n": 1])
        try store.put(docID("b"), body: ["n": 2])
        try store.put(docID("a"), body: ["n": 3], parent: a)
        let up = try store.changeEntries(after: 0, limit: 10)
        #expect(up.map(\.change.id.rawValue) == ["b", "a"])
        #expect(try up[1].currentDocument().body == ["n": 3])
        #expect(up[1].tree.revisions.count == 2)
        let down = try store.changeEntries(before: nil, descending: true, limit: 10)
        #expect(down.map(\.change.sequence) == [3, 2])
        #expect(try store.changeEntries(before: 3, descending: true, limit: 10).map(\.change.sequence) == [2])
        #expect(try store.changeCount(after: 2) == 1)
        #expect(try store.changeCount(before: 3) == 1)
    }

    @Test func documentEntriesWalkARangeInRawByteOrder() throws {
        let store = try DocumentStore.inMemory()
        for id in ["b", "a", "é", "B"] { try store.put(docID(id), body: [:]) }
        let gone = try store.put(docID("c"), body: [:])
        try store.delete(docID("c"), revision: gone)
        func ids(_ r: DocumentIDRange, deleted: Bool = false, limit: Int = 10) throws -> [String] {
            try store.documentEntries(in: r, includeDeleted: deleted, limit: limit).map(\.change.id.rawValue)
        }
        #expect(try ids(DocumentIDRange()) == ["B", "a", "b", "é"])
        #expect(try ids(DocumentIDRange(), deleted: true) == ["B", "a", "b", "c", "é"])
        #expect(try ids(DocumentIDRange(start: "a", startInclusive: false, end: "é", endInclusive: false)) == ["b"])
        #expect(try ids(DocumentIDRange(start: "b", end: "B", descending: true)) == ["b", "a", "B"])
        #expect(try ids(DocumentIDRange(descending: true), limit: 2) == ["é", "b"])
        #expect(try store.liveDocumentCount(before: "b") == 2)
        #expect(try store.liveDocumentCount(before: "b", descending: true) == 1)
        #expect(try store.documentEntries(ids: [docID("a"), docID("zz")]).keys.map(\.rawValue) == ["a"])
    }

    @Test func replaceLocalDocumentSwapsOnlyTheExpectedVersion() throws {
        let store = try DocumentStore.inMemory()
        #expect(try store.replaceLocalDocument("k", expected: nil, with: ["v": 1]))
        #expect(try !store.replaceLocalDocument("k", expected: nil, with: ["v": 2]))
        #expect(try !store.replaceLocalDocument("k", expected: ["v": 0], with: ["v": 2]))
        #expect(try store.localDocument("k") == ["v": 1])
        #expect(try store.replaceLocalDocument("k", expected: ["v": 1], with: nil))
        #expect(try store.localDocument("k") == nil)
        #expect(throws: StoreError.self) { try store.replaceLocalDocument("", expected: nil, with: [:]) }
    }

    @Test func flushToDiskKeepsEveryCommit() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .normal
        do {
            let store = try DocumentStore.open(directory: dir.path, options: options)
            try store.put(docID("a"), body: ["n": 1])
            try store.flushToDisk()
        }
        #expect(try DocumentStore.open(directory: dir.path).document(docID("a"))?.body == ["n": 1])
    }
}
