import FerryCore
import FerryQuery
import Foundation
import GRDB

/// A Mango index as this store keeps it: its definition, the store's number for it, and
/// whether its entries are complete.
public struct StoredMangoIndex: Sendable, Hashable {
    public enum State: Sendable, Hashable {
        /// Entries are being added for the documents stored before the index was defined;
        /// `done` of `total` document rows walked so far (deleted ones count: the walk is by
        /// row). Queries do not read it yet.
        case building(done: Int, total: Int)
        /// Every live document's entry is present; queries may read it.
        case ready
    }

    /// The store's number for the index (a new definition under an old name gets a new one).
    public let id: Int64
    public let index: MangoIndex
    public var state: State

    public init(id: Int64, index: MangoIndex, state: State) {
        self.id = id
        self.index = index
        self.state = state
    }
}

/// The store's index list as `_find` last read it. Measured: re-reading it took a fifth of an
/// indexed 20-document `_find` (a read transaction of its own), `ferry-bench find`.
final class MangoIndexListCache: Sendable {
    private struct State {
        var generation: UInt64 = 0
        var list: [StoredMangoIndex]?
        var readGeneration: UInt64 = 0
        var readAt = ContinuousClock.now
    }
    private let state = Locked(State())
    /// Another process's index changes are seen within this long.
    static let maxAge = Duration.seconds(1)

    /// Bumped after every commit that changed the list.
    var generation: UInt64 { state.withLock { $0.generation } }

    func invalidate() { state.withLock { $0.generation &+= 1 } }

    /// The kept list, unless a commit changed the list since it was read or it is too old.
    func current() -> [StoredMangoIndex]? {
        state.withLock { s in
            guard let list = s.list, s.readGeneration == s.generation, ContinuousClock.now - s.readAt < Self.maxAge else { return nil }
            return list
        }
    }

    /// Keeps `list`, read after the generation was `generation` (a commit since makes it stale at once).
    func keep(_ list: [StoredMangoIndex], readAt generation: UInt64) {
        state.withLock { s in
            s.list = list
            s.readGeneration = generation
            s.readAt = .now
        }
    }
}

/// Where a scan reads: `_all_docs` (live documents by ID; keys are IDs' UTF-8 bytes) or one index.
public enum ScanTarget: Sendable, Hashable {
    case allDocs
    case index(id: Int64)
}

/// A resumable place in a scan: the key and document ID of the last row read.
public struct ScanPosition: Sendable, Hashable {
    public var key: [UInt8]
    public var documentID: String
    public init(key: [UInt8], documentID: String) {
        self.key = key
        self.documentID = documentID
    }
}

/// One live document a scan found: its current revision's stored body and where the scan was.
public struct ScannedDocument: Sendable {
    public let id: DocumentID
    public let revision: RevisionID
    /// `revision` as stored (its text form), so answers need not format it again.
    public let revisionText: String
    /// The winner's stored body (canonical JSON bytes).
    public let body: [UInt8]
    public let conflicted: Bool
    public let position: ScanPosition
}

/// What one step of index building did.
public struct MangoIndexBuildStep: Sendable, Equatable {
    /// Documents indexed and entries removed in this step; 0 when nothing was left to do.
    public var work: Int
    /// Indexes still building after the step, with their progress.
    public var building: [StoredMangoIndex]
    public init(work: Int, building: [StoredMangoIndex]) {
        self.work = work
        self.building = building
    }
}

extension DocumentStore {
    /// Every index the store's design documents define (building ones included), by design
    /// document then name. An index whose entries use an older key layout is listed as
    /// building until it is rebuilt.
    public func mangoIndexes() throws(StoreError) -> [StoredMangoIndex] {
        try read { db in try mangoIndexes(in: db) }
    }

    /// `mangoIndexes()` as a query plans with it: kept in memory between queries, read again
    /// after this store's transactions change the list, and at least every `maxAge` (for
    /// changes another process made). A plan from it may name an index that has just gone:
    /// `scan` then throws `indexUnavailable`, and the caller plans again with `fresh`.
    public func mangoIndexesForPlanning(fresh: Bool = false) throws(StoreError) -> [StoredMangoIndex] {
        if !fresh, let kept = mangoIndexList.current() { return kept }
        let generation = mangoIndexList.generation
        let list = try mangoIndexes()
        mangoIndexList.keep(list, readAt: generation)
        return list
    }

