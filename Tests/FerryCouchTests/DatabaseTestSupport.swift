import FerryCore
import FerryCouch
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore

/// Serves every request through `CouchDatabase.respond` as one principal, turning thrown
/// errors into their responses as the node's server does.
struct DatabaseTestResponder: HTTPResponder {
    typealias Context = CouchRequestContext
    let database: CouchDatabase
    let principal: CouchPrincipal?

    func respond(to request: Request, context: CouchRequestContext) async throws -> Response {
        var context = context
        context.principal = principal
        do {
            return try await database.respond(request, context: context)
        } catch let error as CouchError {
            return try error.response(from: request, context: context)
        }
    }
}

/// A CouchDB database over a store in a temporary directory, for the database-level endpoints' tests.
final class DatabaseFixture: Sendable {
    let directory: String
    let store: DocumentStore
    let database: CouchDatabase

    init(name: String = "ferry") throws {
        directory = NSTemporaryDirectory() + "ferry-couchdb-\(UUID().uuidString)"
        store = try DocumentStore.open(directory: directory)
        database = CouchDatabase(name: name, store: store, instanceStartTime: "1700000000000000", serverUUID: "test-uuid")
    }

    /// A database over the same directory, as after a node restart.
    func reopened() throws -> CouchDatabase {
        CouchDatabase(
            name: database.name, store: try DocumentStore.open(directory: directory), instanceStartTime: "2",
            serverUUID: "test-uuid")
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    /// Runs `body` with a client whose requests reach `database` (default this fixture's) as `principal`.
    func test(
        as principal: CouchPrincipal? = .admin, database: CouchDatabase? = nil,
        _ body: @Sendable (DatabaseClient) async throws -> Void
    ) async throws {
        let app = Application(responder: DatabaseTestResponder(database: database ?? self.database, principal: principal))
        try await app.test(.router) { client in try await body(DatabaseClient(client: client)) }
    }

    @discardableResult
    func put(_ id: String, _ body: JSON, parent: RevisionID? = nil) throws -> RevisionID {
        try store.put(DocumentID(unchecked: id), body: body, parent: parent)
    }

    /// Stores two generation-1 revisions of `id` side by side: a conflict.
    func conflict(_ id: String, _ a: JSON, _ b: JSON) throws -> [RevisionID] {
        let revs = [a, b].map { RevisionID.compute(parent: nil, deleted: false, canonicalBody: $0.canonicalBytes) }
        _ = try store.insertRevisions([
            IncomingRevision(id: DocumentID(unchecked: id), revision: revs[0], history: [], deleted: false, body: a),
            IncomingRevision(id: DocumentID(unchecked: id), revision: revs[1], history: [], deleted: false, body: b),
        ])
        return revs
    }
}

/// One answer: status, text, the body as JSON (nil if it is not one), headers.
struct DatabaseAnswer: Sendable {
    let status: Int
    let text: String
    let json: JSON?
    let headers: HTTPFields

    subscript(_ key: String) -> JSON? { json?[key] }
    var error: String? { json?["error"]?.stringValue }
    /// The lines of a line-oriented (continuous) feed, empty ones included.
    var lines: [Substring] { text.split(separator: "\n", omittingEmptySubsequences: false) }
    /// The `results` of a changes answer.
    var results: [JSON] {
        if case .array(let rows)? = json?["results"] { return rows }
        return []
    }
    var rows: [JSON] {
        if case .array(let rows)? = json?["rows"] { return rows }
        return []
    }
    var ids: [String] { (json?["results"] != nil ? results : rows).compactMap { $0["id"]?.stringValue } }
}

/// Sends requests to a routed database.
struct DatabaseClient: Sendable {
    let client: any TestClientProtocol

    func request(_ method: HTTPRequest.Method, _ uri: String, body: String? = nil, headers: HTTPFields = [:]) async throws
        -> DatabaseAnswer
    {
        var h = headers
        if body != nil && h[.contentType] == nil { h[.contentType] = "application/json" }
        return try await client.execute(uri: uri, method: method, headers: h, body: body.map { ByteBuffer(string: $0) }) { r in
            let text = String(buffer: r.body)
            return DatabaseAnswer(
                status: Int(r.status.code), text: text, json: try? JSON.parse(Array(text.utf8)), headers: r.headers)
        }
    }

    func get(_ uri: String) async throws -> DatabaseAnswer { try await request(.get, uri) }
    func post(_ uri: String, _ body: String) async throws -> DatabaseAnswer { try await request(.post, uri, body: body) }
    func put(_ uri: String, _ body: String) async throws -> DatabaseAnswer { try await request(.put, uri, body: body) }
    func delete(_ uri: String) async throws -> DatabaseAnswer { try await request(.delete, uri) }
}

extension JSON {
    var arrayElements: [JSON] {
        if case .array(let list) = self { return list }
        return []
    }
}
