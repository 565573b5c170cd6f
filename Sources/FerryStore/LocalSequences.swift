import FerryCore
import Foundation
import GRDB

/// Small queries replication bookkeeping needs beside checkpoints: local documents by
/// prefix, a local sequence that only ever rises, and where the changes feed ends.
extension DocumentStore {
    /// Every local document whose ID starts with `prefix`, in ID order.
    public func localDocuments(prefix: String) throws(StoreError) -> [(id: String, body: JSON)] {
        try read { db in
            // A range instead of LIKE: IDs may hold `%` or `_`, and the primary key serves the range.
            let rows = try Row.fetchAll(
                db.cachedStatement(sql: "SELECT id, body FROM local_documents WHERE id >= ? AND id < ? ORDER BY id"),
                arguments: [prefix, prefix + "\u{10FFFF}"])
            return try rows.map { row in (row["id"] as String, try StoredDocument.decodeBody(Array(row["body"] as Data))) }
        }
    }

    /// Raises the `seq` member of local document `id` to `value` in one transaction, never
    /// lowering it, so that concurrent raisers cannot take it back; returns the value kept.
    @discardableResult
    public func raiseLocalSequence(_ id: String, to value: UInt64, durability: StoreOptions.Durability? = nil) throws(StoreError)
        -> UInt64
    {
        guard !id.isEmpty else { throw .invalidBody("local document ID is empty") }
        return try write(durability: durability) { txn in
            let data = try Data.fetchOne(
                txn.db.cachedStatement(sql: "SELECT body FROM local_documents WHERE id = ?"), arguments: [id])
            let current = try data.flatMap { try StoredDocument.decodeBody(Array($0))["seq"]?.intValue }.map { UInt64(max(0, $0)) }
            if let current, current >= value { return current }
            let body: JSON = ["seq": .int(Int64(clamping: value))]
            try txn.db.cachedStatement(sql: "INSERT OR REPLACE INTO local_documents (id, body) VALUES (?, ?)")
                .execute(arguments: [id, Data(body.canonicalBytes)])
            return value
        }
    }

    /// The sequence of the newest entry in the changes feed (0 when it is empty): where a
    /// peer that reads the whole feed ends. Lower than `lastSequence` after a purge of the
    /// newest document.
    public var lastChangeSequence: UInt64 {
        get throws(StoreError) {
            try read { db in UInt64(try Int64.fetchOne(db.cachedStatement(sql: "SELECT max(sequence) FROM documents")) ?? 0) }
        }
    }
}
