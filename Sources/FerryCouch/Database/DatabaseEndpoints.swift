import FerryCore
import FerryCouchDocuments
import FerryStore
import Hummingbird
import NIOCore

// The server and database-level endpoints: `/`, `/_up`, `/_all_dbs`, `/{db}`, and the
// dispatch of `/{db}/_changes`, `_all_docs`, `_revs_diff`, `_local`, `_ensure_full_commit`,
// `_revs_limit`.
extension CouchDatabase {
    /// The CouchDB version Ferry answers as: the 3.x line whose API it serves.
    static let couchVersion = "3.4.0"

    func welcome(_ request: Request, context: CouchRequestContext) async throws -> Response {
        try allow(request, [.get, .head], "GET,HEAD")
        let body: JSON = [
            "couchdb": "Welcome", "version": .string(Self.couchVersion), "git_sha": "ferry",
            "uuid": .string(serverUUID), "features": [],
            "vendor": ["name": "Ferry", "version": .string(vendorVersion)],
        ]
        return headless(CouchResponse.json(body), request)
    }

    func up(_ request: Request, context: CouchRequestContext) async throws -> Response {
        try allow(request, [.get, .head], "GET,HEAD")
        return headless(CouchResponse.json(["status": "ok", "seeds": [:]]), request)
    }

    /// The node's one database, through the list options as CouchDB applies them.
    func allDbs(_ request: Request, context: CouchRequestContext) async throws -> Response {
        _ = try context.requirePrincipal()
        try allow(request, [.get, .head], "GET,HEAD")
        let p = CouchParameters(request)
        let descending = try p.bool("descending")
        let limit = try p.count("limit") ?? .max
        let skip = try p.count("skip") ?? 0
        var names = [name]
        for (key, isStart) in [("startkey", true), ("start_key", true), ("endkey", false), ("end_key", false)] {
            guard let bound = try p.json(key) else { continue }
            guard let b = bound.stringValue else { throw CouchError.badRequest("Query parameter `\(key)` must be a JSON string.") }
            let below = descending == isStart  // the start bounds from above when descending
            names = names.filter { below ? $0 <= b : $0 >= b }
        }
        let listed = names.dropFirst(skip).prefix(limit)
        return headless(CouchResponse.json(.array(listed.map { .string($0) })), request)
    }

    /// `GET|HEAD /{db}` (info), `PUT /{db}` (412: it exists; any other name: 403),
    /// `DELETE /{db}` (403: a node's database is not deleted over this API).
    func databaseEndpoint(_ request: Request, context: CouchRequestContext) async throws -> Response {
        let principal = try context.requirePrincipal()
        let requested = CouchRouting.endpoint(rawPath: request.uri.path).flatMap { endpoint -> String? in
            if case .database(let db) = endpoint { return db }
            return nil
        }
        switch request.method {
        case .get, .head:
            return headless(CouchResponse.json(try databaseInfo()), request)
        case .put:
            guard principal == .admin else {
                throw CouchError.unauthorized("You are not a server admin.")
            }
            guard requested == name else {
                throw CouchError.forbidden(
                    "This node serves one database, \"\(name)\" (its group's name); it cannot create \"\(requested ?? "")\".")
            }
            throw CouchError(.preconditionFailed, "file_exists", "The database could not be created, the file already exists.")
        case .post:
            return try await postDocument(request, context: context)
        case .delete:
            throw CouchError.forbidden(
                "The database \"\(name)\" is the node's own and cannot be deleted over the CouchDB API; delete documents, or remove the node's data directory.")
        default:
            throw CouchError.methodNotAllowed("GET,HEAD,PUT,DELETE,POST")
        }
    }

    /// CouchDB's database information object.
    func databaseInfo() throws -> JSON {
        let info = try store.info()
        let size = Int64(clamping: info.sizeOnDisk)
        return [
            "db_name": .string(name),
            "update_seq": CouchSequence(value: info.lastSequence).json,
            "purge_seq": 0,
            "doc_count": .int(Int64(info.documentCount)),
            "doc_del_count": .int(Int64(info.deletedCount)),
            "instance_start_time": .string(instanceStartTime),
            "sizes": ["file": .int(size), "external": .int(size), "active": .int(size)],
            "props": [:],
            "compact_running": false,
            "disk_format_version": 8,
            "cluster": ["q": 1, "n": 1, "w": 1, "r": 1],
        ]
    }

