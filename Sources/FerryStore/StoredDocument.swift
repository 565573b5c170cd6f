import FerryCore
import Foundation
import GRDB

/// A document row as stored: winner summary columns plus the decoded revision tree.
struct StoredDocument {
    let key: Int64
    let id: DocumentID
    var tree: RevisionTree
    let winner: RevisionID
    let sequence: UInt64

    static let selectSQL = "SELECT doc_key, id, rev, sequence, body, tree FROM documents WHERE id = ?"
    static let selectSQLNoBody = "SELECT doc_key, id, rev, sequence, tree FROM documents WHERE id = ?"

    /// Loads a document; the winner's body (kept in its own column) is put back into the tree.
    static func fetch(_ db: Database, id: DocumentID, withWinnerBody: Bool = true) throws -> StoredDocument? {
        try fetch(FastStatement(db, sql: withWinnerBody ? selectSQL : selectSQLNoBody), id: id, withWinnerBody: withWinnerBody)
    }

    static func fetch(_ stmt: FastStatement, id: DocumentID, withWinnerBody: Bool = true) throws -> StoredDocument? {
        defer { stmt.done() }
        stmt.bind(1, id.rawValue)
        guard try stmt.step() else { return nil }
        var tree: RevisionTree
        do {
            tree = try RevisionTree(encoded: stmt.bytes(withWinnerBody ? 5 : 4))
        } catch {
            throw StoreError.corrupt("revision tree of \"\(id)\": \(error)")
        }
        guard let w = tree.winnerIndex else { throw StoreError.corrupt("document \"\(id)\" has no revisions") }
        let winner = try DocumentStore.parseStoredRev(stmt.text(2))
        guard tree.revisions[w].id == winner else {
            throw StoreError.corrupt("document \"\(id)\": stored winner \(winner) disagrees with its tree")
        }
        if withWinnerBody { tree.restoreBody(stmt.bytes(4), at: w) }
        return StoredDocument(key: stmt.int64(0), id: id, tree: tree, winner: winner, sequence: UInt64(stmt.int64(3)))
    }

    func currentDocument() throws -> Document {
        let w = tree.revisions[tree.winnerIndex!]
        return Document(
            id: id, revision: w.id, deleted: w.deleted, body: try Self.decodeBody(w.body ?? Array("{}".utf8)),
            sequence: sequence, conflicts: tree.conflicts)
    }

    static func decodeBody(_ bytes: [UInt8]) throws -> JSON {
        do {
            return try JSON.parse(bytes)
        } catch {
            throw StoreError.corrupt("stored body is not valid JSON: \(error)")
        }
    }
}
