import FerryCore
import FerryCouchDocuments
import FerryQuery
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import Logging
import NIOCore

/// The node's one database as the CouchDB API serves it, with what every endpoint needs
/// from the node: the store, the trust-boundary hooks and the API's limits.
public struct CouchDatabase: Sendable {
    /// The database name clients use: the node's group name.
    public let name: String
    public let store: DocumentStore
    /// The node's pull filter: revisions stored with `new_edits=false` face it as a peer's do.
    public let pullFilter: RevisionFilter?
    /// Largest request body accepted; larger ones are 413.
    public let maxRequestBytes: Int
    /// CouchDB's `instance_start_time`: microseconds since the epoch when the node started, as a string.
    public let instanceStartTime: String
    /// Answered in `GET /` as `uuid`: stable per node.
    public let serverUUID: String
    public let logger: Logger
    /// Fired when the node shuts down: open long-polls and continuous feeds end at once.
    public let shutdown: CouchShutdown
    /// The node's replication counters: revisions stored with IDs made elsewhere are counted
    /// as `metrics?.unverifiable(n, source: .couch)`.
    public let metrics: SyncMetrics?

    public init(
        name: String, store: DocumentStore, pullFilter: RevisionFilter? = nil, maxRequestBytes: Int = 64 << 20,
        instanceStartTime: String = String(UInt64(Date().timeIntervalSince1970 * 1_000_000)), serverUUID: String,
        logger: Logger = Logger(label: "ferry.couch"), shutdown: CouchShutdown = CouchShutdown(),
        metrics: SyncMetrics? = nil
    ) {
        self.metrics = metrics
        self.name = name
        self.store = store
        self.pullFilter = pullFilter
        self.maxRequestBytes = maxRequestBytes
        self.instanceStartTime = instanceStartTime
        self.serverUUID = serverUUID
        self.logger = logger
        self.shutdown = shutdown
    }

    /// Ferry's version, answered in `GET /` as `vendor.version`.
    public var vendorVersion = "unknown"
    /// How long one `_find` may work before it is stopped with a 500 `timeout`; nil: no limit.
    public var queryTimeout: Duration? = QueryLimits.defaultTimeout
    /// Times the heartbeats and timeouts of `_changes` feeds; tests set a manual clock.
    public var clock: any Clock<Duration> = ContinuousClock()
    /// Largest attachment a standalone attachment `PUT` or a `multipart/related` part may
    /// carry. Such content streams to the blob store and is not bounded by `maxRequestBytes`;
    /// like CouchDB's `max_attachment_size`, the default leaves the disk as the limit.
    public var maxAttachmentBytes: Int64 = 1 << 40
    /// Fetches a blob a lazy policy left for first read (true once it is here, false when
    /// nothing refers to it); throws when no connected peer can send it. Nil: never fetched.
    public var fetchDeferredBlob: (@Sendable (BlobDigest) async throws -> Bool)?
}

/// Who a request was authenticated as; its policy bounds what it may read and write.
public enum CouchPrincipal: Sendable, Equatable {
    /// The node's admin key: everything.
    case admin
    /// A configured user, with Ferry's read/write policy.
    case user(name: String, policy: PeerPolicy)

    public var policy: PeerPolicy {
        switch self {
        case .admin: return .trusted
        case .user(_, let policy): return policy
        }
    }

    public var name: String {
        switch self {
        case .admin: return "admin"
        case .user(let name, _): return name
        }
    }
}

