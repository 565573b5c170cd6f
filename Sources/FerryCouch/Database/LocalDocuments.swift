import FerryCore
import FerryStore
import Hummingbird

/// CouchDB's `_local` documents kept in the store's local documents (never replicated),
/// under a key prefix none of Ferry's own local documents (checkpoints, coverage) uses.
/// Stored as `{"rev": N, "doc": body}`; served with `_rev` `0-N`.
enum CouchLocalDocuments {
    static let keyPrefix = "couch/local/"

    static func key(_ id: String) -> String { keyPrefix + id }

    /// The revision counter of `_rev`, `0-N`; nil for anything else.
    static func counter(_ rev: String) -> Int64? {
        guard rev.hasPrefix("0-"), let n = Int64(rev.dropFirst(2)), n >= 0, String(n) == rev.dropFirst(2) else { return nil }
        return n
    }

    static func rendered(id: String, stored: JSON) -> JSON {
        var fields = stored["doc"]?.objectValue ?? [:]
        fields["_id"] = .string("_local/" + id)
        fields["_rev"] = .string("0-\(stored["rev"]?.intValue ?? 0)")
        return .object(fields)
    }
}

extension CouchDatabase {
    /// `GET|HEAD|PUT|DELETE /{db}/_local/{id}`: open to every authenticated principal, as
    /// replicators keep their checkpoints there; `_rev` must name the current version.
    func localDocument(_ request: Request, context: CouchRequestContext, id: String) async throws -> Response {
        _ = try context.requirePrincipal()
        guard !id.isEmpty else { throw CouchError.badRequest("Local document ID must not be empty.") }
        let key = CouchLocalDocuments.key(id)
        let p = CouchParameters(request)
        switch request.method {
        case .get, .head:
            guard let stored = try store.localDocument(key) else { throw CouchError.notFound("missing") }
            var response = CouchResponse.json(CouchLocalDocuments.rendered(id: id, stored: stored))
            response.headers[.eTag] = "\"0-\(stored["rev"]?.intValue ?? 0)\""
            return headless(response, request)
        case .put:
            guard var fields = try await readJSON(request).objectValue else {
                throw CouchError(.badRequest, "bad_request", "Document must be a JSON object")
            }
            if let given = fields["_id"], given.stringValue != "_local/" + id {
                throw CouchError.badRequest("The document's _id does not match its URL.")
            }
            let rev = try fields["_rev"].map { v throws(CouchError) -> String in
                guard let s = v.stringValue else { throw CouchError.badRequest("_rev must be a string.") }
                return s
            } ?? p.string("rev")
            let deleted = fields["_deleted"]?.boolValue ?? false
            for k in ["_id", "_rev", "_deleted", "_revisions"] { fields.removeValue(forKey: k) }
            if let bad = fields.keys.first(where: { $0.hasPrefix("_") }) {
                throw CouchError(.badRequest, "doc_validation", "Bad special document member: \(bad)")
            }
            if deleted { return try deleteLocal(id: id, rev: rev) }
            let given = try checkRev(rev)
            // The last write wins, as in CouchDB 3: a replicator rewrites its checkpoint
            // with whatever `_rev` it last read, or none.
            while true {
                let current = try store.localDocument(key)
                let next = max(current?["rev"]?.intValue ?? 0, given) + 1
                let stored: JSON = ["rev": .int(next), "doc": .object(fields)]
                if try store.replaceLocalDocument(key, expected: current, with: stored) {
                    return CouchResponse.json(
                        ["ok": true, "id": .string("_local/" + id), "rev": .string("0-\(next)")], status: .created)
                }
            }
        case .delete:
            return try deleteLocal(id: id, rev: p.string("rev") ?? request.headers[.ifMatch].map { $0.trimmingQuotes })
        default:
            throw CouchError.methodNotAllowed("GET,HEAD,PUT,DELETE")
        }
    }

    private func deleteLocal(id: String, rev: String?) throws -> Response {
        let key = CouchLocalDocuments.key(id)
        _ = try checkRev(rev)
        while true {
            guard let current = try store.localDocument(key) else { throw CouchError.notFound("missing") }
            if try store.replaceLocalDocument(key, expected: current, with: nil) {
                return CouchResponse.json(["ok": true, "id": .string("_local/" + id), "rev": "0-0"])
            }
        }
    }

    /// The counter of a write's `_rev` (`0-N`; 0 when none is named). As in CouchDB 3 it
    /// need not be the current one: local documents are never in conflict.
    private func checkRev(_ rev: String?) throws(CouchError) -> Int64 {
        guard let rev else { return 0 }
        guard let n = CouchLocalDocuments.counter(rev) else {
            throw CouchError.badRequest("Invalid rev format: a local document's revision is 0-N, not \"\(rev)\".")
        }
        return n
    }

    /// `GET|POST /{db}/_local_docs`: the local documents in ID order, as `_all_docs` lists documents.
    func localDocs(_ request: Request, principal: CouchPrincipal) async throws -> Response {
        var p = CouchParameters(request)
        if request.method == .post { p.merge(body: try await readOptionalObject(request)) }
        let descending = try p.bool("descending")
        let includeDocs = try p.bool("include_docs")
        let skip = try p.count("skip") ?? 0
        let limit = try p.count("limit") ?? .max
        var all = try store.localDocuments(prefix: CouchLocalDocuments.keyPrefix)
        if descending { all.reverse() }
        let rows: [JSON] = all.dropFirst(skip).prefix(limit).map { entry in
            let id = String(entry.id.dropFirst(CouchLocalDocuments.keyPrefix.count))
            var row: [String: JSON] = [
                "id": .string("_local/" + id), "key": .string("_local/" + id),
                "value": ["rev": .string("0-\(entry.body["rev"]?.intValue ?? 0)")],
            ]
            if includeDocs { row["doc"] = CouchLocalDocuments.rendered(id: id, stored: entry.body) }
            return .object(row)
        }
        return headless(CouchResponse.json(["total_rows": .null, "offset": .null, "rows": .array(rows)]), request)
    }
}

fileprivate extension String {
    /// The string without one pair of surrounding double quotes (an ETag or If-Match value).
    var trimmingQuotes: String {
        count >= 2 && hasPrefix("\"") && hasSuffix("\"") ? String(dropFirst().dropLast()) : self
    }
}
