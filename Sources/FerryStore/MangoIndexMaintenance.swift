import FerryCore
import FerryQuery
import Foundation
import GRDB

/// The layout of index keys this version of the store computes; an index whose entries were
/// computed with another is rebuilt.
enum MangoIndexKeys {
    /// Raise when `MangoIndex.key(for:)` or the query form of a document changes.
    static let version: Int64 = 1

    /// The prefix of design document IDs: they define indexes and are never in one.
    static let designPrefix = "_design/"

    /// The document as `_find` sees it and index keys are computed from: the stored body
    /// without Ferry's `@attachments` member, plus `_id` and `_rev`.
    static func queryForm(id: String, revision: String, body: [UInt8]) throws -> JSON {
        guard case .object(var members) = try StoredDocument.decodeBody(body) else {
            throw StoreError.corrupt("stored body of \"\(id)\" is not a JSON object")
        }
        members.removeValue(forKey: "@attachments")
        members["_id"] = .string(id)
        members["_rev"] = .string(revision)
        return .object(members)
    }

    /// The stored form of a definition: the canonical JSON of its design document view.
    static func definition(of index: MangoIndex) -> [UInt8] {
        MangoDesignDocument.view(of: index).canonicalBytes
    }
}

/// One index a transaction keeps up to date: its number and parsed definition.
struct ActiveMangoIndex {
    let id: Int64
    let index: MangoIndex
}

/// Parsed index definitions, shared by the store's transactions and reads. Keyed by number
/// and definition bytes, so an entry is right whatever transaction (committed or not) read it.
final class MangoDefinitionCache: Sendable {
    private struct Key: Hashable {
        let id: Int64
        let definition: [UInt8]
    }
    private let parsed = Locked<[Key: MangoIndex]>([:])
    /// More distinct definitions than any store holds at once; past it the cache starts over.
    private static let capacity = 4096

    func index(id: Int64, designDocument: String, name: String, definition: [UInt8]) throws(StoreError) -> MangoIndex {
        let key = Key(id: id, definition: definition)
        if let known = parsed.withLock({ $0[key] }) { return known }
        let view: JSON
        do { view = try JSON.parse(definition) } catch {
            throw .corrupt("definition of index \(name) in \(designDocument) is not JSON: \(error)")
        }
        let body: JSON = ["language": "query", "views": .object([name: view])]
        guard let index = MangoDesignDocument.indexes(designDocumentID: designDocument, body: body).first else {
            throw .corrupt("definition of index \(name) in \(designDocument) is not a JSON index")
        }
        parsed.withLock { cache in
            if cache.count >= Self.capacity { cache.removeAll() }
            cache[key] = index
        }
        return index
    }
}

/// What one transaction knows about indexes: the definitions it maintains, loaded on its
/// first document write and reloaded after a design document changes them.
struct MangoTransactionState {
    var active: [ActiveMangoIndex]?
    /// Whether a design document written in this transaction registered or dropped an index.
    var definitionsChanged = false
    /// Whether this transaction wrote `mango_indexes` (an index added, dropped, or its build
    /// moved on): the store's cached index list is stale once it commits.
    var indexListChanged = false
    /// The first failure to maintain an index: the transaction may not commit after it,
    /// even when its caller goes on (a replicated batch reports a bad revision and continues).
    var failure: StoreError?
}

extension StoreTransaction {
    /// The indexes whose entries writes keep exact: building and ready ones of the current key layout.
    func activeMangoIndexes() throws(StoreError) -> [ActiveMangoIndex] {
        if let active = mango.active { return active }
        let loaded: [ActiveMangoIndex] = try wrapDatabase {
            let stmt = FastStatement(
                db,
                statement: try db.cachedStatement(
                    sql: """
                        SELECT index_id, ddoc, name, definition FROM mango_indexes
                        WHERE state != 'dropping' AND key_version = ? ORDER BY index_id
                        """))
            defer { stmt.done() }
            stmt.bind(1, MangoIndexKeys.version)
            var out: [ActiveMangoIndex] = []
            while try stmt.step() {
                let id = stmt.int64(0)
                let index = try store.mangoDefinitions.index(
                    id: id, designDocument: stmt.text(1), name: stmt.text(2), definition: stmt.bytes(3))
                out.append(ActiveMangoIndex(id: id, index: index))
            }
            return out
        }
        mango.active = loaded
        return loaded
    }

    /// Brings every active index's entry for one document in line with its new winner;
    /// for a design document, reconciles the indexes it defines instead.
    func documentWinnerChanged(
        id: DocumentID, docKey: Int64, isNew: Bool, revision: RevisionID, deleted: Bool, body: [UInt8]
    ) throws(StoreError) {
        do {
            try updateEntries(id: id, docKey: docKey, isNew: isNew, revision: revision, deleted: deleted, body: body)
        } catch {
            if mango.failure == nil { mango.failure = error }
            throw error
        }
    }

