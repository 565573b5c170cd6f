import FerryCore
import Foundation
import GRDB
import Logging
import Synchronization

/// Local documents (never replicated) and maintenance: compaction, blob collection, integrity.
extension DocumentStore {
    // MARK: Local documents

    /// A local document (checkpoint, node state); never replicated.
    public func localDocument(_ id: String) throws(StoreError) -> JSON? {
        try read { db in
            guard let data = try Data.fetchOne(db.cachedStatement(sql: "SELECT body FROM local_documents WHERE id = ?"), arguments: [id])
            else { return nil }
            return try StoredDocument.decodeBody(Array(data))
        }
    }

    public func putLocalDocument(_ id: String, body: JSON, durability: StoreOptions.Durability? = nil) throws(StoreError) {
        guard !id.isEmpty else { throw .invalidBody("local document ID is empty") }
        try write(durability: durability) { txn in
            try txn.db.cachedStatement(sql: "INSERT OR REPLACE INTO local_documents (id, body) VALUES (?, ?)")
                .execute(arguments: [id, Data(body.canonicalBytes)])
        }
    }

    @discardableResult
    public func deleteLocalDocument(_ id: String) throws(StoreError) -> Bool {
        try write { txn in
            try txn.db.execute(sql: "DELETE FROM local_documents WHERE id = ?", arguments: [id])
            return txn.db.changesCount > 0
        }
    }

    // MARK: Maintenance

    /// Re-applies history pruning and body retention to every document (after changing
    /// the options). Returns the number of documents rewritten.
    @discardableResult
    public func compact() throws(StoreError) -> Int {
        var rewritten = 0
        var after = ""
        while true {
            let ids = try read { db in
                try String.fetchAll(
                    db, sql: "SELECT id FROM documents WHERE id > ? ORDER BY id LIMIT 500", arguments: [after])
            }
            guard let last = ids.last else { break }
            after = last
            rewritten += try write { txn in
                try ids.reduce(0) { n, id in n + (try txn.compact(DocumentID(unchecked: id)) ? 1 : 0) }
            }
        }
        // Outside any transaction: inside one SQLite refuses the checkpoint ("table is locked").
        do { try writer.writeWithoutTransaction { db in try db.checkpoint(.passive) } } catch { throw StoreError.wrap(error) }
        return rewritten
    }

    /// Deletes blobs that no retained revision refers to and that are older than
    /// `minimumAge` (so a blob stored just before its document is not lost).
    @discardableResult
    public func collectBlobs(minimumAge: TimeInterval = 3600) throws(StoreError) -> (count: Int, bytes: Int64) {
        let referenced = try read { db -> Set<BlobDigest> in
            var found = Set<BlobDigest>()
            let cursor = try Row.fetchCursor(db, sql: "SELECT body, tree FROM documents")
            while let row = try cursor.next() {
                let body: Data = row["body"]
                let tree = try RevisionTree(encoded: row["tree"] as Data)
                var bodies = [Array(body)]
                bodies += tree.revisions.compactMap(\.body)
                for b in bodies where b.count > 20 && Self.mayContainBlob(b) {
                    for ref in try StoredDocument.decodeBody(b).blobReferences() { found.insert(ref.digest) }
                }
            }
            return found
        }
        return try blobs.removeAll(except: referenced, olderThan: minimumAge)
    }

    static let blobMarker = Array("\"@type\":\"blob\"".utf8)

    /// Whether a canonical body may reference blobs (a fast byte scan; false means surely not).
    public static func mayReferenceBlobs(_ body: [UInt8]) -> Bool { mayContainBlob(body) }

    /// Cheap prefilter: a canonical body holding a blob reference contains `"@type":"blob"`.
    static func mayContainBlob(_ body: [UInt8]) -> Bool {
        // memchr finds each '@' (rare in most bodies) at memory speed; then compare in place.
        body.withUnsafeBytes { hay in
            blobMarker.withUnsafeBytes { needle in
                guard hay.count >= needle.count, let base = hay.baseAddress else { return false }
                var offset = 1
                while offset <= hay.count - needle.count + 1 {
                    guard let hit = memchr(base + offset, 0x40, hay.count - offset) else { return false }
                    let at = base.distance(to: UnsafeRawPointer(hit))
                    if at - 1 + needle.count <= hay.count && memcmp(base + at - 1, needle.baseAddress!, needle.count) == 0 {
                        return true
                    }
                    offset = at + 1
                }
                return false
            }
        }
    }

    /// Runs SQLite's integrity check; returns its findings, `["ok"]` when healthy.
    public func integrityCheck() throws(StoreError) -> [String] {
        try read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check") }
    }
}
