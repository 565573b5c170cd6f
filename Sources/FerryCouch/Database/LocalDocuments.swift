import FerryCore
import FerryCouchDocuments
import FerryStore
import Hummingbird

/// CouchDB's `_local` documents kept in the store's local documents (never replicated),
/// under a key prefix none of Ferry's own local documents (checkpoints, coverage) uses.
/// Stored as `{"rev": N, "doc": body, "owner": name}`; served with `_rev` `0-N`. Every
/// authenticated principal may write them (a read-only user's replicator keeps its checkpoints
/// there), but a user owns what it creates: at most `maxPerUser` documents of at most
/// `maxUserBytes` each, and no other user may change or delete them.
enum CouchLocalDocuments {
    static let keyPrefix = "couch/local/"
    /// `_local` documents one user may own: a replicator needs one per replication.
    static let maxPerUser = 100
    /// The largest `_local` body a user may write: a checkpoint with its history is a few KiB.
    static let maxUserBytes = 64 * 1024

    static func key(_ id: String) -> String { keyPrefix + id }

    /// The revision counter of `_rev`, `0-N`; nil for anything else.
    static func counter(_ rev: String) -> Int64? {
        guard rev.hasPrefix("0-"), let n = Int64(rev.dropFirst(2)), n >= 0, String(n) == rev.dropFirst(2) else { return nil }
        return n
    }

