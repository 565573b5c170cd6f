import FerryCore
import FerryCouch
import FerryQuery
import FerryStore
import Testing

/// `_find` plans with the index list the store keeps between queries: a change committed
/// here is seen by the next query, and an index another process dropped is planned around.
@Suite struct FindIndexListTests {
    static let byN = MangoIndex(designDocument: "_design/q", name: "by-n", fields: [.init(path: try! FieldPath(parsing: "n"))])

    func fixture() throws -> DatabaseFixture {
        let f = try DatabaseFixture()
        for i in 0..<40 { try f.put(String(format: "doc%02d", i), ["n": .int(Int64(i % 10))]) }
        return f
    }

    func addIndex(_ store: DocumentStore) throws {
        try store.put(try DocumentID("_design/q", allowReserved: true), body: MangoDesignDocument.adding(Self.byN, to: nil))
        while try store.buildMangoIndexes().work > 0 {}
    }

    func query() throws -> MangoQuery { try MangoQuery(parsing: ["selector": ["n": 3], "limit": 100]) }

    func ids(_ result: MangoFindResult) -> [String] { result.docs.compactMap { $0["_id"]?.stringValue } }

    @Test func anIndexMadeReadyHereIsUsedByTheNextFind() throws {
        let f = try fixture()
        let before = try f.database.find(try query(), principal: .admin)
        #expect(before.warnings == [QueryPlanner.noIndexWarning])
        try addIndex(f.store)
        let after = try f.database.find(try query(), principal: .admin)
        #expect(after.warnings.isEmpty, "the index built in this store's transactions is planned with at once")
        #expect(ids(after) == ids(before))
        #expect(ids(after) == ["doc03", "doc13", "doc23", "doc33"])
    }

    @Test func anIndexAnotherStoreDroppedIsPlannedAroundNotAnError() throws {
        let f = try fixture()
        try addIndex(f.store)
        let indexed = try f.database.find(try query(), principal: .admin)
        #expect(indexed.warnings.isEmpty)
        // Another process on the same database deletes the index and drops its entries; this
        // store's kept list still names it.
        let other = try f.reopened()
        let ddoc = try DocumentID("_design/q", allowReserved: true)
        let current = try #require(try other.store.document(ddoc))
        try other.store.delete(ddoc, revision: current.revision)
        while try other.store.buildMangoIndexes().work > 0 {}
        #expect(try other.store.mangoIndexes().isEmpty)

        let after = try f.database.find(try query(), principal: .admin)
        #expect(after.warnings == [QueryPlanner.noIndexWarning])
        #expect(ids(after) == ids(indexed))
    }
}
