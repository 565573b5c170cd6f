import FerryCore
import FerryQuery
import Foundation
import GRDB
import Testing

@testable import FerryStore

/// Mango index entries follow every document write in its transaction, design documents
/// define indexes, the builder fills new ones exactly, and scans read them in key order.
@Suite struct MangoIndexStoreTests {
    // MARK: Definitions and entries

    @Test func entriesFollowLocalPutsUpdatesAndDeletes() throws {
        let store = try DocumentStore.inMemory()
        let id = try defineReady(store, index("by-age", "age"))
        let a = try store.put(docID("a"), body: ["age": 30])
        try store.put(docID("b"), body: ["age": "thirty"])
        try store.put(docID("c"), body: ["name": "no age"])
        try expectExact(store, id)
        #expect(try entryIDs(store, id) == ["a", "b"])
        // An update that changes the key, one that removes the field, a delete.
        let a2 = try store.put(docID("a"), body: ["age": 31], parent: a)
        try expectExact(store, id)
        let a3 = try store.put(docID("a"), body: ["other": true], parent: a2)
        #expect(try entryIDs(store, id) == ["b"])
        let a4 = try store.put(docID("a"), body: ["age": 1], parent: a3)
        #expect(try entryIDs(store, id) == ["a", "b"])
        try store.delete(docID("a"), revision: a4)
        #expect(try entryIDs(store, id) == ["b"])
        try expectExact(store, id)
        // Re-creating a deleted document indexes it again.
        try store.put(docID("a"), body: ["age": 2])
        #expect(try entryIDs(store, id) == ["a", "b"])
        try expectExact(store, id)
    }

    @Test func designDocumentsAreNeverInAnIndexAndIndexFieldsSeeIDAndRevision() throws {
        let store = try DocumentStore.inMemory()
        let byID = try defineReady(store, index("by-id", "_id"))
        let byRev = try defineReady(store, index("by-rev", "_rev"), ddoc: "_design/other")
        let rev = try store.put(docID("x"), body: ["v": 1])
        #expect(try entryIDs(store, byID) == ["x"])
        #expect(try entryIDs(store, byRev) == ["x"])
        let entry = try #require(try entries(store, byRev)["x"])
        #expect(entry == MangoIndex.fieldKey(.string(rev.description), path: try FieldPath(parsing: "_rev")))
        try expectExact(store, byID)
        try expectExact(store, byRev)
    }

    @Test func attachmentsMemberIsNotPartOfTheQueryForm() throws {
        let store = try DocumentStore.inMemory()
        var withAttachments = index("with-att", "tag")
        withAttachments.partialFilter = try MangoSelector(parsing: ["@attachments": ["$exists": true]])
        let id = try defineReady(store, withAttachments)
        let tag = try defineReady(store, index("by-tag", "tag"), ddoc: "_design/t")
        // Stored without blobs: the member is ordinary JSON to the store.
        try store.put(docID("a"), body: ["@attachments": ["f": "x"], "tag": 1])
        #expect(try entryIDs(store, id).isEmpty)
        #expect(try entryIDs(store, tag) == ["a"])
    }

    @Test func partialFilterDecidesMembership() throws {
        let store = try DocumentStore.inMemory()
        var idx = index("adults", "age")
        idx.partialFilter = try MangoSelector(parsing: ["age": ["$gte": 18]])
        let id = try defineReady(store, idx)
        try store.put(docID("kid"), body: ["age": 9])
        let adult = try store.put(docID("adult"), body: ["age": 40])
        #expect(try entryIDs(store, id) == ["adult"])
        try store.put(docID("adult"), body: ["age": 17], parent: adult)
        #expect(try entryIDs(store, id).isEmpty)
        try expectExact(store, id)
    }