    func mangoIndexes(in db: Database) throws -> [StoredMangoIndex] {
        do {
            let stmt = try FastStatement(
                db,
                sql: """
                    SELECT index_id, ddoc, name, definition, state, build_done, build_total, key_version
                    FROM mango_indexes WHERE state != 'dropping' ORDER BY ddoc, name, index_id
                    """)
            defer { stmt.done() }
            var out: [StoredMangoIndex] = []
            while try stmt.step() {
                let id = stmt.int64(0)
                let index = try mangoDefinitions.index(
                    id: id, designDocument: stmt.text(1), name: stmt.text(2), definition: stmt.bytes(3))
                let (done, total) = (Int(stmt.int64(5)), Int(stmt.int64(6)))
                let state: StoredMangoIndex.State
                if stmt.text(4) == "ready" && stmt.int64(7) == MangoIndexKeys.version {
                    state = .ready
                } else if stmt.int64(7) == MangoIndexKeys.version {
                    state = .building(done: done, total: Swift.max(done, total))
                } else {
                    state = .building(done: 0, total: total)
                }
                out.append(StoredMangoIndex(id: id, index: index, state: state))
            }
            return out
        }
    }

    /// Whether `buildMangoIndexes` has anything to do: an index building, dropping, or
    /// computed with an older key layout. A cheap read, for a builder deciding whether to write.
    public func hasPendingMangoIndexWork() throws(StoreError) -> Bool {
        try read { db in
            let stmt = try FastStatement(
                db, sql: "SELECT EXISTS (SELECT 1 FROM mango_indexes WHERE state != 'ready' OR key_version != ?)")
            defer { stmt.done() }
            stmt.bind(1, MangoIndexKeys.version)
            return try stmt.step() && stmt.int64(0) == 1
        }
    }

    /// Up to `limit` live documents of `target` whose keys lie in `range`, in key order
    /// (then document ID), descending when asked, starting after `after`. Design documents are
    /// never in an index; `_all_docs` includes them (callers skip what they do not serve).
    /// An index that does not exist or is not ready throws `indexUnavailable`.
    public func scan(_ target: ScanTarget, range: KeyRange, descending: Bool, after: ScanPosition?, limit: Int)
        throws(StoreError) -> [ScannedDocument]
    {
        guard limit > 0 else { return [] }
        switch target {
        case .allDocs: return try scanAllDocuments(range: range, descending: descending, after: after, limit: limit)
        case .index(let id): return try scanIndex(id, range: range, descending: descending, after: after, limit: limit)
        }
    }

