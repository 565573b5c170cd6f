import FerryCore
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

/// Serves every request with `CouchDatabase.respond` as the given principal, turning
/// CouchDB-shaped errors into their responses.
struct CouchTestResponder: RouterMiddleware {
    typealias Context = CouchRequestContext
    let database: CouchDatabase
    let principal: CouchPrincipal?

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        var context = context
        context.principal = principal
        do {
            // `POST /{db}` belongs to the database endpoint, which hands documents to `postDocument`.
            if request.method == .post && request.uri.path == "/\(database.name)" {
                return try await database.postDocument(request, context: context)
            }
            return try await database.respond(request, context: context)
        } catch let e as CouchError {
            return try e.response(from: request, context: context)
        }
    }
}

/// One node's CouchDB API over an in-memory store, driven through Hummingbird's router tester.
struct CouchFixture {
    let store: DocumentStore
    var database: CouchDatabase

    init(pullFilter: RevisionFilter? = nil, maxRequestBytes: Int = 64 << 20) throws {
        store = try DocumentStore.inMemory()
        database = CouchDatabase(
            name: "ferry", store: store, pullFilter: pullFilter, maxRequestBytes: maxRequestBytes, serverUUID: "test")
    }

    func run<T>(as principal: CouchPrincipal? = .admin, _ body: @Sendable (CouchClient) async throws -> T) async throws -> T {
        let router = Router(context: CouchRequestContext.self)
        router.add(middleware: CouchTestResponder(database: database, principal: principal))
        let app = Application(router: router)
        return try await app.test(.router) { client in try await body(CouchClient(client: client)) }
    }
}

/// A response read whole.
struct CouchReply: Sendable {
    let status: HTTPResponse.Status
    let headers: HTTPFields
    let bytes: [UInt8]
    var json: JSON { (try? JSON.parse(bytes)) ?? .null }
    var text: String { String(decoding: bytes, as: UTF8.self) }
}

/// Requests with CouchDB clients' habits (JSON bodies with `Content-Type: application/json`).
struct CouchClient: Sendable {
    let client: any TestClientProtocol

    func send(_ method: HTTPRequest.Method, _ uri: String, headers: HTTPFields = [:], bytes: [UInt8]? = nil) async throws
        -> CouchReply
    {
        let response = try await client.execute(
            uri: uri, method: method, headers: headers, body: bytes.map { ByteBuffer(bytes: $0) })
        return CouchReply(status: response.status, headers: response.headers, bytes: Array(response.body.readableBytesView))
    }

    func send(_ method: HTTPRequest.Method, _ uri: String, json: JSON, headers: HTTPFields = [:]) async throws -> CouchReply {
        var h = headers
        if h[.contentType] == nil { h[.contentType] = "application/json" }
        return try await send(method, uri, headers: h, bytes: json.canonicalBytes)
    }

    func get(_ uri: String, headers: HTTPFields = [:]) async throws -> CouchReply { try await send(.get, uri, headers: headers) }

    /// PUTs a document and returns its new revision, expecting 201.
    func put(_ id: String, _ doc: JSON, query: String = "") async throws -> String {
        let reply = try await send(.put, "/ferry/\(id)\(query)", json: doc)
        #expect(reply.status == .created, "PUT \(id): \(reply.text)")
        return reply.json["rev"]?.stringValue ?? ""
    }
}

/// Parses a JSON literal written in a test.
func j(_ text: String) -> JSON { try! JSON.parse(text) }

func base64(_ s: String) -> String { Data(s.utf8).base64EncodedString() }

func md5Digest(_ s: String) -> String { StoredAttachment.md5Digest(Array(s.utf8)) }

/// Everything observable about a store's documents, to prove that a refused write changed nothing.
func storeSnapshot(_ store: DocumentStore) throws -> [String] {
    var out = ["seq=\(try store.lastSequence)"]
    for d in try store.allDocuments(includeDeleted: true) {
        let tree = try store.revisionTree(d.id)!
        out.append("\(d.id) \(d.revision) \(tree.revisions.map(\.id.description))")
    }
    return out
}