    @Test func designDocumentsRegisterAndDropIndexesInTheirTransaction() throws {
        let store = try DocumentStore.inMemory()
        let byAge = index("by-age", "age")
        let rev = try store.put(docID("_design/q", allowReserved: true), body: MangoDesignDocument.adding(byAge, to: nil))
        let listed = try store.mangoIndexes()
        #expect(listed.map(\.index) == [byAge])
        #expect(listed.map(\.state) == [.building(done: 0, total: 1)])
        try buildAll(store)
        #expect(try store.mangoIndexes().map(\.state) == [.ready])
        try store.put(docID("a"), body: ["age": 3])
        let id = listed[0].id
        #expect(try entryIDs(store, id) == ["a"])
        // Deleting the design document drops the index; the builder then removes its entries.
        try store.delete(docID("_design/q", allowReserved: true), revision: rev)
        #expect(try store.mangoIndexes().isEmpty)
        #expect(try store.hasPendingMangoIndexWork())
        #expect(try entryCount(store) == 1)
        try buildAll(store)
        #expect(try entryCount(store) == 0)
        #expect(try indexRowCount(store) == 0)
        #expect(try !store.hasPendingMangoIndexWork())
    }

    @Test func aDesignDocumentOfAnotherLanguageDefinesNoIndex() throws {
        let store = try DocumentStore.inMemory()
        try store.put(
            docID("_design/views", allowReserved: true),
            body: ["language": "javascript", "views": ["v": ["map": "function(doc){}"]]])
        #expect(try store.mangoIndexes().isEmpty)
        #expect(try !store.hasPendingMangoIndexWork())
    }

    @Test func replicatedDesignDocumentsRegisterAndDropIndexes() throws {
        let origin = try DocumentStore.inMemory()
        let replica = try DocumentStore.inMemory()
        let ddoc = docID("_design/q", allowReserved: true)
        let rev = try origin.put(ddoc, body: MangoDesignDocument.adding(index("by-n", "n"), to: nil))
        try replica.put(docID("d"), body: ["n": 5])
        #expect(try replica.insertRevisions([try incoming(origin, ddoc, rev)]).count == 1)
        let listed = try replica.mangoIndexes()
        #expect(listed.map(\.index.name) == ["by-n"])
        try buildAll(replica)
        #expect(try entryIDs(replica, listed[0].id) == ["d"])
        let gone = try origin.delete(ddoc, revision: rev)
        _ = try replica.insertRevisions([try incoming(origin, ddoc, gone)])
        #expect(try replica.mangoIndexes().isEmpty)
        try buildAll(replica)
        #expect(try entryCount(replica) == 0)
    }

