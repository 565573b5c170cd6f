import FerryCore
import Foundation
import GRDB

/// One document as the CouchDB views over the store (`_changes`, `_all_docs`) list it:
/// its latest change and its revision tree, the winner's body restored.
public struct DocumentEntry: Sendable {
    public let change: Change
    public let tree: RevisionTree

    /// The current revision (possibly a tombstone) with its decoded body and conflicts.
    public func currentDocument() throws(StoreError) -> Document {
        guard let w = tree.winnerIndex else { throw .corrupt("document \"\(change.id)\" has no revisions") }
        let winner = tree.revisions[w]
        let body: JSON
        do { body = try StoredDocument.decodeBody(winner.body ?? Array("{}".utf8)) } catch { throw StoreError.wrap(error) }
        return Document(
            id: change.id, revision: winner.id, deleted: winner.deleted, body: body, sequence: change.sequence,
            conflicts: tree.conflicts)
    }
}

/// A range of document IDs in iteration order, as `_all_docs` walks it; IDs compare as
/// raw UTF-8 bytes (SQLite's BINARY collation), the order CouchDB uses for `_all_docs`.
public struct DocumentIDRange: Sendable, Equatable {
    /// The first ID in iteration order (the highest when descending); nil: from the start.
    public var start: String?
    public var startInclusive: Bool
    /// The last ID in iteration order; nil: to the end.
    public var end: String?
    public var endInclusive: Bool
    public var descending: Bool

    public init(
        start: String? = nil, startInclusive: Bool = true, end: String? = nil, endInclusive: Bool = true,
        descending: Bool = false
    ) {
        self.start = start
        self.startInclusive = startInclusive
        self.end = end
        self.endInclusive = endInclusive
        self.descending = descending
    }
}

// Range and ordered reads the CouchDB API needs beside the store's own feed: a changes
// read in either direction, ID ranges, counts, compare-and-swap local documents, a flush.
extension DocumentStore {
    /// Changes in sequence order: ascending, those after `after`; descending, those before
    /// `before` (nil: from the newest). At most `limit`, each with its revision tree.
    public func changeEntries(after: UInt64 = 0, before: UInt64? = nil, descending: Bool = false, limit: Int)
        throws(StoreError) -> [DocumentEntry]
    {
        let sql: String
        var arguments: StatementArguments
        if descending {
            sql = """
                SELECT sequence, id, rev, deleted, length(body) AS size, tree, body FROM documents
                WHERE sequence < ? ORDER BY sequence DESC LIMIT ?
                """
            arguments = [before.map { Int64(bitPattern: $0) } ?? Int64.max, limit]
        } else {
            sql = """
                SELECT sequence, id, rev, deleted, length(body) AS size, tree, body FROM documents
                WHERE sequence > ? ORDER BY sequence LIMIT ?
                """
            arguments = [Int64(bitPattern: after), limit]
        }
        return try read { db in try Row.fetchAll(db.cachedStatement(sql: sql), arguments: arguments).map(Self.entry) }
    }

    /// How many documents changed after `sequence` (ascending) or before it (descending).
    public func changeCount(after sequence: UInt64) throws(StoreError) -> Int {
        try read { db in
            try Int.fetchOne(
                db.cachedStatement(sql: "SELECT count(*) FROM documents WHERE sequence > ?"),
                arguments: [Int64(bitPattern: sequence)]) ?? 0
        }
    }

    public func changeCount(before sequence: UInt64) throws(StoreError) -> Int {
        try read { db in
            try Int.fetchOne(
                db.cachedStatement(sql: "SELECT count(*) FROM documents WHERE sequence < ?"),
                arguments: [Int64(bitPattern: sequence)]) ?? 0
        }
    }