    /// Whether `principal` may see the stored `_local` document at all (read, list, count):
    /// a user whose read rule is restricted sees only the ones it owns and those stored before
    /// owners were recorded, since another's may hold anything. The one predicate of
    /// `GET /{db}/_local/{id}` and `_local_docs`.
    static func isVisible(_ stored: JSON, to principal: CouchPrincipal) -> Bool {
        guard case .user(let name, let policy) = principal, !policy.read.admitsEverything else { return true }
        guard let owner = stored["owner"]?.stringValue else { return true }
        return owner == name
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
    /// replicators keep their checkpoints there (a user whose reading is restricted reads only
    /// its own); `_rev` must name the current version.
    func localDocument(_ request: Request, context: CouchRequestContext, id: String) async throws -> Response {
        _ = try context.requirePrincipal()
        guard !id.isEmpty else { throw CouchError.badRequest("Local document ID must not be empty.") }
        let key = CouchLocalDocuments.key(id)
        let p = CouchParameters(request)
        switch request.method {
        case .get, .head:
            guard let stored = try store.localDocument(key),
                CouchLocalDocuments.isVisible(stored, to: try context.requirePrincipal())
            else { throw CouchError.notFound("missing") }
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
            let principal = try context.requirePrincipal()
            if deleted { return try deleteLocal(id: id, rev: rev, principal: principal) }
            let given = try checkRev(rev)
            if principal != .admin, JSON.object(fields).canonicalString.utf8.count > CouchLocalDocuments.maxUserBytes {
                throw CouchError.tooLarge("A user's _local document is at most \(CouchLocalDocuments.maxUserBytes) bytes.")
            }
            // The last write wins, as in CouchDB 3: a replicator rewrites its checkpoint
            // with whatever `_rev` it last read, or none.
            while true {
                let current = try store.localDocument(key)
                try checkOwnership(current, principal: principal, creating: current == nil)
                let next = max(current?["rev"]?.intValue ?? 0, given) + 1
                let owner = current?["owner"] ?? .string(principal.name)
                let stored: JSON = ["rev": .int(next), "doc": .object(fields), "owner": owner]
                if try store.replaceLocalDocument(key, expected: current, with: stored) {
                    return CouchResponse.json(
                        ["ok": true, "id": .string("_local/" + id), "rev": .string("0-\(next)")], status: .created)
                }
            }
        case .delete:
            return try deleteLocal(
                id: id, rev: p.string("rev") ?? request.headers[.ifMatch].map { $0.trimmingQuotes }, principal: try context.requirePrincipal())
        default:
            throw CouchError.methodNotAllowed("GET,HEAD,PUT,DELETE")
        }
    }

    private func deleteLocal(id: String, rev: String?, principal: CouchPrincipal) throws -> Response {
        let key = CouchLocalDocuments.key(id)
        _ = try checkRev(rev)
        while true {
            guard let current = try store.localDocument(key) else { throw CouchError.notFound("missing") }
            try checkOwnership(current, principal: principal, creating: false)
            if try store.replaceLocalDocument(key, expected: current, with: nil) {
                return CouchResponse.json(["ok": true, "id": .string("_local/" + id), "rev": "0-0"])
            }
        }
    }

    /// A user may change only the `_local` documents it created (or ones older than owners),
    /// and create one only while it owns fewer than `maxPerUser`; the admin key may do anything.
    func checkOwnership(_ current: JSON?, principal: CouchPrincipal, creating: Bool) throws {
        guard case .user(let name, _) = principal else { return }
        if let owner = current?["owner"]?.stringValue, owner != name {
            throw CouchError.forbidden("This _local document belongs to another user.")
        }
        guard creating else { return }
        let owned = try store.localDocuments(prefix: CouchLocalDocuments.keyPrefix).count { $0.body["owner"]?.stringValue == name }
        if owned >= CouchLocalDocuments.maxPerUser {
            throw CouchError.forbidden("A user may own at most \(CouchLocalDocuments.maxPerUser) _local documents; delete some first.")
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

    /// `GET|POST /{db}/_local_docs`: the local documents in ID order, with `_all_docs`' options
    /// (`keys`, `key`, key ranges, `descending`, `skip`, `limit`, `include_docs`). Only those
    /// `GET /{db}/_local/{id}` would show the principal are listed, matched by `keys` or
    /// skipped over; `total_rows` and `offset` are null, as in CouchDB 3, so nothing is counted.
    func localDocs(_ request: Request, principal: CouchPrincipal) async throws -> Response {
        var p = CouchParameters(request)
        if request.method == .post { p.merge(body: try await readOptionalObject(request)) }
        let options = try AllDocsOptions(p)
        let visible: [(id: String, body: JSON)] = try store.localDocuments(prefix: CouchLocalDocuments.keyPrefix).compactMap { entry in
            guard CouchLocalDocuments.isVisible(entry.body, to: principal) else { return nil }
            return ("_local/" + entry.id.dropFirst(CouchLocalDocuments.keyPrefix.count), entry.body)
        }
        func row(_ id: String, _ stored: JSON) -> JSON {
            var row: [String: JSON] = [
                "id": .string(id), "key": .string(id), "value": ["rev": .string("0-\(stored["rev"]?.intValue ?? 0)")],
            ]
            if options.includeDocs {
                row["doc"] = CouchLocalDocuments.rendered(id: String(id.dropFirst("_local/".count)), stored: stored)
            }
            return .object(row)
        }
        var rows: [JSON] = []
        if let keys = options.keys {
            // Keyed by bytes: IDs are byte strings, and `String` keys merge equivalent forms.
            let byID = Dictionary(visible.map { (Array($0.id.utf8), $0.body) }, uniquingKeysWith: { a, _ in a })
            let ordered = options.range.descending ? Array(keys.reversed()) : keys
            for key in ordered.dropFirst(options.skip).prefix(options.limit) {
                rows.append(byID[Array(key.utf8)].map { row(key, $0) } ?? ["key": .string(key), "error": "not_found"])
            }
        } else {
            var listed = visible.filter { options.range.admits($0.id) }
            if options.range.descending { listed.reverse() }
            rows = listed.dropFirst(options.skip).prefix(options.limit).map { row($0.id, $0.body) }
        }
        return headless(CouchResponse.json(["total_rows": .null, "offset": .null, "rows": .array(rows)]), request)
    }
}

extension DocumentIDRange {
    /// Whether `id` lies within the range, comparing raw UTF-8 bytes as the store orders IDs.
    func admits(_ id: String) -> Bool {
        func before(_ a: String, _ b: String) -> Bool { a.utf8.lexicographicallyPrecedes(b.utf8) }
        // In iteration order: ascending, low to high; descending, high to low.
        func precedes(_ a: String, _ b: String) -> Bool { descending ? before(b, a) : before(a, b) }
        // Bytes, not `==`: Swift's string equality would merge canonically equivalent IDs.
        func same(_ a: String, _ b: String) -> Bool { a.utf8.elementsEqual(b.utf8) }
        if let start, precedes(id, start) || (!startInclusive && same(id, start)) { return false }
        if let end, precedes(end, id) || (!endInclusive && same(id, end)) { return false }
        return true
    }
}

fileprivate extension String {
    /// The string without one pair of surrounding double quotes (an ETag or If-Match value).
    var trimmingQuotes: String {
        count >= 2 && hasPrefix("\"") && hasSuffix("\"") ? String(dropFirst().dropLast()) : self
    }
}
