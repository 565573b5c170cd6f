import FerryCore
import Foundation
@testable import FerryStore

/// A temporary directory removed when the test's scope ends.
final class TemporaryDirectory {
    let path: String
    init() {
        path = NSTemporaryDirectory() + "ferry-test-" + UUID().uuidString
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

func docID(_ s: String) -> DocumentID { try! DocumentID(s) }

/// Everything observable about a store's documents, to prove that a failed operation changed nothing.
func snapshot(_ store: DocumentStore) throws -> [String] {
    var out = ["seq=\(try store.lastSequence)"]
    for d in try store.allDocuments(includeDeleted: true) {
        let tree = try store.revisionTree(d.id)!
        out.append("\(d.id) \(d.revision) \(d.deleted) \(tree.revisions.map(\.id.description))")
    }
    return out
}

/// The incoming form of a revision held in `store`, as a replicator would send it.
func incoming(_ store: DocumentStore, _ id: DocumentID, _ rev: RevisionID) throws -> IncomingRevision {
    let tree = try store.revisionTree(id)!
    let r = tree.revision(rev)!
    return IncomingRevision(
        id: id, revision: rev, history: Array(tree.history(of: rev).dropFirst()), deleted: r.deleted,
        body: try JSON.parse(r.body!), hlc: r.hlc)
}

