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

/// Refuses, before routing, every request that does not come from a local client holding
/// the admin key or a dashboard session: a foreign `Host` (DNS rebinding), an unlisted
/// `Origin` (a web page elsewhere), a missing or wrong key, a session's change without its
/// CSRF token, and a body that is not JSON (what an HTML form can send). The dashboard's
/// own pages (`/ui/…`) check their session themselves.
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
        let path = request.uri.path
        let dashboardPage = (path == "/ui" || path.hasPrefix("/ui/")) && path != "/ui/tokens"
        let open = (publicMetrics && request.method == .get && path == "/metrics") || dashboardPage
        if !open {
            // Bearer KEY, or HTTP Basic admin:KEY: one credential scheme for all of a node's
            // HTTP APIs; or a dashboard session, whose changes carry its CSRF token.
            if let presented = Rules.presentedAdminKey(request.headers[.authorization]), key.matches(presented) {
            } else if let cookie = DashboardSessions.cookie(in: request.headers[.cookie]), let csrf = sessions.csrf(cookie: cookie) {
                if request.method != .get && request.method != .head {
                    let sent = request.headers[HTTPField.Name(Self.csrfHeader)!] ?? ""
                    guard AdminKey(value: csrf).matches(sent) else {
                        throw APIError(.forbidden, "csrf", "a change from a dashboard session must carry its CSRF token (\(Self.csrfHeader))")
                    }
                }
            } else {
                throw APIError(.unauthorized, "unauthorized", "send the node's admin key (DATA/admin.key) as Authorization: Bearer KEY or Basic admin:KEY")
            }
        }
        // A blob upload is its raw content; every other body is JSON.
        let upload = request.method == .post && path == "/blobs"
        if !dashboardPage, !upload, Rules.carriesBody(request), !Rules.isJSON(request.headers[.contentType]) {
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
