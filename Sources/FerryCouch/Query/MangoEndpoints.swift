import FerryCore
import FerryCouchDocuments
import FerryQuery
import Foundation
import Hummingbird
import NIOCore

// The HTTP side of Mango: `POST /{db}/_find`, `POST /{db}/_explain`, `GET|POST /{db}/_index`,
// `DELETE /{db}/_index/{ddoc}/json/{name}` and `GET /_active_tasks`.
extension CouchDatabase {
    /// `POST /{db}/_find`. The query runs on `QueryWorkers`, not on Swift's cooperative pool
    /// (which has a thread per core, and every other request needs it), within `queryTimeout`;
    /// it stops at the next document once the handling task is cancelled or, with `channel`,
    /// once the client closes its side of the connection (Hummingbird does not cancel a
    /// handler whose client went away).
    func findEndpoint(_ request: Request, principal: CouchPrincipal, channel: (any Channel)? = nil) async throws -> Response {
        try allowOnly(request, .post)
        let body = try await mangoBody(request)
        let budget = QueryBudget(timeout: queryTimeout)
        let watch = channel.map { ClientDisconnectWatch.install(on: $0, cancelling: budget) }
        defer { watch?.remove() }
        let database = self
        let answer = try await withTaskCancellationHandler {
            try await QueryWorkers.run { try database.find(body: body, principal: principal, budget: budget) }
        } onCancel: {
            budget.cancel()
        }
        var bytes = answer.encodedResponse
        bytes.append(0x0A)
        return Response(
            status: .ok, headers: [.contentType: "application/json", .cacheControl: "must-revalidate"],
            body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    /// `POST /{db}/_explain`.
    func explainEndpoint(_ request: Request, principal: CouchPrincipal) async throws -> Response {
        try allowOnly(request, .post)
        let body = try await mangoBody(request)
        let query = try Self.mango { try MangoQuery(parsing: body) }
        return CouchResponse.json(try Self.mango { try explain(query, body: body, principal: principal) })
    }

    /// `GET /{db}/_index` (with CouchDB's `limit` and `skip`) and `POST /{db}/_index`.
    func indexEndpoint(_ request: Request, principal: CouchPrincipal) async throws -> Response {
        switch request.method {
        case .get, .head:
            var listing = try listIndexes(principal: principal)
            let p = CouchParameters(request)
            guard case .array(let all)? = listing["indexes"] else { return headless(CouchResponse.json(listing), request) }
            let limit = try p.count("limit")
            let skip = try p.count("skip") ?? 0
            if limit == 0 {
                throw CouchError(.badRequest, "invalid_list_index_params", "Index parameter ranges: limit > 1, skip > 0")
            }
            if var members = listing.objectValue {
                members["indexes"] = .array(Array(all.dropFirst(skip).prefix(limit ?? .max)))
                listing = .object(members)
            }
            return headless(CouchResponse.json(listing), request)
        case .post:
            let body = try await mangoBody(request)
            return CouchResponse.json(try Self.mango { try createIndex(body, principal: principal) })
        default:
            throw CouchError.methodNotAllowed("GET,POST")
        }
    }

    /// `/{db}/_index/…`: `DELETE /{db}/_index/{ddoc}/json/{name}` (the design document's ID
    /// with or without `_design/`, its slash escaped or not).
    func indexItemEndpoint(_ request: Request, principal: CouchPrincipal, path: [String]) async throws -> Response {
        var parts = path
        if parts.count == 4 && parts[0] == "_design" { parts = ["_design/" + parts[1], parts[2], parts[3]] }
        guard parts.count == 3 else { throw CouchError.notFound("missing") }
        guard request.method == .delete else { throw CouchError.methodNotAllowed("DELETE") }
        guard parts[1] == "json" else { throw CouchError.notFound("missing") }
        try deleteIndex(designDocument: parts[0], name: parts[2], principal: principal)
        return CouchResponse.json(["ok": true])
    }

    /// `GET /_active_tasks` (server admins only, as in CouchDB): the Mango indexes being built.
    func activeTasksEndpoint(_ request: Request, context: CouchRequestContext) async throws -> Response {
        let principal = try context.requirePrincipal()
        try allow(request, [.get, .head], "GET,HEAD")
        guard principal == .admin else { throw CouchError.unauthorized("You are not a server admin.") }
        return headless(CouchResponse.json(.array(try activeIndexTasks())), request)
    }

    /// Answers a `_find` request body as `POST /{db}/_find` does: a refused query throws
    /// CouchDB's 400 `CouchError`; see `find(_:principal:budget:)` for the budget.
    public func find(body: JSON, principal: CouchPrincipal, budget: QueryBudget = QueryBudget(timeout: nil)) throws
        -> MangoFindResult
    {
        try Self.mango { try find(try MangoQuery(parsing: body), principal: principal, budget: budget) }
    }

    // MARK: - Helpers

    /// Runs `body`, turning a `MangoError` into CouchDB's `{"error", "reason"}` answer.
    static func mango<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch let error as MangoError {
            throw CouchError(HTTPResponse.Status(code: error.failure.httpStatus), error.code, error.description)
        }
    }

    /// A Mango request's JSON body: `Content-Type: application/json` as CouchDB requires,
    /// and a JSON object.
    func mangoBody(_ request: Request) async throws -> JSON {
        guard Multipart.mediaType(request.headers[.contentType]) == "application/json" else {
            throw CouchError.unsupportedMediaType("Content-Type must be application/json")
        }
        let body = try await readJSON(request)
        guard case .object = body else { throw CouchError.badRequest("Request body must be a JSON object") }
        return body
    }

    /// 405 with CouchDB's `Only M allowed` unless the request uses `method`.
    private func allowOnly(_ request: Request, _ method: HTTPRequest.Method) throws(CouchError) {
        guard request.method == method else { throw .methodNotAllowed(method.rawValue) }
    }
}