/// The request context of the CouchDB API: Hummingbird's core storage plus the principal
/// the server's authentication found (nil only on the routes open to everyone).
public struct CouchRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    public var principal: CouchPrincipal?
    /// The principal as it stands now (nil: its user was removed or its password changed):
    /// a live feed follows it rather than the rights its request began with.
    public var currentPrincipal: (@Sendable () -> CouchPrincipal?)?
    /// The client's IP address (failed logins are counted per address); nil when unknown.
    public var remoteAddress: String?
    /// The request's connection, watched by long queries for the client going away.
    public var channel: (any Channel)?

    public init(source: Source) {
        coreContext = .init(source: source)
        principal = nil
        currentPrincipal = nil
        remoteAddress = source.channel.remoteAddress?.ipAddress
        channel = source.channel
    }

    /// The principal, or 401 for a request that reached a protected endpoint without one.
    public func requirePrincipal() throws(CouchError) -> CouchPrincipal {
        guard let principal else { throw .unauthorized("You are not authorized to access this db.") }
        return principal
    }
}

/// Fires once when the node stops, so that long-lived responses end promptly.
public final class CouchShutdown: Sendable {
    private let fired = Latch<Void>()
    public init() {}
    public var isFired: Bool { fired.value != nil }
    public func fire() { fired.set(()) }
    /// Returns once fired, or once the waiting task is cancelled.
    public func wait() async { _ = try? await fired.wait() }
}

/// Splits a CouchDB API path into its endpoint and calls the handler that serves it.
/// Hand-rolled rather than Hummingbird's trie: CouchDB's paths put document IDs and
/// attachment names (which may contain `/`, `_design/…`) where a trie sees segments.
public enum CouchRouting {
    /// The endpoint a path names.
    public enum Endpoint: Equatable, Sendable {
        case welcome, up, allDbs, session, uuids
        /// `/_active_tasks`: the Mango indexes being built.
        case activeTasks
        case database(String)
        /// `/{db}/_changes`, `_all_docs`, `_bulk_docs`, …: the special segment without its `_`.
        case databaseSpecial(db: String, name: String)
        case localDocument(db: String, id: String)
        case document(db: String, id: String)
        case attachment(db: String, docID: String, name: String)
        /// `/{db}/_index/…`: the segments after `_index` (`{ddoc}/json/{name}`, or
        /// `_design/{ddoc}/json/{name}`).
        case index(db: String, path: [String])
        /// A server-level path Ferry does not serve (`/_utils`, `/_replicate`, …).
        case unknownServer(String)
    }

    /// The endpoint of a raw (still percent-encoded) path; nil for a malformed escape.
    public static func endpoint(rawPath: String) -> Endpoint? {
        var parts = rawPath.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if parts.first == "" { parts.removeFirst() }
        if parts.last == "" && parts.count > 1 { parts.removeLast() }
        if parts == [""] { parts = [] }
        var decoded: [String] = []
        for p in parts {
            guard let d = p.removingPercentEncoding else { return nil }
            decoded.append(d)
        }
        guard let first = decoded.first else { return .welcome }
        if first.hasPrefix("_") && decoded.count == 1 {
            switch first {
            case "_up": return .up
            case "_all_dbs": return .allDbs
            case "_session": return .session
            case "_uuids": return .uuids
            case "_active_tasks": return .activeTasks
            default: return .unknownServer(first)
            }
        }
        if first.hasPrefix("_") { return .unknownServer(first) }
        let db = first
        let rest = Array(decoded.dropFirst())
        guard let head = rest.first else { return .database(db) }
        if head == "_local" {
            guard rest.count >= 2 else { return .databaseSpecial(db: db, name: "local") }
            return .localDocument(db: db, id: rest.dropFirst().joined(separator: "/"))
        }
        if head == "_design" {
            guard rest.count >= 2 else { return .databaseSpecial(db: db, name: "design") }
            let id = "_design/" + rest[1]
            if rest.count == 2 { return .document(db: db, id: id) }
            return .attachment(db: db, docID: id, name: rest.dropFirst(2).joined(separator: "/"))
        }
        if head.hasPrefix("_design/") {
            // `_design%2Fx`: the escaped slash names the same design document.
            if rest.count == 1 { return .document(db: db, id: head) }
            return .attachment(db: db, docID: head, name: rest.dropFirst().joined(separator: "/"))
        }
        if head.hasPrefix("_") && rest.count == 1 { return .databaseSpecial(db: db, name: String(head.dropFirst())) }
        if head == "_index" { return .index(db: db, path: Array(rest.dropFirst())) }
        if rest.count == 1 { return .document(db: db, id: head) }
        return .attachment(db: db, docID: head, name: rest.dropFirst().joined(separator: "/"))
    }
}

