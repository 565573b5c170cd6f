import FerryCore
import FerryCouchDocuments
import FerryStore
import Foundation
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import ServiceLifecycle

/// Who may use the CouchDB API and how they prove it, shared by the node's CouchDB listeners:
/// configured users, session cookies, the admin key, allowed web origins and the login throttle.
public struct CouchAccess: Sendable {
    public var users: CouchUserTable
    public var sessions: CouchSessionCookies
    public var cors: CouchCORSPolicy
    /// Whether a presented string is the node's admin key (constant time); nil: no admin key.
    public var adminKey: (@Sendable (String) -> Bool)?
    /// Identifies the admin key in admin session cookies (a digest of it, never the key).
    public var adminKeyFingerprint: String
    public var throttle: LoginThrottle
    /// Credentials a refused WebSocket upgrade already failed on, for its HTTP answer.
    let upgradeRefusals = UpgradeRefusals()
    /// Wall-clock time, for cookie expiry.
    public var now: @Sendable () -> Date

    public init(
        users: CouchUserTable, sessions: CouchSessionCookies, cors: CouchCORSPolicy, adminKey: (@Sendable (String) -> Bool)?,
        adminKeyFingerprint: String, throttle: LoginThrottle, now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.users = users
        self.sessions = sessions
        self.cors = cors
        self.adminKey = adminKey
        self.adminKeyFingerprint = adminKeyFingerprint
        self.throttle = throttle
        self.now = now
    }
}

/// Serves every request of one CouchDB listener: CORS and its preflights, the loopback Host
/// check, authentication (admin key, HTTP Basic, `AuthSession` cookie), `/_session`, the
/// rule that only `/` and `/_up` are open, then `CouchDatabase.respond`; every failure is
/// answered in CouchDB's error shape.
public struct CouchFrontDoor: HTTPResponder {
    public typealias Context = CouchRequestContext

    /// The two kinds of listener and what each accepts.
    public enum Listener: Sendable, Equatable {
        /// 127.0.0.1: loopback Host authorities only; the admin key is accepted.
        case loopback
        /// The opt-in LAN listener (TLS): any Host; configured users only, never the admin key.
        case lan
    }

    public let database: CouchDatabase
    public let access: CouchAccess
    public let listener: Listener

    public init(database: CouchDatabase, access: CouchAccess, listener: Listener) {
        self.database = database
        self.access = access
        self.listener = listener
    }

    var acceptsAdminKey: Bool { listener == .loopback && access.adminKey != nil }
    var secure: Bool { listener == .lan }

    public func respond(to request: Request, context: CouchRequestContext) async throws -> Response {
        var extra = HTTPFields()
        var response: Response
        do {
            response = try await serve(request, context: context, extra: &extra)
        } catch {
            let couch = CouchError.mapping(error, logger: database.logger)
            do { response = try couch.response(from: request, context: context) } catch { response = Response(status: .internalServerError) }
        }
        for field in extra where response.headers[field.name] == nil || field.name == .setCookie {
            response.headers.append(field)
        }
        // A Basic challenge would make a browser pop up its own login dialog over a web app's.
        let fromPage = request.headers[.origin] != nil || request.headers.contains { $0.name.canonicalName == "x-requested-with" }
        if fromPage { response.headers[.wwwAuthenticate] = nil }
        return response
    }

