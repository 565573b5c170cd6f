import FerryCore
import Foundation
import Hummingbird
import HummingbirdTesting
import IntegrationHarness
import NIOCore
import Testing

@testable import FerryNode

/// The admin guard against the router it guards: every route the admin router serves,
/// reached by every spelling of its path a client can send (`//`, a trailing `/`, `%2F`,
/// `.` and `..` segments, other letter cases), refuses a caller without the admin key or a
/// session; and the dashboard's live event streams are capped per session and in total.
@Suite(.timeLimit(.minutes(3))) struct AdminGuardPathTests {
    /// One route of the admin router: its method, its path as the router names it, and that
    /// path with its captures filled in, as segments (`/replications/{id}/pause` is
    /// `["replications", "x", "pause"]`, `/docs/**` is `["docs", "a", "b"]`).
    struct Endpoint: Sendable, CustomStringConvertible {
        let method: HTTPRequest.Method
        let route: String
        let segments: [String]
        let open: Bool

        var description: String { "\(method) \(route)" }
        var body: String? { [.post, .put].contains(method) ? "{}" : nil }
    }

    /// Every route the admin router serves, read from the router itself.
    static func endpoints(_ n: RoutedNode) -> [Endpoint] {
        let open = AdminGuard<BasicRequestContext>.openRoutes
        return n.api.router().routes.map { r in
            let segments = r.path.components.flatMap { c -> [String] in
                let d = c.description
                if d == "**" { return ["a", "b"] }
                if d.contains("{") || d.contains("*") { return ["x"] }
                return [d]
            }
            return Endpoint(method: r.method, route: r.path.description, segments: segments, open: open.contains(.init(r.method, r.path)))
        }
    }

    /// The spellings of one path that a client may send for it: those Hummingbird's router
    /// reads as the path itself (empty segments, a trailing `/`) and those it does not
    /// (dot segments, escapes, letter case), which must fare no better.
    static func variants(_ s: [String]) -> [String] {
        let canonical = "/" + s.joined(separator: "/")
        let escapedFirst = s.map { seg in
            guard let c = seg.unicodeScalars.first, c.isASCII else { return seg }
            return String(format: "%%%02X", c.value) + seg.dropFirst()
        }
        var out: [String] = [
            canonical,
            canonical + "/",
            "/" + canonical,
            "/" + s.joined(separator: "//"),
            "//" + s.joined(separator: "///") + "//",
            canonical + "//",
            "/./" + s.joined(separator: "/"),
            "/" + s.joined(separator: "/./"),
            canonical + "/.",
            canonical + "/..",
            "/x/../" + s.joined(separator: "/"),
            "/" + s.joined(separator: "/x/../"),
            "/" + s.joined(separator: "%2F"),
            "/" + s.joined(separator: "%2f"),
            "/%2F" + s.joined(separator: "/"),
            "/" + escapedFirst.joined(separator: "/"),
            canonical.uppercased(),
            "/" + s.map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined(separator: "/"),
            "/" + s.joined(separator: "\\"),
            canonical + ";x",
            canonical + "%00",
        ]
        if s.isEmpty { out += ["//", "///", "/.", "/..", "/%2F"] }
        return Array(Set(out)).sorted()
    }

    /// Whether an answer is the router's "no such route" (not a handler's own 404).
    static func noRoute(_ a: AdminAnswer) -> Bool {
        a.status == 404 && a["reason"]?.stringValue?.hasPrefix("no route") == true
    }

    /// The guard's own refusal (a handler's 401 reads differently).
    static func refusedByGuard(_ a: AdminAnswer) -> Bool {
        a.status == 401 && a.code == "unauthorized" && a["reason"]?.stringValue?.hasPrefix("send the node's admin key") == true
    }

    @Test func everyGuardedRouteRefusesEverySpellingOfItsPathWithoutTheKey() async throws {
        let n = try RoutedNode()
        let guarded = Self.endpoints(n).filter { !$0.open }
        // The enumeration is the router's own: it holds the sensitive routes, and they are guarded.
        #expect(guarded.count >= 40, "\(guarded)")
        for sensitive in ["POST /ui/tokens", "GET /ui/events", "PUT /docs/**", "POST /trust", "POST /group/invitations", "POST /couch/users"] {
            #expect(guarded.contains { $0.description == sensitive }, "\(sensitive) is not a guarded route")
        }
        try await n.test { c in
            for e in guarded {
                for path in Self.variants(e.segments) {
                    let a = try await c.call(e.method, path, body: e.body, withKey: false)
                    #expect(Self.refusedByGuard(a), "\(e.method) \(path) (route \(e.route)) answered \(a.status) without the key: \(a.text)")
                }
            }
        }
    }

    @Test func theRouterReadsEmptySegmentsAndATrailingSlashAsTheRouteItself() async throws {
        // Why the guard must decide on the router's match: these spellings reach the handler.
        let n = try RoutedNode()
        let endpoints = Self.endpoints(n)
        try await n.test { c in
            for e in endpoints {
                for path in ["/" + e.segments.joined(separator: "//") + "/", "//" + e.segments.joined(separator: "/")] {
                    let a = try await c.call(e.method, path, body: e.body)
                    #expect(!Self.noRoute(a), "\(e.method) \(path) found no route: the router splits paths differently than assumed")
                }
            }
            let link = try await c.call(.post, "/ui//tokens/", body: "{}")
            #expect(link.status == 200 && link["path"]?.stringValue?.hasPrefix("/ui/login?token=") == true, "\(link.text)")
        }
    }

    @Test func onlyTheDashboardsLoginPagesAndFilesAnswerWithoutACredential() async throws {
        let n = try RoutedNode()
        let endpoints = Self.endpoints(n)
        let registered = Set(n.api.router().routes.map { AdminGuard<BasicRequestContext>.Route($0.method, $0.path) })
        let open = AdminGuard<BasicRequestContext>.openRoutes
        // No stale or misspelt entry: each open route is one the router serves.
        #expect(open.isSubset(of: registered), "\(open.subtracting(registered))")
        #expect(Set(open.map(\.path)) == ["/ui", "/ui/login", "/ui/logout", "/ui/app.js", "/ui/app.css", "/favicon.ico"])
        try await n.test { c in
            for e in endpoints {
                let a = try await c.call(e.method, "/" + e.segments.joined(separator: "/"), body: e.body, withKey: false)
                #expect(Self.refusedByGuard(a) != e.open, "\(e): \(a.status) \(a.text)")
            }
            // A path no route serves tells a caller without a credential nothing either.
            #expect(Self.refusedByGuard(try await c.call(.get, "/no/such/route", withKey: false)))
            #expect(Self.refusedByGuard(try await c.call(.delete, "/ui/login", withKey: false)))
        }
    }

    @Test func aLoginLinkNeedsTheAdminKeyNotASession() async throws {
        let n = try RoutedNode()
        let (cookie, csrf) = n.node.dashboardSessions.create()
        try await n.test { c in
            let headers = ["Cookie": "\(DashboardSessions.cookieName)=\(cookie)", AdminGuard<BasicRequestContext>.csrfHeader: csrf]
            let bySession = try await c.call(.post, "/ui/tokens", body: "{}", headers: headers, withKey: false)
            #expect(bySession.status == 401 && bySession["path"] == nil, "\(bySession.text)")
            // The same session may still use the API it is for.
            #expect(try await c.call(.get, "/", headers: headers, withKey: false).status == 200)
            #expect(try await c.call(.post, "/ui/tokens", body: "{}").status == 200)
        }
    }

    @Test func eventStreamsAreCappedPerSessionAndInTotalAndFreedWhenTheyEnd() throws {
        let sessions = DashboardSessions()
        let first = sessions.create().cookie
        var held = try (0..<DashboardSessions.maxStreamsPerSession).map { _ in try sessions.openStream(cookie: first) }
        #expect(throws: DashboardSessions.StreamRefusal.sessionFull(limit: DashboardSessions.maxStreamsPerSession)) {
            try sessions.openStream(cookie: first)
        }
        // Other sessions fill the node's total.
        while sessions.openStreams().total < DashboardSessions.maxStreams {
            let cookie = sessions.create().cookie
            for _ in 0..<min(DashboardSessions.maxStreamsPerSession, DashboardSessions.maxStreams - sessions.openStreams().total) {
                held.append(try sessions.openStream(cookie: cookie))
            }
        }
        let late = sessions.create().cookie
        #expect(throws: DashboardSessions.StreamRefusal.nodeFull(limit: DashboardSessions.maxStreams)) { try sessions.openStream(cookie: late) }
        // A released slot frees one place, once, however often it is released.
        held[0].release()
        held[0].release()
        #expect(sessions.openStreams(cookie: first).session == DashboardSessions.maxStreamsPerSession - 1)
        #expect(sessions.openStreams().total == DashboardSessions.maxStreams - 1)
        let again = try sessions.openStream(cookie: first)
        #expect(sessions.openStreams().total == DashboardSessions.maxStreams)
        // Slots dropped without a release (a stream that never ran) are given back too.
        held.removeAll()
        withExtendedLifetime(again) { #expect(sessions.openStreams().total == 1) }
    }

    @Test func aStreamPastTheSessionsCapIsRefusedWith429WhileTheAPIStillAnswers() async throws {
        let n = try RoutedNode()
        let sessions = n.node.dashboardSessions
        let (cookie, _) = sessions.create()
        let headers = ["Cookie": "\(DashboardSessions.cookieName)=\(cookie)"]
        try await n.test { c in
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<DashboardSessions.maxStreamsPerSession {
                    group.addTask { try await c.call(.get, "/ui/events", headers: headers, withKey: false).status }
                }
                try await waitUntil("every stream holds its slot") { sessions.openStreams(cookie: cookie).session == DashboardSessions.maxStreamsPerSession }
                let refused = try await c.call(.get, "/ui/events", headers: headers, withKey: false)
                #expect(refused.status == 429 && refused.code == "too_many_streams", "\(refused.text)")
                #expect(refused["reason"]?.stringValue?.contains("\(DashboardSessions.maxStreamsPerSession)") == true)
                #expect(try await c.call(.get, "/").status == 200)
                // Logging out ends the session's streams, and their slots are given back.
                sessions.end(cookie: cookie)
                for try await status in group { #expect(status == 200) }
            }
            #expect(sessions.openStreams().total == 0)
        }
    }
}