extension CouchDatabase {
    /// Serves one request: finds its endpoint, checks the database name, and calls the
    /// handler. Authentication, CORS and the Host check ran before (Server/).
    public func respond(_ request: Request, context: CouchRequestContext) async throws -> Response {
        guard let endpoint = CouchRouting.endpoint(rawPath: request.uri.path) else {
            throw CouchError.badRequest("The request path is not valid percent-encoding.")
        }
        if request.method == .get || request.method == .head, let location = Self.designRedirect(path: request.uri.path, query: request.uri.query) {
            // As CouchDB: a read of `/{db}/_design%2Fx` is sent to `/{db}/_design/x`.
            return Response(status: .movedPermanently, headers: [.location: location, .contentLength: "0"])
        }
        switch endpoint {
        case .welcome: return try await welcome(request, context: context)
        case .up: return try await up(request, context: context)
        case .session, .uuids, .unknownServer:
            return try await serverEndpoint(endpoint, request, context: context)
        case .allDbs: return try await allDbs(request, context: context)
        case .activeTasks: return try await activeTasksEndpoint(request, context: context)
        case .database(let db):
            try checkDatabase(db, request: request)
            return try await databaseEndpoint(request, context: context)
        case .databaseSpecial(let db, let name):
            try checkDatabase(db, request: request)
            switch name {
            case "bulk_docs": return try await bulkDocs(request, context: context)
            case "bulk_get": return try await bulkGet(request, context: context)
            default: return try await databaseSpecial(name, request, context: context)
            }
        case .localDocument(let db, let id):
            try checkDatabase(db, request: request)
            return try await localDocument(request, context: context, id: id)
        case .document(let db, let id):
            try checkDatabase(db, request: request)
            return try await document(request, context: context, id: id)
        case .attachment(let db, let docID, let name):
            try checkDatabase(db, request: request)
            if let handler = Self.designHandler(docID: docID, name: name) {
                throw CouchError(
                    .notImplemented, "not_implemented",
                    "\(handler) is not supported: Ferry runs no JavaScript (views, shows, lists, updates and rewrites); query with _find and a Mango index")
            }
            return try await attachment(request, context: context, docID: docID, name: name)
        case .index(let db, let path):
            try checkDatabase(db, request: request)
            return try await indexItemEndpoint(request, principal: try context.requirePrincipal(), path: path)
        }
    }

    /// The design document function a path under `_design/x/` names (`_view`, `_show`, …),
    /// which CouchDB runs in JavaScript; nil for an attachment of the design document.
    static func designHandler(docID: String, name: String) -> String? {
        guard docID.hasPrefix("_design/"), let first = name.split(separator: "/").first else { return nil }
        let handlers: Set<Substring> = ["_view", "_show", "_list", "_update", "_rewrite", "_search", "_nouveau", "_info"]
        return handlers.contains(first) ? String(first) : nil
    }