    /// Removes a purged document's entries from every active index, or, for a design
    /// document, drops the indexes it defined.
    func documentPurged(id: DocumentID, docKey: Int64) throws(StoreError) {
        do {
            if id.rawValue.hasPrefix(MangoIndexKeys.designPrefix) {
                try reconcileDesignDocument(id.rawValue, deleted: true, body: [])
            } else {
                for entry in try activeMangoIndexes() {
                    try deleteMangoEntry(index: entry.id, docKey: docKey)
                }
            }
        } catch {
            if mango.failure == nil { mango.failure = error }
            throw error
        }
    }

    private func updateEntries(
        id: DocumentID, docKey: Int64, isNew: Bool, revision: RevisionID, deleted: Bool, body: [UInt8]
    ) throws(StoreError) {
        if id.rawValue.hasPrefix(MangoIndexKeys.designPrefix) {
            try reconcileDesignDocument(id.rawValue, deleted: deleted, body: body)
            return
        }
        let active = try activeMangoIndexes()
        guard !active.isEmpty else { return }
        var document: JSON?
        if !deleted {
            document = try wrapDatabase { try MangoIndexKeys.queryForm(id: id.rawValue, revision: revision.description, body: body) }
        }
        for entry in active {
            if let document, let key = entry.index.key(for: document) {
                try putMangoEntry(index: entry.id, docKey: docKey, key: key, documentID: id.rawValue)
            } else if !isNew {
                try deleteMangoEntry(index: entry.id, docKey: docKey)
            }
        }
    }

    func putMangoEntry(index: Int64, docKey: Int64, key: [UInt8], documentID: String) throws(StoreError) {
        try wrapDatabase {
            // An unchanged key rewrites nothing (neither the row nor the key index).
            let stmt = try FastStatement(
                db,
                sql: """
                    INSERT INTO mango_entries (index_id, doc_key, key, doc_id) VALUES (?1, ?2, ?3, ?4)
                    ON CONFLICT (index_id, doc_key) DO UPDATE SET key = excluded.key, doc_id = excluded.doc_id
                    WHERE key != excluded.key OR doc_id != excluded.doc_id
                    """)
            stmt.bind(1, index)
            stmt.bind(2, docKey)
            stmt.bind(3, key)
            stmt.bind(4, documentID)
            try stmt.run()
        }
    }

    private func deleteMangoEntry(index: Int64, docKey: Int64) throws(StoreError) {
        try wrapDatabase {
            let stmt = try FastStatement(db, sql: "DELETE FROM mango_entries WHERE index_id = ?1 AND doc_key = ?2")
            stmt.bind(1, index)
            stmt.bind(2, docKey)
            try stmt.run()
        }
    }

    /// Makes `mango_indexes` match what design document `ddoc` now defines: an unchanged
    /// definition stays; a removed or changed one is dropped (its entries go later, in
    /// batches) and a new or changed one starts building under a new number.
    private func reconcileDesignDocument(_ ddoc: String, deleted: Bool, body: [UInt8]) throws(StoreError) {
        var wanted: [String: [UInt8]] = [:]
        if !deleted {
            let json = try wrapDatabase { try StoredDocument.decodeBody(body) }
            for index in MangoDesignDocument.indexes(designDocumentID: ddoc, body: json) {
                wanted[index.name] = MangoIndexKeys.definition(of: index)
            }
        }
        let changed: Bool = try wrapDatabase {
            let existing = try Row.fetchAll(
                db.cachedStatement(sql: "SELECT index_id, name, definition FROM mango_indexes WHERE ddoc = ? AND state != 'dropping'"),
                arguments: [ddoc])
            var changed = false
            for row in existing {
                let name: String = row["name"]
                let definition = [UInt8](row["definition"] as Data)
                if wanted[name] == definition {
                    wanted.removeValue(forKey: name)
                } else {
                    try db.cachedStatement(sql: "UPDATE mango_indexes SET state = 'dropping' WHERE index_id = ?")
                        .execute(arguments: [row["index_id"] as Int64])
                    changed = true
                }
            }
            if wanted.isEmpty { return changed }
            for (name, definition) in wanted.sorted(by: { $0.key < $1.key }) {
                try registerMangoIndex(ddoc: ddoc, name: name, definition: definition)
            }
            return true
        }
        if changed {
            mango.active = nil
            mango.definitionsChanged = true
            mango.indexListChanged = true
        }
    }

    /// Adds an index in the `building` state; its total is the document rows there are now.
    func registerMangoIndex(ddoc: String, name: String, definition: [UInt8]) throws {
        mango.indexListChanged = true
        // count(*) walks the smallest index of `documents`, not the rows with their bodies.
        let total = try Int64.fetchOne(db.cachedStatement(sql: "SELECT count(*) FROM documents")) ?? 0
        try db.cachedStatement(
            sql: """
                INSERT INTO mango_indexes (ddoc, name, definition, state, build_cursor, build_done, build_total, key_version)
                VALUES (?, ?, ?, 'building', 0, 0, ?, ?)
                """
        ).execute(arguments: [ddoc, name, Data(definition), total, MangoIndexKeys.version])
    }

    func wrapDatabase<T>(_ body: () throws -> T) throws(StoreError) -> T {
        do { return try body() } catch { throw StoreError.wrap(error) }
    }
}

