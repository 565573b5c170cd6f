import Crypto
import FerryCore
import Foundation
import GRDB

extension DocumentStore {
    /// A digest of what the store holds, equal on two stores if and only if they hold the
    /// same document IDs with the same current revisions and the same conflicting leaves.
    ///
    /// SHA-256 over, for each document in ID order (byte order of the UTF-8 ID, tombstones
    /// included): `id 0x00 currentRev 0x00 conflict1 0x00 conflict2 … 0x0A`, conflicts being
    /// the live non-winning leaves in ascending revision order. Sequences, local documents,
    /// bodies of old revisions and blobs do not count: they differ between converged peers.
    /// Hex of the hash, prefixed `sha256-`. Reads one snapshot; O(documents).
    public func contentDigest() throws(StoreError) -> String {
        try read { db in
            var hasher = SHA256()
            let cursor = try Row.fetchCursor(db, sql: "SELECT id, rev, conflicted, tree FROM documents ORDER BY id")
            while let row = try cursor.next() {
                let id: String = row["id"]
                hasher.update(data: Array(id.utf8) + [0])
                let rev: String = row["rev"]
                hasher.update(data: Array(rev.utf8))
                if row["conflicted"] as Bool {
                    let tree: RevisionTree
                    do { tree = try RevisionTree(encoded: row["tree"] as Data) } catch {
                        throw StoreError.corrupt("revision tree of \"\(id)\": \(error)")
                    }
                    for c in tree.conflicts.map(\.description).sorted() { hasher.update(data: [0] + Array(c.utf8)) }
                }
                hasher.update(data: [0x0A])
            }
            return "sha256-" + Hex.encode(hasher.finalize())
        }
    }
}