    /// The path (and query) with the escaped slash of `/{db}/_design%2F…` unescaped; nil
    /// for any other path.
    static func designRedirect(path: String, query: String?) -> String? {
        let parts = path.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0].isEmpty else { return nil }
        let rest = parts[1]
        guard let slash = rest.firstIndex(of: "/") else { return nil }
        let head = rest[rest.index(after: slash)...]
        let escaped = "_design%2f"
        guard head.lowercased().hasPrefix(escaped) else { return nil }
        let db = String(rest[...slash])
        let tail = String(head.dropFirst(escaped.count))
        var location = "/" + db + "_design/" + tail
        if let query, !query.isEmpty { location += "?" + query }
        return location
    }

    /// 404 for any database but this node's (`PUT /{db}` of another name answers in its handler).
    func checkDatabase(_ db: String, request: Request) throws(CouchError) {
        if db != name && !(request.method == .put && request.uri.path.split(separator: "/").count == 1) {
            throw .notFound("Database does not exist.")
        }
    }

    /// Reads the whole request body, 413 past `maxRequestBytes`. A `Content-Encoding: gzip`
    /// body (client libraries compress every request) is decoded, its decoded size capped
    /// the same way; 400 for a corrupt stream, 415 for any other encoding.
    public func readBody(_ request: Request) async throws -> ByteBuffer {
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: maxRequestBytes)
        } catch is NIOTooManyBytesError {
            throw CouchError.tooLarge("Request body is larger than \(maxRequestBytes) bytes.")
        }
        let encodings = Self.contentEncodings(request)
        guard !encodings.isEmpty else { return buffer }
        guard encodings.allSatisfy({ $0 == "gzip" || $0 == "x-gzip" }) else {
            throw CouchError.unsupportedMediaType("Unsupported Content-Encoding: \(encodings.joined(separator: ", "))")
        }
        var bytes = Array(buffer.readableBytesView)
        for _ in encodings {
            switch Gzip.decodeChecked(bytes, limit: maxRequestBytes) {
            case .decoded(let d): bytes = d
            case .tooLarge: throw CouchError.tooLarge("Decoded request body is larger than \(maxRequestBytes) bytes.")
            case .corrupt: throw CouchError.badRequest("The gzip-encoded request body is corrupt.")
            }
        }
        return ByteBuffer(bytes: bytes)
    }

    /// The request's content codings other than identity, lowercased, in order.
    static func contentEncodings(_ request: Request) -> [String] {
        request.headers[values: .contentEncoding]
            .flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
            .filter { !$0.isEmpty && $0 != "identity" }
    }

    /// Reads the body as JSON, with CouchDB's `bad_request` for malformed JSON.
    public func readJSON(_ request: Request) async throws -> JSON {
        let buffer = try await readBody(request)
        return try Self.parseJSON(buffer.readableBytesView)
    }

    /// Parses a request's JSON: what is wrong, and where, is CouchDB's `bad_request` reason.
    static func parseJSON(_ bytes: some Collection<UInt8>) throws(CouchError) -> JSON {
        do throws(JSONParseError) { return try JSON.parse(bytes) } catch { throw CouchError.invalidJSON(error) }
    }
}

extension CouchError {
    /// The longest parser reason sent back: a duplicate key is quoted, and may be huge.
    static let maxJSONReasonLength = 300

    /// `400 bad_request` naming the parser's reason and its position (nesting too deep, a
    /// number out of range, a duplicate key, invalid UTF-8, a syntax error).
    static func invalidJSON(_ error: JSONParseError) -> CouchError {
        var reason = error.description
        if reason.count > maxJSONReasonLength { reason = reason.prefix(maxJSONReasonLength) + "…" }
        return .badRequest(reason)
    }
}

/// The server answers a `CouchError` as CouchDB does: its status and `{"error", "reason"}`.
extension CouchError: HTTPResponseError {
    public func response(from request: Request, context: some RequestContext) throws -> Response {
        let fields: [String: JSON] = ["error": .string(error), "reason": .string(reason)]
        var response = CouchResponse.json(.object(fields), status: status)
        if status == .unauthorized { response.headers[.wwwAuthenticate] = #"Basic realm="server""# }
        return response
    }
}

/// Responses as CouchDB writes them.
public enum CouchResponse {
    /// A JSON body (`application/json`), ending in a newline as CouchDB's do.
    public static func json(_ value: JSON, status: HTTPResponse.Status = .ok, headers: HTTPFields = [:]) -> Response {
        var bytes = value.canonicalBytes
        bytes.append(0x0A)
        var h = headers
        h[.contentType] = "application/json"
        h[.cacheControl] = "must-revalidate"
        return Response(status: status, headers: h, body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}
