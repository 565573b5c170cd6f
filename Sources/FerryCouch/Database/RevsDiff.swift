import FerryCore
import FerryStore
import Hummingbird

extension CouchDatabase {
    /// `POST /{db}/_revs_diff`: `{id: [rev, …]}` → for each document with revisions this
    /// node lacks, `{"missing": […], "possible_ancestors": […]}`; `possible_ancestors` (left
    /// out when empty) are the document's leaves, live or deleted, of a lower generation
    /// than some missing revision: the revisions a sender's history may continue.
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
            for item in list {
                guard let text = item.stringValue else {
                    throw CouchError.badRequest("The revisions of \"\(id)\" must be a JSON array of revision strings.")
                }
                guard let rev = try? RevisionID(text) else { throw CouchError.badRequest("Invalid rev format: \"\(text)\"") }
                if !texts.contains(text) {
                    texts.append(text)
                    revs.append(rev)
                }
            }
            asked.append((DocumentID(unchecked: id), texts, revs))
        }
        let trees = try store.revisionTrees(asked.map(\.0))
        var answer: [String: JSON] = [:]
        for (id, texts, revs) in asked {
            let tree = trees[id]
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
}
