import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Hummingbird
import HummingbirdCore
import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle

/// Refuses, before any handler runs, every request that does not come from a local client
/// holding the admin key or a dashboard session: a foreign `Host` (DNS rebinding), an unlisted
/// `Origin` (a web page elsewhere), a missing or wrong key, a session's change without its
/// CSRF token, and a body that is not JSON (what an HTML form can send). Only the routes in
/// `openRoutes` (the dashboard's login and its static files) answer without a credential.
struct AdminGuard<Context: RequestContext>: RouterMiddleware {
    let key: AdminKey
    let allowedOrigins: Set<String>
    let publicMetrics: Bool
    let sessions: DashboardSessions

    init(key: AdminKey, allowedOrigins: [String], publicMetrics: Bool, sessions: DashboardSessions = DashboardSessions()) {
        self.key = key
        self.allowedOrigins = Set(allowedOrigins.map(AdminRequestRules.normalizedOrigin))
        self.publicMetrics = publicMetrics
        self.sessions = sessions
    }

    /// The header a dashboard page sends its session's CSRF token in.
    static var csrfHeader: String { "X-CSRF-Token" }

    /// A route as the router dispatches it: the method and the path the route was registered
    /// under, in Hummingbird's normal form (`RouterPath.description`: empty segments dropped,
    /// no trailing `/`, so `"/ui/"` is `/ui`).
    struct Route: Hashable, Sendable, CustomStringConvertible {
        let method: HTTPRequest.Method
        let path: String

        init(_ method: HTTPRequest.Method, _ path: RouterPath) {
            self.init(method, described: path.description)
        }

        /// A route from the router's own description of its path (`RequestContext.endpointPath`).
        init(_ method: HTTPRequest.Method, described path: String) {
            self.method = method
            self.path = path
        }

        var description: String { "\(method) \(path)" }
    }

    /// The only routes a request reaches without the admin key or a session: the dashboard's
    /// page (which sends a visitor without a session to the login), its login and logout
    /// (checked by their handlers), and its script and style. Everything else, including a
    /// request no route serves, needs a credential.
    static var openRoutes: Set<Route> {
        [
            Route(.get, AdminAPI.Dashboard.page), Route(.get, AdminAPI.Dashboard.login), Route(.post, AdminAPI.Dashboard.login),
            Route(.post, AdminAPI.Dashboard.logout), Route(.get, AdminAPI.Dashboard.script), Route(.get, AdminAPI.Dashboard.style),
            Route(.get, AdminAPI.Dashboard.favicon),
        ]
    }

    /// `GET /metrics`, open to keyless readers with `admin.publicMetrics`.
    static var metricsRoute: Route { Route(.get, "/metrics") }
    /// A blob upload: its body is the blob's raw content, not JSON.
    static var blobUploadRoute: Route { Route(.post, "/blobs") }

    /// What a request proves about its sender.
    enum Credential: Equatable {
        /// The node's admin key (Bearer, or HTTP Basic `admin:KEY`).
        case adminKey
        /// A dashboard session's cookie (and, for a change, its CSRF token).
        case session(cookie: String)
    }

    /// The credential a request carries: the admin key, else a live dashboard session whose
    /// changes (any method but GET and HEAD) carry its CSRF token; nil when it has neither.
    /// Throws 403 `csrf` for a session's change without its token.
    static func credential(of request: Request, key: AdminKey, sessions: DashboardSessions) throws(APIError) -> Credential? {
        if let presented = AdminRequestRules.presentedAdminKey(request.headers[.authorization]), key.matches(presented) {
            return .adminKey
        }
        guard let cookie = DashboardSessions.cookie(in: request.headers[.cookie]), let csrf = sessions.csrf(cookie: cookie) else {
            return nil
        }
        if request.method != .get && request.method != .head {
            let sent = request.headers[HTTPField.Name(csrfHeader)!] ?? ""
            guard AdminKey(value: csrf).matches(sent) else {
                throw APIError(.forbidden, "csrf", "a change from a dashboard session must carry its CSRF token (\(csrfHeader))")
            }
        }
        return .session(cookie: cookie)
    }

    static var unauthorized: APIError {
        APIError(.unauthorized, "unauthorized", "send the node's admin key (DATA/admin.key) as Authorization: Bearer KEY or Basic admin:KEY")
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        typealias Rules = AdminRequestRules
        // The authority is the first `Host` (or an absolute-form target's, which
        // `RequestTargetHandler` puts first). Every `Host` must be loopback, since whatever
        // sits in front of the node may read another one, and all must agree.
        let headerHosts = request.headers.filter { $0.name.canonicalName == "host" }.map(\.value)
        for host in [request.head.authority] + headerHosts.map(Optional.some) {
            guard let host, Rules.isLoopbackAuthority(host) else {
                throw APIError(
                    .misdirectedRequest, "misdirected",
                    "the admin API answers only requests addressed to a loopback host (127.0.0.1, ::1 or localhost), not \(LogText.escape(host ?? "no Host"))")
            }
        }
        let authorities = [request.head.authority ?? ""] + headerHosts
        if Set(authorities.map { $0.lowercased() }).count > 1 {
            throw APIError(
                .misdirectedRequest, "misdirected",
                "the request names more than one authority (\(LogText.escape(authorities.joined(separator: ", "))))")
        }
        // The dashboard's own origin (this very host) is always allowed: only its pages are served here.
        let ownOrigin = Rules.normalizedOrigin("http://" + (request.head.authority ?? headerHosts.first ?? ""))
        for origin in request.headers[values: .origin] {
            let o = Rules.normalizedOrigin(origin)
            guard allowedOrigins.contains(o) || o == ownOrigin else {
                throw APIError(.forbidden, "forbidden_origin", "requests from the web origin \(origin) are refused (see admin.allowedOrigins)")
            }
        }
        // The route is the one the router matched for this request: Hummingbird's router
        // resolves the path (its own splitting: `/ui//tokens/` is `/ui/tokens`) before it runs
        // the matched endpoint's middleware, this guard among them, and names the route in
        // `endpointPath`. Deciding on that name, rather than on the raw path or on a copy of
        // the router's normalisation that could drift from it, means the guard and the router
        // cannot disagree about which handler a path reaches. Anything without a route name
        // (no route serves the path, or the guard was installed ahead of the router) is
        // guarded: the guard fails closed, and an unknown path tells a caller without a
        // credential nothing.
        let route = context.endpointPath.map { Route(request.method, described: $0) }
        let open = route.map { Self.openRoutes.contains($0) || (publicMetrics && $0 == Self.metricsRoute) } ?? false
        if !open, try Self.credential(of: request, key: key, sessions: sessions) == nil {
            throw Self.unauthorized
        }
        // A blob upload is its raw content and the login and logout forms are form-encoded;
        // every other body is JSON.
        let formOrUpload = (open && request.method == .post) || route == Self.blobUploadRoute
        if !formOrUpload, Rules.carriesBody(request), !Rules.isJSON(request.headers[.contentType]) {
            throw APIError(
                .unsupportedMediaType, "unsupported_media_type",
                "request bodies must be Content-Type: application/json, not \(request.headers[.contentType] ?? "none")")
        }
        return try await next(request, context)
    }
}

/// The checks AdminGuard applies: shared with the CouchDB API's listener (FerryCouch).
typealias AdminRequestRules = HTTPRequestRules

/// Hummingbird's HTTP/1 channel that keeps an absolute-form target's authority (FerryCouch).
typealias AdminHTTP1Channel = AuthorityHTTP1Channel
