import FerryCore
import Foundation
import GRDB
import Logging

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

    /// Deletes blobs that no stored revision body refers to (the winner, conflicts and other
    /// leaves, and ancestors whose bodies are kept for deltas and merges) and that were last
    /// stored or used (`BlobStore.has`) more than `minimumAge` seconds before `now`: a blob
    /// is stored before the revision that refers to it, so a young one is kept.
    ///
    /// The references are gathered from a read snapshot without blocking writers; the
    /// removal then holds the writer, first reading what was written since the snapshot, so a
    /// revision stored meanwhile keeps its blobs, and no revision can be stored while a blob
    /// it needs is being removed. Returns the blobs removed and their bytes (abandoned
    /// temporary files of unfinished writes, a day old, are removed too and counted).
    @discardableResult
    public func collectBlobs(minimumAge: TimeInterval = 3600, now: Date = Date()) throws(StoreError) -> (count: Int, bytes: Int64) {
        try collectBlobs(minimumAge: minimumAge, now: now, afterScan: {})
    }

    /// `collectBlobs`, running `afterScan` between the snapshot's scan and the removal (tests
    /// write there what a peer might store meanwhile).
    func collectBlobs(minimumAge: TimeInterval, now: Date, afterScan: () throws -> Void) throws(StoreError) -> (count: Int, bytes: Int64) {
        let cutoff = now.addingTimeInterval(-max(0, minimumAge))
        let (referenced, snapshot) = try read { db -> (Set<BlobDigest>, Int64) in
            let sequence = try Int64.fetchOne(db, sql: "SELECT last_sequence FROM store_state WHERE singleton = 1") ?? 0
            var found = Set<BlobDigest>()
            try Self.collectReferences(db, sql: "SELECT id, body, tree FROM documents", arguments: [], into: &found)
            return (found, sequence)
        }
        do { try afterScan() } catch { throw StoreError.wrap(error) }
        let temporaries = blobs.removeAbandonedTemporaries(before: min(cutoff, now.addingTimeInterval(-86_400)))
        blobs.forgetDeferred(except: referenced, markedBefore: cutoff)
        let candidates = blobs.inventory().filter { !referenced.contains($0.digest) && $0.modified <= cutoff }
        guard !candidates.isEmpty else { return temporaries }
        let removed = try write { txn -> (count: Int, bytes: Int64) in
            var late = Set<BlobDigest>()
            try Self.collectReferences(
                txn.db, sql: "SELECT id, body, tree FROM documents WHERE sequence > ?", arguments: [snapshot], into: &late)
            var count = 0
            var bytes: Int64 = 0
            for candidate in candidates where !late.contains(candidate.digest) {
                if let size = try blobs.remove(candidate.digest, ifUnusedSince: cutoff) {
                    count += 1
                    bytes += size
                }
            }
            return (count, bytes)
        }
        if removed.count > 0 {
            options.logger.info("collected \(removed.count) unreferenced blobs (\(removed.bytes) bytes)")
        }
        return (removed.count + temporaries.count, removed.bytes + temporaries.bytes)
    }

    /// Adds the blobs referred to by every revision body of the selected document rows (the
    /// winner's column and each body kept in the tree). A body that cannot be read stops the
    /// collection rather than risk removing what it refers to.
    static func collectReferences(
        _ db: Database, sql: String, arguments: StatementArguments, into found: inout Set<BlobDigest>
    ) throws {
        let cursor = try Row.fetchCursor(db, sql: sql, arguments: arguments)
        while let row = try cursor.next() {
            let id: String = row["id"]
            let tree: RevisionTree
            do { tree = try RevisionTree(encoded: row["tree"] as Data) } catch {
                throw StoreError.corrupt("revision tree of \"\(id)\": \(error)")
            }
            var bodies = [Array(row["body"] as Data)]
            bodies += tree.revisions.lazy.compactMap(\.body)
            for body in bodies where Self.mayContainBlob(body) {
                let refs: [BlobReference]
                do { refs = try StoredDocument.decodeBody(body).blobReferences() } catch {
                    throw StoreError.corrupt("document \"\(id)\" has a body whose blob references cannot be read: \(error)")
                }
                for ref in refs { found.insert(ref.digest) }
            }
        }
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