    @Test func aChangedDefinitionRebuildsUnderANewNumberAndAnUnchangedOneStays() throws {
        let store = try DocumentStore.inMemory()
        for i in 0..<20 { try store.put(docID("d\(i)"), body: ["a": .int(Int64(i)), "b": .int(Int64(-i))]) }
        let ddoc = docID("_design/q", allowReserved: true)
        let r1 = try store.put(ddoc, body: MangoDesignDocument.adding(index("i", "a", ddoc: ddoc.rawValue), to: nil))
        try buildAll(store)
        let first = try #require(try store.mangoIndexes().first)
        // Rewriting the design document with the same definition keeps the index as it is.
        var same = MangoDesignDocument.adding(index("i", "a", ddoc: ddoc.rawValue), to: nil)
        same = MangoDesignDocument.adding(index("j", "b", ddoc: ddoc.rawValue), to: same)
        let r2 = try store.put(ddoc, body: same, parent: r1)
        let afterAdd = try store.mangoIndexes()
        #expect(afterAdd.map(\.index.name) == ["i", "j"])
        #expect(afterAdd[0].id == first.id && afterAdd[0].state == .ready)
        #expect(afterAdd[1].state == .building(done: 0, total: 21))
        try buildAll(store)
        // A changed definition under the same name is a new index.
        let changed = MangoDesignDocument.adding(index("i", "b", ddoc: ddoc.rawValue), to: same)
        try store.put(ddoc, body: changed, parent: r2)
        let afterChange = try store.mangoIndexes()
        #expect(afterChange[0].index.fields.map(\.path.description) == ["b"])
        #expect(afterChange[0].id != first.id)
        #expect(afterChange[0].state != .ready)
        #expect(afterChange[1].id == afterAdd[1].id)
        #expect(throws: StoreError.self) {
            try store.scan(.index(id: first.id), range: .all, descending: false, after: nil, limit: 10)
        }
        try buildAll(store)
        try expectExact(store, afterChange[0].id)
        try expectExact(store, afterChange[1].id)
        #expect(try entryCount(store, index: first.id) == 0)
    }

    // MARK: Conflicts and purge

    @Test func aConflictedDocumentIsIndexedByItsWinnerAndResolvingReindexes() throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let id = try defineReady(a, index("by-v", "v"))
        let base = try a.put(docID("d"), body: ["v": 0])
        _ = try b.insertRevisions([try incoming(a, docID("d"), base)])
        _ = try a.put(docID("d"), body: ["v": "a"], parent: base)
        let rb = try b.put(docID("d"), body: ["v": "b"], parent: base)
        _ = try a.insertRevisions([try incoming(b, docID("d"), rb)])
        let doc = try #require(try a.document(docID("d")))
        #expect(doc.conflicts.count == 1)
        #expect(try entries(a, id)["d"] == CouchCollation.sortKey(doc.body["v"]!))
        try expectExact(a, id)
        // Tombstoning the winner makes the other leaf the winner: its body is indexed.
        try a.delete(docID("d"), revision: doc.revision)
        let resolved = try #require(try a.document(docID("d")))
        #expect(resolved.revision == doc.conflicts[0])
        #expect(try entries(a, id)["d"] == CouchCollation.sortKey(resolved.body["v"]!))
        try expectExact(a, id)
    }

    @Test func purgeRemovesTheDocumentsEntries() throws {
        let store = try DocumentStore.inMemory()
        let id = try defineReady(store, index("by-v", "v"))
        try store.put(docID("a"), body: ["v": 1])
        try store.put(docID("b"), body: ["v": 2])
        #expect(try store.purge(docID("a")))
        #expect(try entryIDs(store, id) == ["b"])
        #expect(try !store.purge(docID("a")))
        try expectExact(store, id)
    }

    @Test func purgingADesignDocumentDropsItsIndexes() throws {
        let store = try DocumentStore.inMemory()
        _ = try defineReady(store, index("by-v", "v"))
        try store.put(docID("a"), body: ["v": 1])
        #expect(try store.purge(docID("_design/q", allowReserved: true)))
        #expect(try store.mangoIndexes().isEmpty)
        try buildAll(store)
        #expect(try entryCount(store) == 0)
    }

    // MARK: Building

    @Test func theBuilderReachesReadyWithExactEntriesWhileWritesInterleave() throws {
        let store = try DocumentStore.inMemory()
        var revs: [String: RevisionID] = [:]
        for i in 0..<250 {
            let body: JSON = i % 7 == 0 ? ["other": .int(Int64(i))] : ["v": .int(Int64(i % 13)), "s": .string("s\(i % 5)")]
            revs["d\(i)"] = try store.put(docID("d\(i)"), body: body)
        }
        try store.put(docID("_design/q", allowReserved: true), body: MangoDesignDocument.adding(index("vs", "v", "s"), to: nil))
        let id = try #require(try store.mangoIndexes().first?.id)
        var generator = SeededGenerator(seed: 7)
        var steps = 0
        var lastDone = 0
        while true {
            let step = try store.buildMangoIndexes(maxDocuments: 40)
            steps += 1
            if let building = step.building.first, case .building(let done, let total) = building.state {
                #expect(done > lastDone && done <= total)
                lastDone = done
            }
            if step.work == 0 { break }
            // Writes between steps: updates on both sides of the cursor, deletes, new documents.
            for _ in 0..<15 {
                let n = Int.random(in: 0..<300, using: &generator)
                let name = "d\(n)"
                switch Int.random(in: 0..<4, using: &generator) {
                case 0:
                    if let rev = revs[name] {
                        try store.delete(docID(name), revision: rev)
                        revs[name] = nil
                    }
                default:
                    let body: JSON = ["v": .int(Int64.random(in: 0..<9, using: &generator)), "s": "w"]
                    revs[name] = try store.put(docID(name), body: body, parent: revs[name])
                }
            }
        }
        #expect(steps >= 7)
        #expect(try store.mangoIndexes().first?.state == .ready)
        try expectExact(store, id)
    }

    @Test func aRolledBackTransactionLeavesNoEntriesAndNoIndex() throws {
        struct Abort: Error {}
        let store = try DocumentStore.inMemory()
        let id = try defineReady(store, index("by-v", "v"))
        #expect(throws: StoreError.self) {
            try store.write { txn in
                try txn.put(docID("a"), body: ["v": 1])
                try txn.put(docID("_design/other", allowReserved: true), body: MangoDesignDocument.adding(index("w", "w", ddoc: "_design/other"), to: nil))
                try txn.put(docID("b"), body: ["w": 1])
                throw Abort()
            }
        }
        #expect(try entryCount(store) == 0)
        #expect(try store.mangoIndexes().map(\.id) == [id])
        // The next transaction sees the committed definitions only.
        try store.put(docID("b"), body: ["w": 1, "v": 2])
        #expect(try entryIDs(store, id) == ["b"])
        #expect(try entryCount(store) == 1)
    }

    @Test func aFailedIndexUpdateRollsBackAReplicatedBatchThatWentOn() throws {
        let origin = try DocumentStore.inMemory()
        let rev = try origin.put(docID("a"), body: ["v": 1])
        let store = try DocumentStore.inMemory()
        _ = try defineReady(store, index("by-v", "v"))
        try store.write { txn in try txn.db.execute(sql: "UPDATE mango_indexes SET definition = x'7b'") }
        // insertExisting reports a failed revision and goes on; the commit must not.
        #expect(throws: StoreError.self) { try store.insertRevisions([try incoming(origin, docID("a"), rev)]) }
        #expect(try store.document(docID("a")) == nil)
        #expect(try entryCount(store) == 0)
    }

    @Test func withoutIndexesWritesTouchNoEntries() throws {
        let store = try DocumentStore.inMemory()
        for i in 0..<50 { try store.put(docID("d\(i)"), body: ["v": .int(Int64(i))]) }
        #expect(try entryCount(store) == 0)
        #expect(try !store.hasPendingMangoIndexWork())
        #expect(try store.buildMangoIndexes().work == 0)
    }

    @Test func anIndexOfAnOlderKeyLayoutIsRebuilt() throws {
        let store = try DocumentStore.inMemory()
        try store.put(docID("a"), body: ["v": 1])
        let old = try defineReady(store, index("by-v", "v"))
        try store.write { txn in
            try txn.db.execute(sql: "UPDATE mango_indexes SET key_version = 0")
        }
        // Listed as building (the design document and "a" are its two rows) until rebuilt.
        #expect(try store.mangoIndexes().map(\.state) == [.building(done: 0, total: 2)])
        #expect(throws: StoreError.self) { try store.scan(.index(id: old), range: .all, descending: false, after: nil, limit: 5) }
        try buildAll(store)
        let rebuilt = try #require(try store.mangoIndexes().first)
        #expect(rebuilt.id != old && rebuilt.state == .ready)
        try expectExact(store, rebuilt.id)
        #expect(try entryCount(store, index: old) == 0)
    }

    // MARK: Scans

    @Test func scansHonourRangesDirectionAndResumeWithoutGapsOrDuplicates() throws {
        let store = try DocumentStore.inMemory()
        let id = try defineReady(store, index("by-n", "n"))
        var generator = SeededGenerator(seed: 3)
        let values: [JSON] = [.null, false, true, 0, 1, 2.5, "a", "B", "b", ["x"], ["k": 1]]
        for i in 0..<80 {
            try store.put(docID(String(format: "doc%03d", (i * 37) % 80)), body: ["n": values.randomElement(using: &generator)!])
        }
        let all = try entries(store, id).map { (key: $0.value, id: $0.key) }
            .sorted { $0.key != $1.key ? $0.key.lexicographicallyPrecedes($1.key) : $0.id < $1.id }
        let one = CouchCollation.sortKey(1)
        let b = CouchCollation.sortKey("b")
        let ranges: [KeyRange] = [
            .all, KeyRange(lower: one), KeyRange(lower: one, lowerInclusive: false, upper: b, upperInclusive: false),
            KeyRange(upper: b), KeyRange(lower: b, upper: one),
        ]
        for range in ranges {
            for descending in [false, true] {
                var expected = all.filter { range.contains($0.key) }
                if descending { expected.reverse() }
                for pageSize in [1, 7, 100] {
                    var got: [(key: [UInt8], id: String)] = []
                    var after: ScanPosition?
                    while true {
                        let page = try store.scan(.index(id: id), range: range, descending: descending, after: after, limit: pageSize)
                        #expect(page.count <= pageSize)
                        got += page.map { ($0.position.key, $0.id.rawValue) }
                        guard page.count == pageSize, let last = page.last else { break }
                        after = last.position
                    }
                    #expect(got.map(\.id) == expected.map(\.id), "range \(range) descending \(descending) page \(pageSize)")
                    #expect(got.map(\.key) == expected.map(\.key))
                }
            }
        }
        // What a scan returns is the stored winner.
        let first = try #require(try store.scan(.index(id: id), range: .all, descending: false, after: nil, limit: 1).first)
        let doc = try #require(try store.document(first.id))
        #expect(first.revision == doc.revision)
        #expect(try JSON.parse(first.body) == doc.body)
        #expect(!first.conflicted)
    }

    @Test func scanningAnUnknownOrUnbuiltIndexThrows() throws {
        let store = try DocumentStore.inMemory()
        #expect(throws: StoreError.indexUnavailable(id: 99, reason: "no such index (it may have been deleted)")) {
            try store.scan(.index(id: 99), range: .all, descending: false, after: nil, limit: 5)
        }
        try store.put(docID("_design/q", allowReserved: true), body: MangoDesignDocument.adding(index("i", "v"), to: nil))
        let id = try #require(try store.mangoIndexes().first?.id)
        #expect(throws: StoreError.indexUnavailable(id: id, reason: "it is still being built")) {
            try store.scan(.index(id: id), range: .all, descending: false, after: nil, limit: 5)
        }
        try buildAll(store)
        #expect(try store.scan(.index(id: id), range: .all, descending: false, after: nil, limit: 5).isEmpty)
    }

    @Test func aReadOnlyStoreAnswersIndexScans() throws {
        let dir = TemporaryDirectory()
        let id: Int64
        do {
            let store = try DocumentStore.open(directory: dir.path)
            id = try defineReady(store, index("by-v", "v"))
            try store.put(docID("a"), body: ["v": 2])
            try store.put(docID("b"), body: ["v": 1])
            try store.flushToDisk()
        }
        let readOnly = try DocumentStore(
            path: dir.path + "/" + DocumentStore.databaseFileName, blobs: BlobStore(existingDirectory: dir.path + "/blobs"),
            options: StoreOptions(), readOnly: true)
        #expect(try readOnly.mangoIndexes().map(\.state) == [.ready])
        let found = try readOnly.scan(.index(id: id), range: .all, descending: false, after: nil, limit: 10)
        #expect(found.map(\.id.rawValue) == ["b", "a"])
    }

    @Test func theIndexScanReadsTheKeyIndexInOrder() throws {
        let store = try DocumentStore.inMemory()
        for descending in [false, true] {
            let sql = DocumentStore.indexScanSQL(lower: true, upper: false, after: true, descending: descending)
            let plan = try store.read { db in
                try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql, arguments: [1, Data([1]), Data([9]), Data([2]), "x", 20])
                    .map { $0["detail"] as String }
            }
            #expect(plan.contains { $0.contains("mango_entries_by_key") }, "\(plan)")
            #expect(!plan.contains { $0.contains("TEMP B-TREE") }, "\(plan)")
        }
    }
}