    func serve(_ request: Request, context: CouchRequestContext, extra: inout HTTPFields) async throws -> Response {
        let authorization = request.headers[.authorization]
        let cookie = CouchSessionCookies.cookie(in: request.headers[values: .cookie])
        // 1. Web origins: a page from an unlisted origin gets nothing, not even an error it can read.
        switch access.cors.decide(origin: request.headers[.origin], carriesCredentials: authorization != nil || cookie != nil) {
        case .noOrigin: break
        case .refused(let reason): throw CouchError.forbidden(reason)
        case .allowed(let origin, let credentials):
            extra.append(contentsOf: access.cors.responseHeaders(origin: origin, credentials: credentials))
            if request.method == .options, let method = request.headers[.accessControlRequestMethod] {
                switch access.cors.preflight(
                    origin: origin, credentials: credentials, method: method, headers: request.headers[.accessControlRequestHeaders])
                {
                case .success(let headers):
                    extra = HTTPFields()
                    return Response(status: .noContent, headers: headers)
                case .failure(let error): throw error
                }
            }
        }
        // 2. DNS rebinding: on loopback only requests addressed to a loopback name.
        if listener == .loopback, let problem = HTTPRequestRules.loopbackAuthorityProblem(request) {
            throw CouchError(.misdirectedRequest, "misdirected_request", problem)
        }
        // 3. Who is asking.
        var context = context
        let address = context.remoteAddress ?? "unknown"
        let now = access.now()
        if let authorization {
            // A refused upgrade served again as HTTP: its credentials failed moments ago and
            // were counted then; answering that failure again keeps it one failed login.
            if let connection = context.channel?.remoteAddress?.description,
                let refusal = access.upgradeRefusals.take(connection: connection, authorization: authorization)
            {
                throw refusal
            }
            context.principal = try await authenticate(authorization, address: address, now: now)
        } else if let cookie, let found = session(cookie, now: now) {
            let (principal, expires) = found
            context.principal = principal
            if access.sessions.needsRenewal(expires: expires, now: now) {
                let value = access.sessions.issue(
                    name: principal.name, credential: credential(of: principal.name) ?? "", listener: listener, now: now)
                extra.append(.init(name: .setCookie, value: access.sessions.setCookie(value, secure: secure)))
            }
        }
        let endpoint = CouchRouting.endpoint(rawPath: request.uri.path)
        // Only a feed outlives its authentication: other requests need no follower.
        if case .databaseSpecial(_, "changes")? = endpoint, let principal = context.principal {
            context.currentPrincipal = access.users.follow(principal)
        }
        if endpoint == .session { return try await sessionEndpoint(request, context: context, address: address, now: now, extra: &extra) }
        if case .databaseSpecial(let db, "session")? = endpoint, db == database.name {
            // Sync Gateway's per-database login, which Couchbase Lite apps use to get a session.
            return try await sessionEndpoint(request, context: context, address: address, now: now, extra: &extra, syncGateway: true)
        }
        // 4. Only the welcome and `_up` are open to everyone.
        let open = (request.method == .get || request.method == .head) && (endpoint == .welcome || endpoint == .up)
        if !open && context.principal == nil {
            throw CouchError.unauthorized("Authentication required.")
        }
        return try await database.respond(request, context: context)
    }

    /// The principal an `Authorization` header proves, or 401/429.
    func authenticate(_ header: String, address: String, now: Date) async throws(CouchError) -> CouchPrincipal {
        let basic = HTTPRequestRules.basicCredentials(header)
        if let bearer = HTTPRequestRules.bearerToken(header) {
            return try await login(name: "admin", password: String(bearer), address: address, now: now, bearer: true)
        }
        guard let basic else {
            throw .unauthorized("Use HTTP Basic (name and password), an AuthSession cookie, or Bearer with the admin key.")
        }
        return try await login(name: basic.user, password: basic.password, address: address, now: now)
    }

    /// The principal of a valid session cookie, and when it expires.
    func session(_ cookie: String, now: Date) -> (CouchPrincipal, Date)? {
        guard let found = access.sessions.verify(cookie, listener: listener, credential: credential(of:), now: now) else { return nil }
        let (name, expires) = found
        if name == "admin" { return (.admin, expires) }
        guard let user = access.users.user(named: name) else { return nil }
        return (.user(name: user.name, policy: access.users.policy(of: user)), expires)
    }

    /// What a session cookie is bound to: the user's password hash, or the admin key's digest.
    func credential(of name: String) -> String? {
        if name == "admin" { return acceptsAdminKey ? "admin:" + access.adminKeyFingerprint : nil }
        return access.users.user(named: name)?.password.description
    }

    /// `GET|POST|DELETE /_session`.
    func sessionEndpoint(
        _ request: Request, context: CouchRequestContext, address: String, now: Date, extra: inout HTTPFields, syncGateway: Bool = false
    ) async throws -> Response {
        switch request.method {
        case .get, .head:
            return CouchResponse.json(Self.sessionInfo(context.principal, via: request.headers[.authorization] != nil ? "default" : "cookie"))
        case .delete:
            extra.append(.init(name: .setCookie, value: CouchSessionCookies.clearingCookie(secure: secure)))
            return CouchResponse.json(["ok": true])
        case .post:
            let (name, password) = try await loginFields(request)
            let principal = try await login(name: name, password: password, address: address, now: now)
            let value = access.sessions.issue(name: principal.name, credential: credential(of: principal.name) ?? "", listener: listener, now: now)
            extra.append(.init(name: .setCookie, value: access.sessions.setCookie(value, secure: secure)))
            var answer: [String: JSON] = ["ok": true, "name": .string(principal.name), "roles": Self.roles(principal)]
            if syncGateway {
                // What a Couchbase Lite session authenticator needs: the cookie's name and value.
                answer["session_id"] = .string(value)
                answer["cookie_name"] = .string(CouchSessionCookies.cookieName)
                answer["expires"] = .string(ISO8601DateFormatter().string(from: now.addingTimeInterval(access.sessions.lifetime)))
            }
            return CouchResponse.json(.object(answer))
        default:
            throw CouchError.methodNotAllowed("GET,HEAD,POST,DELETE")
        }
    }