    /// `/{db}/_changes`, `_all_docs`, `_revs_diff`, `_ensure_full_commit`, `_revs_limit`,
    /// `_local_docs`, and Mango's `_find`, `_explain`, `_index`; any other `_name` is 400 as CouchDB answers it.
    func databaseSpecial(_ name: String, _ request: Request, context: CouchRequestContext) async throws -> Response {
        let principal = try context.requirePrincipal()
        switch name {
        case "changes":
            try allow(request, [.get, .head, .post], "GET,HEAD,POST")
            return try await changes(request, principal: principal, current: context.currentPrincipal)
        case "all_docs":
            try allow(request, [.get, .head, .post], "GET,HEAD,POST")
            return try await allDocs(request, principal: principal)
        case "design_docs":
            try allow(request, [.get, .head, .post], "GET,HEAD,POST")
            return try await allDocs(request, principal: principal, designOnly: true)
        case "revs_diff":
            try allow(request, [.post], "POST")
            return try await revsDiff(request, principal: principal)
        case "local_docs":
            try allow(request, [.get, .head, .post], "GET,HEAD,POST")
            return try await localDocs(request, principal: principal)
        case "ensure_full_commit":
            try allow(request, [.post], "POST")
            try store.flushToDisk()
            // The same start time as the database info: a replicator that sees it change assumes a restart.
            return CouchResponse.json(["ok": true, "instance_start_time": .string(instanceStartTime)], status: .created)
        case "revs_limit":
            return try await revsLimit(request, principal: principal)
        case "find":
            return try await findEndpoint(request, principal: principal, channel: context.channel)
        case "explain":
            return try await explainEndpoint(request, principal: principal)
        case "index":
            return try await indexEndpoint(request, principal: principal)
        case "blipsync":
            // Reached only when the front door did not upgrade the request (see MobileAdmission).
            if request.headers[.origin] != nil {
                throw CouchError.forbidden("A web page may not open a Couchbase Lite replication.")
            }
            throw CouchError.badRequest(
                "_blipsync is Couchbase Lite's replication endpoint: it needs a WebSocket upgrade (GET with Upgrade: websocket) "
                    + "offering the subprotocol \(MobileAdmission.subprotocols.joined(separator: " or ")).")
        default:
            throw CouchError(.badRequest, "illegal_docid", "Only reserved document ids may start with underscore.")
        }
    }

    /// `GET /{db}/_revs_limit`: the store's history depth. `PUT` accepts a positive number
    /// and answers ok without changing it: the depth is the node's configuration.
    func revsLimit(_ request: Request, principal: CouchPrincipal) async throws -> Response {
        switch request.method {
        case .get, .head:
            return headless(CouchResponse.json(.int(Int64(store.options.maxRevisionDepth))), request)
        case .put:
            guard principal == .admin else { throw CouchError.unauthorized("You are not a server admin.") }
            let value = try await readJSON(request)
            guard let n = value.intValue, n > 0 else {
                throw CouchError.badRequest("The revs limit must be a positive integer.")
            }
            logger.info(
                "revs_limit set over the CouchDB API is not applied; the store keeps its configured depth",
                metadata: ["requested": "\(n)", "depth": "\(store.options.maxRevisionDepth)"])
            return CouchResponse.json(["ok": true])
        default:
            throw CouchError.methodNotAllowed("GET,HEAD,PUT")
        }
    }

    /// 405 unless the request's method is one of `methods`.
    func allow(_ request: Request, _ methods: [HTTPRequest.Method], _ names: String) throws(CouchError) {
        guard methods.contains(request.method) else { throw .methodNotAllowed(names) }
    }

    /// The response without its body for a HEAD request (headers kept).
    func headless(_ response: Response, _ request: Request) -> Response {
        guard request.method == .head else { return response }
        var r = response
        r.body = ResponseBody()
        return r
    }
}
