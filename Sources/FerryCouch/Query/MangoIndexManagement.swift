import FerryCore
import FerryCouchDocuments
import FerryQuery
import FerryStore
import Foundation

// Mango index definitions over the CouchDB API: created, listed and removed as views of
// `"language": "query"` design documents (so they replicate as CouchDB's do), `_explain`,
// and the builds `_active_tasks` lists.
extension CouchDatabase {
    /// How long `POST /_index` builds a new index itself before answering: small databases
    /// have it ready at once, larger ones finish in the node's background builder.
    static let indexBuildBudget: Duration = .seconds(1)
    /// Documents indexed per build step (one short transaction).
    static let indexBuildStep = 1000
    /// Attempts at writing a design document that concurrent writers keep changing.
    static let designWriteAttempts = 5

    /// `POST /{db}/_index`: creates the index a request body describes (in its design document,
    /// which then replicates), answering CouchDB's `{"result": "created"|"exists", "id", "name"}`.
    /// The principal needs the write access a `PUT` of the design document needs.
    public func createIndex(_ body: JSON, principal: CouchPrincipal) throws -> JSON {
        let index = try MangoIndexRequest(parsing: body).index
        let id = try couchDocumentID(index.designDocument)
        var result = "exists"
        for attempt in 1...Self.designWriteAttempts {
            let (tree, current) = try currentDesignDocument(id)
            if let current, MangoDesignDocument.indexes(designDocumentID: id.rawValue, body: current).contains(index) {
                break
            }
            do {
                try writeDesignDocument(id, body: MangoDesignDocument.adding(index, to: current), tree: tree, principal: principal)
                result = "created"
                break
            } catch let error as CouchError where error.status == .conflict && attempt < Self.designWriteAttempts {
                continue
            }
        }
        try buildIndexes(for: Self.indexBuildBudget)
        return ["result": .string(result), "id": .string(index.designDocument), "name": .string(index.name)]
    }

    /// `GET /{db}/_index`: `{"total_rows", "indexes"}` with `_all_docs` first, then the JSON
    /// indexes by design document and name (building ones included), as CouchDB lists them.
    /// Indexes whose design document the principal may not read are left out.
    public func listIndexes(principal: CouchPrincipal) throws -> JSON {
        var listed: [JSON] = [Self.allDocsIndexJSON]
        for stored in try storedIndexes() where try mayRead(designDocument: stored.index.designDocument, principal: principal) {
            listed.append(Self.indexJSON(stored.index))
        }
        return ["total_rows": .int(Int64(listed.count)), "indexes": .array(listed)]
    }

    /// `DELETE /{db}/_index/{ddoc}/json/{name}`: removes the index from its design document
    /// (the document is deleted when no index is left in it). `designDocument` may omit the
    /// `_design/` prefix. 404 `not_found` when there is no such JSON index.
    public func deleteIndex(designDocument: String, name: String, principal: CouchPrincipal) throws {
        let full = designDocument.hasPrefix("_design/") ? designDocument : "_design/" + designDocument
        let id = try couchDocumentID(full)
        for attempt in 1...Self.designWriteAttempts {
            let (tree, current) = try currentDesignDocument(id)
            guard let current, try mayRead(designDocument: full, principal: principal),
                MangoDesignDocument.indexes(designDocumentID: full, body: current).contains(where: { $0.name == name })
            else { throw CouchError.notFound("missing") }
            do {
                if let remaining = MangoDesignDocument.removing(name: name, from: current) {
                    try writeDesignDocument(id, body: remaining, tree: tree, principal: principal)
                } else {
                    try deleteDesignDocument(id, current: current, tree: tree, principal: principal)
                }
                return
            } catch let error as CouchError where error.status == .conflict && attempt < Self.designWriteAttempts {
                continue
            }
        }
    }

    /// `POST /{db}/_explain`: how `query` would be answered, in CouchDB's shape.
    /// Only the indexes of design documents `principal` may read are candidates or named.
    public func explain(_ query: MangoQuery, body: JSON, principal: CouchPrincipal) throws -> JSON {
        let bound = try bindPlan(query, principal: principal, explaining: true)
        var out = bound.plan.explanation
        out["dbname"] = .string(name)
        switch bound.plan.source {
        case .allDocs: out["index"] = Self.allDocsIndexJSON
        case .index(let index): out["index"] = Self.indexJSON(index)
        }
        out["partitioned"] = false
        out["selector"] = query.selector.root.json
        let fields: JSON = .array((query.fields ?? []).map { .string($0.description) })
        var sort: [String: JSON] = [:]
        for s in query.sort { sort[s.path.description] = .string(s.descending ? "desc" : "asc") }
        out["opts"] = [
            "use_index": .array(query.useIndex.map { .string($0) }),
            "bookmark": .string(query.bookmark ?? MangoBookmark.none),
            "limit": .int(Int64(query.limit)),
            "skip": .int(Int64(query.skip)),
            "sort": .object(sort),
            "fields": fields,
            "partition": .string(query.partition ?? ""),
            "r": .int(Int64(query.r)),
            "conflicts": .bool(query.conflicts),
            "stale": false,
            "update": .bool(query.update),
            "stable": .bool(query.stable),
            "execution_stats": .bool(query.executionStats),
            "allow_fallback": .bool(query.allowFallback),
        ]
        out["limit"] = .int(Int64(query.limit))
        out["skip"] = .int(Int64(query.skip))
        out["fields"] = fields
        return .object(out)
    }