// MARK: Helpers

private func docID(_ s: String, allowReserved: Bool) -> DocumentID { try! DocumentID(s, allowReserved: allowReserved) }

private func index(_ name: String, _ fields: String..., ddoc: String = "_design/q") -> MangoIndex {
    MangoIndex(designDocument: ddoc, name: name, fields: fields.map { MangoIndex.Field(path: try! FieldPath(parsing: $0)) })
}

/// Adds `index` to design document `ddoc` and builds it; returns its number.
private func defineReady(_ store: DocumentStore, _ index: MangoIndex, ddoc: String = "_design/q") throws -> Int64 {
    var index = index
    index.designDocument = ddoc
    let id = docID(ddoc, allowReserved: true)
    let current = try store.document(id)
    let live = current.flatMap { $0.deleted ? nil : $0 }
    try store.put(id, body: MangoDesignDocument.adding(index, to: live?.body), parent: live?.revision ?? current?.revision)
    try buildAll(store)
    let stored = try #require(try store.mangoIndexes().first { $0.index.designDocument == ddoc && $0.index.name == index.name })
    #expect(stored.state == .ready)
    return stored.id
}

private func buildAll(_ store: DocumentStore) throws {
    var steps = 0
    while try store.buildMangoIndexes(maxDocuments: 100).work > 0 {
        steps += 1
        if steps > 10_000 { Issue.record("index building never ends"); return }
    }
}

