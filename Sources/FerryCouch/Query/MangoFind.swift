import FerryCore
import FerryQuery
import FerryStore
import Foundation

/// The answer to one `_find`: the documents of the page, the bookmark of the next page,
/// warnings, and the execution statistics when asked for.
public struct MangoFindResult: Sendable {
    public var docs: [JSON]
    public var bookmark: String
    public var warnings: [String]
    /// CouchDB's `execution_stats` object, present when the query asked for it.
    public var executionStats: JSON?

    public init(docs: [JSON], bookmark: String, warnings: [String], executionStats: JSON? = nil) {
        self.docs = docs
        self.bookmark = bookmark
        self.warnings = warnings
        self.executionStats = executionStats
    }

    /// The response body CouchDB sends: `docs`, `bookmark`, then `execution_stats` and
    /// `warning` when present.
    public var json: JSON {
        var out: [String: JSON] = ["docs": .array(docs), "bookmark": .string(bookmark)]
        if let executionStats { out["execution_stats"] = executionStats }
        if !warnings.isEmpty { out["warning"] = .string(warnings.joined(separator: "\n")) }
        return .object(out)
    }
}

extension CouchDatabase {
    /// Answers a parsed `_find` for `principal`: documents it may not read are never
    /// returned. Throws `MangoError` for a query CouchDB refuses.
    public func find(_ query: MangoQuery, principal: CouchPrincipal) throws -> MangoFindResult {
        // Minimal until the finder lands: a full `_all_docs` scan, no bookmark.
        let plan = try QueryPlanner.plan(query, ready: [])
        var docs: [JSON] = []
        var skipped = 0
        var after: ScanPosition?
        scanning: while docs.count < query.limit {
            let page = try store.scan(.allDocs, range: .all, descending: plan.descending, after: after, limit: 500)
            if page.isEmpty { break }
            for found in page {
                after = found.position
                if found.id.rawValue.hasPrefix("_design/") || Self.isNodeInternal(found.id) { continue }
                let body = try JSON.parse(found.body)
                guard principal.policy.read.admits(id: found.id, body: body) else { continue }
                let view = RevisionView(
                    id: found.id, revision: found.revision, deleted: false, body: body, tree: nil, sequence: nil)
                let doc = try render(view, options: CouchRenderOptions(), multipart: false).json
                guard query.selector.matches(doc) else { continue }
                if skipped < query.skip {
                    skipped += 1
                    continue
                }
                docs.append(query.project(doc))
                if docs.count >= query.limit { break scanning }
            }
        }
        return MangoFindResult(docs: docs, bookmark: "nil", warnings: plan.warnings)
    }

    /// `POST /{db}/_index`: creates the index a request body describes (in its design document,
    /// which then replicates), answering CouchDB's `{"result": "created"|"exists", "id", "name"}`.
    public func createIndex(_ body: JSON, principal: CouchPrincipal) throws -> JSON {
        throw CouchError(.notImplemented, "not_implemented", "_index is not served yet")
    }

    /// `GET /{db}/_index`: `{"total_rows", "indexes"}` with `_all_docs` first, as CouchDB lists them.
    public func listIndexes(principal: CouchPrincipal) throws -> JSON {
        throw CouchError(.notImplemented, "not_implemented", "_index is not served yet")
    }

    /// `DELETE /{db}/_index/{ddoc}/json/{name}`: removes the index from its design document
    /// (the document is deleted when no index is left in it).
    public func deleteIndex(designDocument: String, name: String, principal: CouchPrincipal) throws {
        throw CouchError(.notImplemented, "not_implemented", "_index is not served yet")
    }
}