    private func scanAllDocuments(range: KeyRange, descending: Bool, after: ScanPosition?, limit: Int)
        throws(StoreError) -> [ScannedDocument]
    {
        try read { db in
            var conditions = ["deleted = 0"]
            var arguments: [any DatabaseValueConvertible] = []
            func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }
            if let lower = range.lower {
                conditions.append(range.lowerInclusive ? "id >= ?" : "id > ?")
                arguments.append(text(lower))
            }
            if let upper = range.upper {
                conditions.append(range.upperInclusive ? "id <= ?" : "id < ?")
                arguments.append(text(upper))
            }
            if let after {
                conditions.append(descending ? "id < ?" : "id > ?")
                arguments.append(after.documentID)
            }
            arguments.append(limit)
            let rows = try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT id, rev, body, conflicted FROM documents WHERE \(conditions.joined(separator: " AND "))
                        ORDER BY id \(descending ? "DESC" : "ASC") LIMIT ?
                        """),
                arguments: StatementArguments(arguments.map { $0.databaseValue }))
            return try rows.map { row in
                let id: String = row["id"]
                let rev: String = row["rev"]
                return ScannedDocument(
                    id: DocumentID(unchecked: id), revision: try Self.parseStoredRev(rev), revisionText: rev,
                    body: Array(row["body"] as Data), conflicted: row["conflicted"],
                    position: ScanPosition(key: Array(id.utf8), documentID: id))
            }
        }
    }

    private func scanIndex(_ indexID: Int64, range: KeyRange, descending: Bool, after: ScanPosition?, limit: Int)
        throws(StoreError) -> [ScannedDocument]
    {
        try read { db in
            let check = try FastStatement(db, sql: "SELECT state, key_version FROM mango_indexes WHERE index_id = ?")
            check.bind(1, indexID)
            guard try check.step() else {
                check.done()
                throw StoreError.indexUnavailable(id: indexID, reason: "no such index (it may have been deleted)")
            }
            let (state, version) = (check.text(0), check.int64(1))
            check.done()
            guard state == "ready" else {
                throw StoreError.indexUnavailable(id: indexID, reason: state == "building" ? "it is still being built" : "it is being deleted")
            }
            guard version == MangoIndexKeys.version else {
                throw StoreError.indexUnavailable(id: indexID, reason: "it is waiting to be rebuilt for this version of Ferry")
            }
            let stmt = FastStatement(
                db,
                statement: try db.cachedStatement(
                    sql: Self.indexScanSQL(
                        lower: range.lower.map { _ in range.lowerInclusive }, upper: range.upper.map { _ in range.upperInclusive },
                        after: after != nil, descending: descending)))
            defer { stmt.done() }
            stmt.bind(1, indexID)
            if let lower = range.lower { stmt.bind(2, lower) }
            if let upper = range.upper { stmt.bind(3, upper) }
            if let after {
                stmt.bind(4, after.key)
                stmt.bind(5, after.documentID)
            }
            stmt.bind(6, Int64(limit))
            var out: [ScannedDocument] = []
            out.reserveCapacity(Swift.min(limit, 256))
            while try stmt.step() {
                let id = stmt.text(1)
                let rev = stmt.text(2)
                out.append(
                    ScannedDocument(
                        id: DocumentID(unchecked: id), revision: try Self.parseStoredRev(rev), revisionText: rev, body: stmt.bytes(3),
                        conflicted: stmt.int64(4) != 0, position: ScanPosition(key: stmt.bytes(0), documentID: id)))
            }
            return out
        }
    }

    /// The SQL of an index scan: parameters 1 index, 2 lower key, 3 upper key, 4–5 the
    /// position to resume after, 6 limit; `lower`/`upper` nil when open, else inclusive or not.
    /// The row-value comparison and the order both follow `mango_entries_by_key`.
    static func indexScanSQL(lower: Bool?, upper: Bool?, after: Bool, descending: Bool) -> String {
        var conditions = ["e.index_id = ?1"]
        if let lower { conditions.append(lower ? "e.key >= ?2" : "e.key > ?2") }
        if let upper { conditions.append(upper ? "e.key <= ?3" : "e.key < ?3") }
        if after { conditions.append(descending ? "(e.key, e.doc_id) < (?4, ?5)" : "(e.key, e.doc_id) > (?4, ?5)") }
        conditions.append("d.deleted = 0")
        let direction = descending ? "DESC" : "ASC"
        return """
            SELECT e.key, e.doc_id, d.rev, d.body, d.conflicted
            FROM mango_entries AS e CROSS JOIN documents AS d ON d.doc_key = e.doc_key
            WHERE \(conditions.joined(separator: " AND "))
            ORDER BY e.key \(direction), e.doc_id \(direction) LIMIT ?6
            """
    }

    /// Does a bounded amount of index work (building entries for a new index over stored
    /// documents, removing a dropped index's entries), in short transactions so that writers
    /// wait little. Call until `work` is 0.
    public func buildMangoIndexes(maxDocuments: Int = 1000) throws(StoreError) -> MangoIndexBuildStep {
        try write { txn in try txn.buildMangoIndexStep(maxDocuments: maxDocuments) }
    }

    /// `buildMangoIndexes`, run on the database's own thread while the caller suspends.
    public func buildMangoIndexesSuspending(maxDocuments: Int = 1000) async throws(StoreError) -> MangoIndexBuildStep {
        try await writeSuspending { txn in try txn.buildMangoIndexStep(maxDocuments: maxDocuments) }
    }
}