extension StoreTransaction {
    /// One bounded step of index work, in this transaction: re-registers indexes of an older
    /// key layout, then either removes up to `maxDocuments` entries of one dropped index (and
    /// the index when none is left), or adds the entries of up to `maxDocuments` document rows
    /// to one building index, marking it ready when its walk passes the last row.
    func buildMangoIndexStep(maxDocuments: Int) throws(StoreError) -> MangoIndexBuildStep {
        try flushPending()
        // A step moves progress, states and rows of `mango_indexes`.
        mango.indexListChanged = true
        let budget = Swift.max(1, maxDocuments)
        var work = 0
        try wrapDatabase {
            let outdated = try Row.fetchAll(
                db.cachedStatement(
                    sql: "SELECT index_id, ddoc, name, definition FROM mango_indexes WHERE state != 'dropping' AND key_version != ?"),
                arguments: [MangoIndexKeys.version])
            for row in outdated {
                try db.cachedStatement(sql: "UPDATE mango_indexes SET state = 'dropping' WHERE index_id = ?")
                    .execute(arguments: [row["index_id"] as Int64])
                try registerMangoIndex(ddoc: row["ddoc"], name: row["name"], definition: [UInt8](row["definition"] as Data))
                work += 1
            }
            if !outdated.isEmpty { mango.active = nil }
        }
        if let dropping = try wrapDatabase({
            try Int64.fetchOne(db.cachedStatement(sql: "SELECT min(index_id) FROM mango_indexes WHERE state = 'dropping'"))
        }) {
            work += try dropMangoEntries(index: dropping, limit: budget)
        } else {
            work += try buildOneMangoIndex(limit: budget)
        }
        let building = try wrapDatabase { try store.mangoIndexes(in: db) }.filter { if case .building = $0.state { return true } else { return false } }
        return MangoIndexBuildStep(work: work, building: building)
    }

    /// Removes up to `limit` entries of a dropped index, and the index once none is left.
    private func dropMangoEntries(index: Int64, limit: Int) throws(StoreError) -> Int {
        try wrapDatabase {
            try db.cachedStatement(
                sql: """
                    DELETE FROM mango_entries WHERE index_id = ?1 AND doc_key IN
                    (SELECT doc_key FROM mango_entries WHERE index_id = ?1 ORDER BY doc_key LIMIT ?2)
                    """
            ).execute(arguments: [index, limit])
            let removed = db.changesCount
            if removed < limit {
                try db.cachedStatement(sql: "DELETE FROM mango_indexes WHERE index_id = ?").execute(arguments: [index])
                return removed + 1
            }
            return removed
        }
    }

    /// Walks up to `limit` document rows after the cursor of the oldest building index,
    /// adding their entries; marks it ready when the walk is past the last row.
    private func buildOneMangoIndex(limit: Int) throws(StoreError) -> Int {
        guard
            let row = try wrapDatabase({
                try Row.fetchOne(
                    db.cachedStatement(
                        sql: """
                            SELECT index_id, ddoc, name, definition, build_cursor FROM mango_indexes
                            WHERE state = 'building' AND key_version = ? ORDER BY index_id LIMIT 1
                            """),
                    arguments: [MangoIndexKeys.version])
            })
        else { return 0 }
        let id: Int64 = row["index_id"]
        let index = try store.mangoDefinitions.index(
            id: id, designDocument: row["ddoc"], name: row["name"], definition: [UInt8](row["definition"] as Data))
        var cursor: Int64 = row["build_cursor"]
        var walked = 0
        try wrapDatabase {
            let stmt = try FastStatement(
                db, sql: "SELECT doc_key, id, rev, deleted, body FROM documents WHERE doc_key > ? ORDER BY doc_key LIMIT ?")
            stmt.bind(1, cursor)
            stmt.bind(2, Int64(limit))
            var found: [(docKey: Int64, id: String, key: [UInt8])] = []
            do {
                defer { stmt.done() }
                while try stmt.step() {
                    walked += 1
                    cursor = stmt.int64(0)
                    let docID = stmt.text(1)
                    guard stmt.int64(3) == 0, !docID.hasPrefix(MangoIndexKeys.designPrefix) else { continue }
                    let document = try MangoIndexKeys.queryForm(id: docID, revision: stmt.text(2), body: stmt.bytes(4))
                    if let key = index.key(for: document) { found.append((cursor, docID, key)) }
                }
            }
            for entry in found {
                try putMangoEntry(index: id, docKey: entry.docKey, key: entry.key, documentID: entry.id)
            }
            let finished = walked < limit
            try db.cachedStatement(
                sql: """
                    UPDATE mango_indexes SET build_cursor = ?, build_done = build_done + ?,
                    state = CASE WHEN ? THEN 'ready' ELSE state END,
                    build_total = CASE WHEN ? THEN max(build_total, build_done + ?) ELSE build_total END
                    WHERE index_id = ?
                    """
            ).execute(arguments: [cursor, walked, finished, finished, walked, id])
        }
        // Marking an index ready is work too, so that callers step until nothing is left.
        return walked + (walked < limit ? 1 : 0)
    }
}