    /// CouchDB's `_active_tasks` entries of the indexes still being built.
    public func activeIndexTasks(now: Date = Date()) throws -> [JSON] {
        let stamp = JSON.int(Int64(now.timeIntervalSince1970))
        return try storedIndexes().compactMap { stored -> JSON? in
            guard case .building(let done, let total) = stored.state else { return nil }
            let progress = total > 0 ? min(100, done * 100 / total) : 0
            let task: JSON = [
                "type": "indexer", "database": .string(name), "design_document": .string(stored.index.designDocument),
                "index": .string(stored.index.name), "progress": .int(Int64(progress)), "changes_done": .int(Int64(done)),
                "total_changes": .int(Int64(total)), "started_on": stamp, "updated_on": stamp,
                "pid": .string("<ferry.index.\(stored.id)>"), "node": .string(serverUUID),
            ]
            return task
        }
    }

    /// Runs the store's index builder until nothing is left to do or `budget` has passed;
    /// returns the indexes still building.
    @discardableResult
    public func buildIndexes(for budget: Duration) throws -> [StoredMangoIndex] {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: budget)
        while true {
            let step: MangoIndexBuildStep
            do { step = try store.buildMangoIndexes(maxDocuments: Self.indexBuildStep) } catch { throw couchError(error) }
            if step.work == 0 || step.building.isEmpty || clock.now >= deadline { return step.building }
        }
    }

    // MARK: - Index JSON

    /// The `_all_docs` special index as `GET /_index` and `_explain` show it.
    static let allDocsIndexJSON: JSON = [
        "ddoc": .null, "name": "_all_docs", "type": "special", "def": ["fields": [["_id": "asc"]]],
    ]

    /// A JSON index as `GET /_index` and `_explain` show it.
    static func indexJSON(_ index: MangoIndex) -> JSON {
        var def: [String: JSON] = [
            "fields": .array(index.fields.map { .object([$0.path.description: .string($0.descending ? "desc" : "asc")]) })
        ]
        if let partial = index.partialFilter { def["partial_filter_selector"] = partial.root.json }
        return [
            "ddoc": .string(index.designDocument), "name": .string(index.name), "type": "json", "partitioned": false,
            "def": .object(def),
        ]
    }

    // MARK: - Design documents

    private func storedIndexes() throws -> [StoredMangoIndex] {
        do { return try store.mangoIndexes() } catch { throw couchError(error) }
    }

    /// Whether the principal's read rule admits a design document (by its ID; its body is
    /// read only for a rule that needs it).
    func mayRead(designDocument: String, principal: CouchPrincipal) throws -> Bool {
        let rule = principal.policy.read
        if rule.admitsEverything { return true }
        let id = DocumentID(unchecked: designDocument)
        let document: Document?
        do { document = try store.document(id) } catch { throw couchError(error) }
        return rule.admits(id: id, body: document?.body)
    }

    /// The design document's tree and its current revision in CouchDB's form (with `_id`,
    /// `_rev` and attachment stubs); nil body when it does not exist or is deleted.
    private func currentDesignDocument(_ id: DocumentID) throws -> (RevisionTree?, JSON?) {
        let tree: RevisionTree?
        do { tree = try store.revisionTree(id) } catch { throw couchError(error) }
        guard let tree, let winner = tree.winner, !winner.deleted, let revision = try view(of: id, revision: winner.id, in: tree)
        else { return (tree, nil) }
        return (tree, try render(revision, options: CouchRenderOptions(), multipart: false).json)
    }

    /// Writes `body` (CouchDB form, its `_rev` the parent) as the design document's next
    /// revision, with the checks a `PUT` of it has.
    private func writeDesignDocument(_ id: DocumentID, body: JSON, tree: RevisionTree?, principal: CouchPrincipal) throws {
        var input = try CouchDocumentInput(parsing: body)
        input.id = id.rawValue
        let edit = try prepareEdit(id: id, input: input, parentText: input.rev, tree: tree, principal: principal)
        do { _ = try store.write { txn throws(StoreError) in try apply(edit, in: txn) } } catch { throw couchError(error) }
    }

    private func deleteDesignDocument(_ id: DocumentID, current: JSON, tree: RevisionTree?, principal: CouchPrincipal) throws {
        var input = try CouchDocumentInput(parsing: .object([:]))
        input.deleted = true
        let edit = try prepareEdit(id: id, input: input, parentText: current["_rev"]?.stringValue, tree: tree, principal: principal)
        do { _ = try store.write { txn throws(StoreError) in try apply(edit, in: txn) } } catch { throw couchError(error) }
    }
}
