import FerryCore
import FerryQuery
import Foundation
import Testing
@testable import FerryStore

/// Documents with many replicated leaves: a batch is stored exactly (each revision its own
/// sequence, one row per document), mixes with local edits in one transaction, and the
/// leaf limit refuses what would widen a document past it.
@Suite struct WideDocumentStoreTests {
    static let rootBody: JSON = ["root": true]
    static let root = RevisionID.compute(parent: nil, deleted: false, canonicalBody: rootBody.canonicalBytes)

    static func leaves(_ id: DocumentID, _ range: Range<Int>) -> [IncomingRevision] {
        range.map { i in
            let body: JSON = ["leaf": .int(Int64(i))]
            let rev = RevisionID.compute(parent: root, deleted: false, canonicalBody: body.canonicalBytes)
            return IncomingRevision(id: id, revision: rev, history: [root], deleted: false, body: body)
        }
    }

    static func rootRevision(_ id: DocumentID) -> IncomingRevision {
        IncomingRevision(id: id, revision: root, history: [], deleted: false, body: rootBody)
    }

    @Test func aBatchOfConflictLeavesIsStoredWithEveryLeafAndItsOwnSequences() throws {
        let store = try DocumentStore.inMemory()
        let id = docID("wide")
        let batch = [Self.rootRevision(id)] + Self.leaves(id, 0..<300)
        let outcomes = try store.insertRevisions(batch + [batch[5]])
        var sequences: [UInt64] = []
        for case .inserted(let sequence, _) in outcomes { sequences.append(sequence) }
        #expect(sequences == Array(1...301))
        #expect(outcomes.last == .alreadyPresent)
        #expect(outcomes[1] == .inserted(sequence: 2, branched: false))
        #expect(outcomes[2] == .inserted(sequence: 3, branched: true))
        let tree = try #require(try store.revisionTree(id))
        #expect(tree.revisions.count == 301)
        #expect(tree.leafCount == 300)
        #expect(try store.conflicts(of: id).count == 299)
        let changes = try store.changes()
        #expect(changes.count == 1)
        #expect(changes.first?.sequence == 301)
        #expect(try store.lastSequence == 301)
        // The winner's body is stored: the document reads back whole.
        let doc = try #require(try store.document(id))
        #expect(doc.revision == tree.winner?.id)
        #expect(doc.body["leaf"] != nil)
        // The next batch, into the wide document, sees what the first stored.
        let again = try store.insertRevisions(Self.leaves(id, 250..<350))
        #expect(again.prefix(50).allSatisfy { $0 == .alreadyPresent })
        #expect(try store.revisionTree(id)?.leafCount == 350)
    }

    @Test func localEditsInTheSameTransactionSeeTheReplicatedRevisionsBeforeThem() throws {
        let store = try DocumentStore.inMemory()
        let id = docID("mixed")
        let rev = try store.write { txn -> RevisionID in
            for r in [Self.rootRevision(id)] + Self.leaves(id, 0..<3) { _ = txn.insertExisting(r) }
            let leaf = Self.leaves(id, 0..<3)[1].revision
            return try txn.delete(id, revision: leaf)
        }
        let tree = try #require(try store.revisionTree(id))
        #expect(tree.contains(rev))
        #expect(tree.leafCount == 3)
        #expect(try store.changes().map(\.sequence) == [5])
    }

    @Test func aRevisionThatWouldWidenADocumentPastTheLeafLimitIsRejected() throws {
        var options = StoreOptions()
        options.maxLeavesPerDocument = 5
        let store = try DocumentStore.inMemory(options: options)
        let id = docID("capped")
        let outcomes = try store.insertRevisions([Self.rootRevision(id)] + Self.leaves(id, 0..<6))
        #expect(outcomes.prefix(6).allSatisfy { if case .inserted = $0 { true } else { false } })
        #expect(outcomes.last == .rejected(.tooManyLeaves(id, limit: 5)))
        #expect(StoreError.tooManyLeaves(id, limit: 5).isTransient == false)
        // Extending a leaf does not widen the document: it is still accepted.
        let leaf = Self.leaves(id, 0..<1)[0].revision
        let body: JSON = ["next": true]
        let child = RevisionID.compute(parent: leaf, deleted: false, canonicalBody: body.canonicalBytes)
        let extended = try store.insertRevisions([IncomingRevision(id: id, revision: child, history: [leaf, Self.root], deleted: false, body: body)])
        #expect(extended == [.inserted(sequence: 7, branched: true)])
        #expect(try store.revisionTree(id)?.leafCount == 5)
    }

    @Test func aBatchKeepsMangoIndexesExact() throws {
        let store = try DocumentStore.inMemory()
        let ddoc = try DocumentID("_design/q", allowReserved: true)
        try store.put(
            ddoc,
            body: [
                "language": "query",
                "views": [
                    "by-leaf": [
                        "map": ["fields": ["leaf": "asc"], "partial_filter_selector": [:]], "reduce": "_count",
                        "options": ["def": ["fields": ["leaf"]]],
                    ]
                ],
            ])
        while try store.buildMangoIndexes(maxDocuments: 100).work > 0 {}
        let id = docID("wide")
        _ = try store.insertRevisions([Self.rootRevision(id)] + Self.leaves(id, 0..<200))
        let index = try #require(try store.mangoIndexes().first)
        let found = try store.scan(.index(id: index.id), range: .all, descending: false, after: nil, limit: 10)
        #expect(found.map(\.id) == [id])
        #expect(found.first?.conflicted == true)
        #expect(found.first?.revision == (try store.revisionTree(id)?.winner?.id))
    }
}
