import Crypto
import FerryCore
import Foundation
import GRDB

/// One subset of a store's documents to digest apart: those `admits` keeps. `admits` gets the
/// document's ID and a way to read its revision tree (decoded only when asked).
public struct ContentView: Sendable {
    public let admits: @Sendable (DocumentID, () throws -> RevisionTree) -> Bool

    public init(admits: @escaping @Sendable (DocumentID, () throws -> RevisionTree) -> Bool) { self.admits = admits }
}

extension DocumentStore {
    /// A digest of what the store holds, equal on two stores if and only if they hold the
    /// same document IDs with the same current revisions and the same conflicting leaves.
    ///
    /// SHA-256 over, for each document in ID order (byte order of the UTF-8 ID, tombstones
    /// included): `id 0x00 currentRev 0x00 conflict1 0x00 conflict2 … 0x0A`, conflicts being
    /// the live non-winning leaves in ascending revision order. Sequences, local documents,
    /// bodies of old revisions and blobs do not count: they differ between converged peers.
    /// Hex of the hash, prefixed `sha256-`. Reads one snapshot; O(documents).
    public func contentDigest() throws(StoreError) -> String { try contentDigests(views: []).full }

    /// The whole store's digest (`contentDigest()`) and, from the same snapshot and scan, one
    /// digest per view over only the documents it admits (same encoding).
    public func contentDigests(views: [ContentView]) throws(StoreError) -> (full: String, views: [String]) {
        try read { db in
            var full = SHA256()
            var partial = views.map { _ in SHA256() }
            // The winner's body lives in its own column; a view that judges bodies reads it too.
            let columns = views.isEmpty ? "id, rev, conflicted, tree" : "id, rev, conflicted, tree, body"
            let cursor = try Row.fetchCursor(db, sql: "SELECT \(columns) FROM documents ORDER BY id")
            while let row = try cursor.next() {
                let id: String = row["id"]
                var decoded: RevisionTree?
                func tree() throws -> RevisionTree {
                    if let decoded { return decoded }
                    do {
                        var t = try RevisionTree(encoded: row["tree"] as Data)
                        if !views.isEmpty, let w = t.winnerIndex, let body = row["body"] as Data? { t.restoreBody(Array(body), at: w) }
                        decoded = t
                        return t
                    } catch { throw StoreError.corrupt("revision tree of \"\(id)\": \(error)") }
                }
                var line = Array(id.utf8) + [0]
                line += Array((row["rev"] as String).utf8)
                if row["conflicted"] as Bool {
                    for c in try tree().conflicts.map(\.description).sorted() { line += [0] + Array(c.utf8) }
                }
                line.append(0x0A)
                full.update(data: line)
                guard !views.isEmpty else { continue }
                let docID = DocumentID(unchecked: id)
                for (i, view) in views.enumerated() where view.admits(docID, tree) { partial[i].update(data: line) }
            }
            return ("sha256-" + Hex.encode(full.finalize()), partial.map { "sha256-" + Hex.encode($0.finalize()) })
        }
    }
}