    /// Documents in `range` in its order, live ones only unless `includeDeleted`, at most `limit`.
    public func documentEntries(in range: DocumentIDRange, includeDeleted: Bool = false, limit: Int)
        throws(StoreError) -> [DocumentEntry]
    {
        var conditions: [String] = []
        var arguments: StatementArguments = []
        let (low, high) = range.descending ? ("<", ">") : (">", "<")
        if let start = range.start {
            conditions.append("id \(low)\(range.startInclusive ? "=" : "") ?")
            _ = arguments.append(contentsOf: [start])
        }
        if let end = range.end {
            conditions.append("id \(high)\(range.endInclusive ? "=" : "") ?")
            _ = arguments.append(contentsOf: [end])
        }
        if !includeDeleted { conditions.append("deleted = 0") }
        let whereClause = conditions.isEmpty ? "" : "WHERE " + conditions.joined(separator: " AND ")
        let sql = """
            SELECT sequence, id, rev, deleted, length(body) AS size, tree, body FROM documents
            \(whereClause) ORDER BY id \(range.descending ? "DESC" : "ASC") LIMIT ?
            """
        _ = arguments.append(contentsOf: [limit])
        return try read { db in try Row.fetchAll(db.cachedStatement(sql: sql), arguments: arguments).map(Self.entry) }
    }

    /// How many live documents, the node's own left out, come before `id` in ascending (or,
    /// `descending`, descending) ID order.
    public func liveDocumentCount(before id: String, descending: Bool = false) throws(StoreError) -> Int {
        try read { db in
            try Int.fetchOne(
                db.cachedStatement(
                    sql: "SELECT count(*) FROM documents WHERE deleted = 0 AND \(Self.userDocumentSQL) AND id \(descending ? ">" : "<") ?"),
                arguments: [id]) ?? 0
        }
    }

    /// The entries of the given documents (deleted ones included) from one read; absent ones are omitted.
    public func documentEntries(ids: some Sequence<DocumentID>) throws(StoreError) -> [DocumentID: DocumentEntry] {
        try read { db in
            let stmt = try db.cachedStatement(
                sql: "SELECT sequence, id, rev, deleted, length(body) AS size, tree, body FROM documents WHERE id = ?")
            var out: [DocumentID: DocumentEntry] = [:]
            for id in ids where out[id] == nil {
                if let row = try Row.fetchOne(stmt, arguments: [id.rawValue]) { out[id] = try Self.entry(row) }
            }
            return out
        }
    }

    private static func entry(_ row: Row) throws -> DocumentEntry {
        let change = Change(
            sequence: UInt64(row["sequence"] as Int64), id: DocumentID(unchecked: row["id"]),
            revision: try parseStoredRev(row["rev"]), deleted: row["deleted"], bodySize: row["size"])
        var tree: RevisionTree
        do { tree = try RevisionTree(encoded: row["tree"] as Data) } catch {
            throw StoreError.corrupt("revision tree of \"\(change.id)\": \(error)")
        }
        guard let w = tree.winnerIndex, tree.revisions[w].id == change.revision else {
            throw StoreError.corrupt("document \"\(change.id)\": stored winner \(change.revision) disagrees with its tree")
        }
        tree.restoreBody(Array(row["body"] as Data), at: w)
        return DocumentEntry(change: change, tree: tree)
    }

    /// Replaces local document `id` only if it still is `expected` (nil: absent); `new` nil
    /// deletes it. One transaction, so two writers that read the same version cannot both
    /// win. Returns false, changing nothing, when the document was not `expected`.
    public func replaceLocalDocument(_ id: String, expected: JSON?, with new: JSON?) throws(StoreError) -> Bool {
        guard !id.isEmpty else { throw .invalidBody("local document ID is empty") }
        return try write { txn in
            let data = try Data.fetchOne(
                txn.db.cachedStatement(sql: "SELECT body FROM local_documents WHERE id = ?"), arguments: [id])
            let current = try data.map { try StoredDocument.decodeBody(Array($0)) }
            guard current == expected else { return false }
            if let new {
                try txn.db.cachedStatement(sql: "INSERT OR REPLACE INTO local_documents (id, body) VALUES (?, ?)")
                    .execute(arguments: [id, Data(new.canonicalBytes)])
            } else {
                try txn.db.cachedStatement(sql: "DELETE FROM local_documents WHERE id = ?").execute(arguments: [id])
            }
            return true
        }
    }

    /// Makes every committed write durable on disk: checkpoints the write-ahead log, which
    /// syncs it first, so commits made with `durability: .normal` survive a power loss too.
    public func flushToDisk() throws(StoreError) {
        guard path != nil else { return }
        // Outside any transaction: inside one SQLite refuses the checkpoint.
        do { _ = try writer.writeWithoutTransaction { db in try db.checkpoint(.passive) } } catch { throw StoreError.wrap(error) }
    }
}