/// The entries of index `id`: document ID to key.
private func entries(_ store: DocumentStore, _ id: Int64) throws -> [String: [UInt8]] {
    try store.read { db in
        var out: [String: [UInt8]] = [:]
        for row in try Row.fetchAll(db, sql: "SELECT doc_id, key FROM mango_entries WHERE index_id = ?", arguments: [id]) {
            out[row["doc_id"]] = [UInt8](row["key"] as Data)
        }
        return out
    }
}

private func entryIDs(_ store: DocumentStore, _ id: Int64) throws -> [String] { try entries(store, id).keys.sorted() }

private func entryCount(_ store: DocumentStore, index: Int64? = nil) throws -> Int {
    try store.read { db in
        if let index {
            return try Int.fetchOne(db, sql: "SELECT count(*) FROM mango_entries WHERE index_id = ?", arguments: [index])!
        }
        return try Int.fetchOne(db, sql: "SELECT count(*) FROM mango_entries")!
    }
}

private func indexRowCount(_ store: DocumentStore) throws -> Int {
    try store.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM mango_indexes")! }
}

/// Checks index `id`'s entries against a computation from scratch over every live document.
private func expectExact(_ store: DocumentStore, _ id: Int64, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let definition = try #require(try store.mangoIndexes().first { $0.id == id }).index
    var expected: [String: [UInt8]] = [:]
    for (docID, _, _) in try store.allDocuments() where !docID.rawValue.hasPrefix("_design/") {
        let doc = try #require(try store.document(docID))
        guard case .object(var members) = doc.body else { continue }
        members.removeValue(forKey: "@attachments")
        members["_id"] = .string(docID.rawValue)
        members["_rev"] = .string(doc.revision.description)
        if let key = definition.key(for: .object(members)) { expected[docID.rawValue] = key }
    }
    #expect(try entries(store, id) == expected, sourceLocation: sourceLocation)
}

/// A small deterministic generator (SplitMix64), so a failing run can be repeated.
private struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
