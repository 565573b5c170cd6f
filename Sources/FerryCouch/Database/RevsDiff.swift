import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Hummingbird

extension CouchDatabase {
    /// `POST /{db}/_revs_diff`: `{id: [rev, …]}` → for each document with revisions this
    /// node lacks, `{"missing": […], "possible_ancestors": […]}`; `possible_ancestors` (left
    /// out when empty) are the document's leaves, live or deleted, of a lower generation
    /// than some missing revision: the revisions a sender's history may continue.
    ///
    /// A document the principal may not read is answered as if it did not exist: every
    /// revision asked is missing and none is named, so the answer reveals neither which
    /// revisions exist nor what they are (Ferry revision IDs hash their bodies, so naming
    /// one would let a guesser check guesses of its content offline).
    func revsDiff(_ request: Request, principal: CouchPrincipal) async throws -> Response {
        guard let fields = try await readJSON(request).objectValue else {
            throw CouchError.badRequest("Request body must be a JSON object")
        }
        var asked: [(DocumentID, [String], [RevisionID])] = []
        for (id, value) in fields {
            guard case .array(let list) = value else {
                throw CouchError.badRequest("The revisions of \"\(id)\" must be a JSON array of revision strings.")
            }
            var texts: [String] = []
            var revs: [RevisionID] = []
            var seen = Set<String>()
            for item in list {
                guard let text = item.stringValue else {
                    throw CouchError.badRequest("The revisions of \"\(id)\" must be a JSON array of revision strings.")
                }
                guard let rev = try? RevisionID(text) else { throw CouchError.badRequest("Invalid rev format: \"\(text)\"") }
                if seen.insert(text).inserted {
                    texts.append(text)
                    revs.append(rev)
                }
            }
            asked.append((DocumentID(unchecked: id), texts, revs))
        }
        let trees = try store.revisionTrees(asked.map(\.0))
        let rule = principal.policy.read
        var answer: [String: JSON] = [:]
        for (id, texts, revs) in asked {
            let tree = trees[id].flatMap { Self.mayLearnRevisions(of: id, tree: $0, rule: rule) ? $0 : nil }
            let missing = zip(texts, revs).filter { tree?.contains($0.1) != true }
            guard !missing.isEmpty else { continue }
            var entry: [String: JSON] = ["missing": .array(missing.map { .string($0.0) })]
            if let tree {
                let highest = missing.map(\.1.generation).max() ?? 0
                let ancestors = tree.leaves.filter { $0.id.generation < highest }.map(\.id).sorted(by: >)
                if !ancestors.isEmpty { entry["possible_ancestors"] = .array(ancestors.map { .string($0.description) }) }
            }
            answer[id.rawValue] = .object(entry)
        }
        return CouchResponse.json(.object(answer))
    }

    /// Whether `_revs_diff` may tell what revisions a document holds: the read rule must
    /// admit every leaf (the winner among them), since the answer names leaves; a leaf whose
    /// body cannot be read counts as unreadable. Ferry's own documents are never shown.
    static func mayLearnRevisions(of id: DocumentID, tree: RevisionTree, rule: AccessRule) -> Bool {
        if isNodeInternal(id) { return false }
        if rule.admitsEverything { return true }
        for leaf in tree.leaves {
            let body = leaf.body.flatMap { try? JSON.parse($0) }
            guard rule.admits(id: id, body: body) else { return false }
        }
        return true
    }
}
