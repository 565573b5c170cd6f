import FerryCore
import FerryQuery
import Foundation
import GRDB

/// A Mango index as this store keeps it: its definition, the store's number for it, and
/// whether its entries are complete.
public struct StoredMangoIndex: Sendable, Hashable {
    public enum State: Sendable, Hashable {
        /// Entries are being added for the documents stored before the index was defined;
        /// `done` of `total` documents so far. Queries do not read it yet.
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
    /// document then name.
    public func mangoIndexes() throws(StoreError) -> [StoredMangoIndex] {
        []
    }

    /// Up to `limit` live documents of `target` whose keys lie in `range`, in key order
    /// (then document ID), descending when asked, starting after `after`. Design documents are
    /// never in an index; `_all_docs` includes them (callers skip what they do not serve).
    public func scan(_ target: ScanTarget, range: KeyRange, descending: Bool, after: ScanPosition?, limit: Int)
        throws(StoreError) -> [ScannedDocument]
    {
        guard case .allDocs = target else { return [] }
        return try read { db in
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
                db,
                sql: """
                    SELECT id, rev, body, conflicted FROM documents WHERE \(conditions.joined(separator: " AND "))
                    ORDER BY id \(descending ? "DESC" : "ASC") LIMIT ?
                    """,
                arguments: StatementArguments(arguments.map { $0.databaseValue }))
            return try rows.map { row in
                let id: String = row["id"]
                return ScannedDocument(
                    id: DocumentID(unchecked: id), revision: try Self.parseStoredRev(row["rev"]),
                    body: Array(row["body"] as Data), conflicted: row["conflicted"],
                    position: ScanPosition(key: Array(id.utf8), documentID: id))
            }
        }
    }

    /// Does a bounded amount of index work (building entries for a new index over stored
    /// documents, removing a dropped index's entries), in short transactions so that writers
    /// wait little. Call until `work` is 0.
    public func buildMangoIndexes(maxDocuments: Int = 1000) throws(StoreError) -> MangoIndexBuildStep {
        MangoIndexBuildStep(work: 0, building: [])
    }
}