    /// `name` and `password` of a login, from a form or a JSON body.
    func loginFields(_ request: Request) async throws -> (String, String) {
        let media = (request.headers[.contentType] ?? "").split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        // Anyone may post a login: its body is small, whatever the API's limit.
        let body: ByteBuffer
        do { body = try await request.body.collect(upTo: Self.maxLoginBytes) } catch is NIOTooManyBytesError {
            throw CouchError.tooLarge("A login is at most \(Self.maxLoginBytes) bytes.")
        }
        let bytes = Array(body.readableBytesView)
        var fields: [String: String] = [:]
        switch media {
        case "application/json":
            guard case .object(let o) = try CouchDatabase.parseJSON(bytes) else {
                throw CouchError.badRequest("A login must be a JSON object with name and password.")
            }
            for key in ["name", "password"] {
                if let v = o[key] {
                    guard let s = v.stringValue else { throw CouchError.badRequest("\(key) must be a string") }
                    fields[key] = s
                }
            }
        case "application/x-www-form-urlencoded":
            for pair in String(decoding: bytes, as: UTF8.self).split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let decode = { (s: Substring) in s.replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String(s) }
                if kv.count == 2 { fields[decode(kv[0])] = decode(kv[1]) }
            }
        default:
            throw CouchError.unsupportedMediaType("Content-Type must be application/json or application/x-www-form-urlencoded")
        }
        guard let name = fields["name"], let password = fields["password"] else {
            throw CouchError.badRequest("name and password are required")
        }
        return (name, password)
    }

    static let maxLoginBytes = 64 * 1024

    static func roles(_ principal: CouchPrincipal?) -> JSON {
        principal == .admin ? ["_admin"] : []
    }

    /// `GET /_session`'s body for a principal (nil: anonymous).
    static func sessionInfo(_ principal: CouchPrincipal?, via handler: String) -> JSON {
        var info: [String: JSON] = ["authentication_handlers": ["cookie", "default"], "authentication_db": "_users"]
        if principal != nil { info["authenticated"] = .string(handler) }
        return [
            "ok": true,
            "userCtx": ["name": principal.map { JSON.string($0.name) } ?? JSON.null, "roles": roles(principal)],
            "info": .object(info),
        ]
    }
}

/// A CouchDB API listener as a service: Hummingbird serving one `CouchFrontDoor`, over
/// TLS when given an identity. On graceful shutdown it fires the database's `CouchShutdown`
/// first, so open long-polls and continuous feeds end and the server's wait for in-flight
/// requests is short.
public struct CouchListenerService: Service {
    /// The certificate and key a TLS listener presents (DER).
    public struct TLSIdentity: Sendable {
        public var certificateDER: [UInt8]
        public var privateKeyDER: [UInt8]
        public init(certificateDER: [UInt8], privateKeyDER: [UInt8]) {
            self.certificateDER = certificateDER
            self.privateKeyDER = privateKeyDER
        }
    }

    let serveRequests: @Sendable () async throws -> Void
    let shutdown: CouchShutdown

    /// A listener on `host:port` (0: a free port, reported to `onBound`). `idleTimeout` closes a
    /// connection that sends no complete request (nothing, or headers trickled) for that long
    /// between requests; `admit` sees each accepted connection first and closes those over its caps.
    public init(
        frontDoor: CouchFrontDoor, host: String, port: Int, tls: TLSIdentity? = nil, logger: Logger,
        idleTimeout: TimeAmount? = nil, admit: (@Sendable (any Channel) -> Bool)? = nil,
        onBound: @escaping @Sendable (Int) -> Void = { _ in }
    ) throws {
        let server: HTTPServerBuilder
        let http1 = HTTP1Channel.Configuration(idleTimeout: idleTimeout)
        let admit = admit ?? { _ in true }
        if let tls {
            let cert = try NIOSSLCertificate(bytes: tls.certificateDER, format: .der)
            let key = try NIOSSLPrivateKey(bytes: tls.privateKeyDER, format: .der)
            var config = TLSConfiguration.makeServerConfiguration(certificateChain: [.certificate(cert)], privateKey: .privateKey(key))
            // Browsers and CouchDB client libraries still met in the field speak TLS 1.2.
            config.minimumTLSVersion = .tlsv12
            config.certificateVerification = .none
            config.trustRoots = .certificates([])  // no client certificates: no system CA bundle is read
            let tlsConfiguration = config
            server = .init { responder in
                AdmittedChannel(
                    inner: try TLSChannel(
                        CouchHTTPChannel(
                            responder: responder, configuration: http1, secure: true, honourTargetAuthority: false,
                            admit: { await frontDoor.admitMobile($0, from: $1) }, serve: frontDoor.serveMobile),
                        tlsConfiguration: tlsConfiguration),
                    admit: admit)
            }
        } else {
            server = .init { responder in
                AdmittedChannel(
                    inner: CouchHTTPChannel(
                        responder: responder, configuration: http1, secure: false, honourTargetAuthority: true,
                        admit: { await frontDoor.admitMobile($0, from: $1) }, serve: frontDoor.serveMobile),
                    admit: admit)
            }
        }
        let app = Application(
            responder: frontDoor, server: server,
            configuration: .init(address: .hostname(host, port: port), serverName: "Ferry (CouchDB API)"),
            onServerRunning: { channel in onBound(channel.localAddress?.port ?? 0) },
            eventLoopGroupProvider: FrontDoorEventLoops.couch, logger: logger)
        serveRequests = { try await app.run() }
        shutdown = frontDoor.database.shutdown
    }

    public func run() async throws {
        try await withGracefulShutdownHandler {
            try await serveRequests()
        } onGracefulShutdown: {
            shutdown.fire()
        }
    }
}

extension CouchError {
    /// Any error a handler throws, in CouchDB's shape: Ferry's errors by their code, the
    /// node's own failures as 500 (and logged).
    public static func mapping(_ error: any Error, logger: Logger) -> CouchError {
        switch error {
        case let e as CouchError: return e
        case let e as any FerryError:
            // The status is the failure kind's, shared with the admin API; the body is CouchDB's.
            switch e.failure {
            case .notFound: return .notFound("missing")
            case .conflict: return .conflict()
            case .tooLarge: return .tooLarge(e.description)
            case .forbidden: return .forbidden(e.description)
            case .unavailable: return CouchError(.serviceUnavailable, "service_unavailable", e.description)
            case .rateLimited: return CouchError(.tooManyRequests, "too_many_requests", e.description)
            case .peerFailed: return CouchError(.badGateway, "bad_gateway", e.description)
            case .internalFailure:
                logger.error("CouchDB API request failed", metadata: ["error": "\(e)"])
                return CouchError(.internalServerError, "internal_server_error", e.description)
            case .invalidRequest: return .badRequest(e.description)
            }
        case let e as HTTPError:
            return CouchError(e.status, e.status.code == 404 ? "not_found" : "bad_request", e.body ?? e.status.reasonPhrase)
        case let e as any HTTPResponseError:
            return CouchError(e.status, e.status.code >= 500 ? "internal_server_error" : "bad_request", e.status.reasonPhrase)
        default:
            logger.error("CouchDB API request failed", metadata: ["error": "\(error)"])
            return CouchError(.internalServerError, "internal_server_error", "\(error)")
        }
    }
}

/// Where the front doors (the admin API and the CouchDB API) take their event loops from.
///
/// A `ferry serve` process gives each its own one-thread group (`dedicate()`), apart from
/// the group the replication transport uses: a peer link busy framing a large blob (and, on
/// the dialling side, masking every byte) then never delays the CLI, the dashboard or an
/// app's request (in a debug build, a 200 MB blob fanning out to four peers held NIO's two
/// shared threads for seconds at a time, and writes through the admin API waited 2 s:
/// Benchmarks/README.md, "Load"). A process that embeds nodes (the test suites) keeps NIO's
/// shared group unless it asks. The groups live as long as the process.
public enum FrontDoorEventLoops {
    private static let dedicated = Locked(false)
    private static let adminGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    private static let couchGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// Gives the front doors started from now on their own event loops.
    public static func dedicate() { dedicated.withLock { $0 = true } }

    public static var admin: EventLoopGroupProvider { dedicated.withLock { $0 } ? .shared(adminGroup) : .singleton }
    public static var couch: EventLoopGroupProvider { dedicated.withLock { $0 } ? .shared(couchGroup) : .singleton }
}
