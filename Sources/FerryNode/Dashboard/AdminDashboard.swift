import FerryCore
import FerryCouch
import FerryCouchDocuments
import FerryQuery
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import HummingbirdCore
import HTTPTypes
import NIOCore

/// The web dashboard on the admin listener (`/ui/`): a login (the admin key, or a one-time
/// link from `ferry ui`) that opens an HttpOnly, SameSite=Strict session cookie; the page
/// and its assets, built into the binary, under a strict Content-Security-Policy; a live
/// event stream; logout. The page itself calls the admin API with its session and CSRF token.
extension AdminAPI {
    /// The dashboard's paths: the routes are registered under these, and `AdminGuard.openRoutes`
    /// names the open ones by the same values, so the two cannot drift apart.
    enum Dashboard {
        static let page: RouterPath = "/ui/"
        static let login: RouterPath = "/ui/login"
        static let logout: RouterPath = "/ui/logout"
        static let script: RouterPath = "/ui/app.js"
        static let style: RouterPath = "/ui/app.css"
        static let events: RouterPath = "/ui/events"
        static let tokens: RouterPath = "/ui/tokens"
        /// Browsers ask for it on every origin they show.
        static let favicon: RouterPath = "/favicon.ico"
    }

    func addDashboardRoutes(to router: Router<BasicRequestContext>) {
        router.get(Dashboard.page) { request, _ in dashboardPage(request) }
        router.get(Dashboard.login) { request, _ in loginPage(request) }
        router.post(Dashboard.login) { request, _ in try await login(request) }
        router.post(Dashboard.logout) { request, _ in try await logout(request) }
        router.get(Dashboard.script) { _, _ in Self.asset(DashboardAssets.script, type: "text/javascript; charset=utf-8") }
        router.get(Dashboard.style) { _, _ in Self.asset(DashboardAssets.style, type: "text/css; charset=utf-8") }
        router.get(Dashboard.favicon) { _, _ in Self.asset(DashboardAssets.icon, type: "image/svg+xml") }
        router.get(Dashboard.events) { request, _ in try events(request) }
        router.post(Dashboard.tokens) { request, _ in try loginToken(request) }
    }

    /// The headers every dashboard response carries: nothing from elsewhere may run, frame
    /// or be framed, nothing is cached, and no referrer leaves the node (`same-origin`, not
    /// `no-referrer`, under which a browser sends `Origin: null` with the login form).
    static let securityHeaders: [(HTTPField.Name, String)] = [
        (
            .contentSecurityPolicy,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        ),
        (HTTPField.Name("X-Content-Type-Options")!, "nosniff"),
        (HTTPField.Name("Referrer-Policy")!, "same-origin"),
        (HTTPField.Name("X-Frame-Options")!, "DENY"),
        (.cacheControl, "no-store"),
    ]

    static func page(_ html: String, status: HTTPResponse.Status = .ok, extra: [(HTTPField.Name, String)] = []) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "text/html; charset=utf-8"
        for (name, value) in securityHeaders + extra { headers.append(HTTPField(name: name, value: value)) }
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: html)))
    }

    static func asset(_ text: String, type: String) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = type
        for (name, value) in securityHeaders { headers.append(HTTPField(name: name, value: value)) }
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    static func redirect(_ to: String, extra: [(HTTPField.Name, String)] = []) -> Response {
        var headers = HTTPFields()
        headers[.location] = to
        for (name, value) in securityHeaders + extra { headers.append(HTTPField(name: name, value: value)) }
        return Response(status: .seeOther, headers: headers)
    }

    /// The session this request's cookie opens: its cookie and CSRF token.
    func session(_ request: Request) -> (cookie: String, csrf: String)? {
        guard let cookie = DashboardSessions.cookie(in: request.headers[.cookie]),
            let csrf = node.dashboardSessions.csrf(cookie: cookie)
        else { return nil }
        return (cookie, csrf)
    }

    static func sessionCookie(_ value: String, maxAge: Int) -> (HTTPField.Name, String) {
        (.setCookie, "\(DashboardSessions.cookieName)=\(value); Path=/; HttpOnly; SameSite=Strict; Max-Age=\(maxAge)")
    }

    /// `GET /ui/`: the dashboard, or the login page without a session.
    func dashboardPage(_ request: Request) -> Response {
        guard let s = session(request) else { return Self.redirect("/ui/login") }
        return Self.page(DashboardAssets.shell(csrf: s.csrf, nodeName: node.configuration.name))
    }

    /// `GET /ui/login[?token=T]`: the login form, or a one-time link's login.
    func loginPage(_ request: Request) -> Response {
        if let token = request.uri.queryParameters.get("token") {
            guard node.dashboardSessions.redeem(String(token)) else {
                return Self.page(DashboardAssets.login(error: "This login link was used already or has expired: run `ferry ui` again."), status: .unauthorized)
            }
            return startSession()
        }
        if session(request) != nil { return Self.redirect("/ui/") }
        return Self.page(DashboardAssets.login(error: nil))
    }

    func startSession() -> Response {
        let (cookie, _) = node.dashboardSessions.create()
        node.logger.info("dashboard login")
        return Self.redirect("/ui/", extra: [Self.sessionCookie(cookie, maxAge: Int(DashboardSessions.lifetime))])
    }

    /// `POST /ui/login` with the form field `key`.
    func login(_ request: Request) async throws -> Response {
        let form = try await Self.form(request)
        guard let key = form["key"], node.adminKey.matches(key.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            node.logger.warning("dashboard login refused: wrong admin key")
            return Self.page(DashboardAssets.login(error: "That is not this node's admin key (DATA/admin.key)."), status: .unauthorized)
        }
        return startSession()
    }

    /// `POST /ui/logout` with the form field `csrf`: ends the session.
    func logout(_ request: Request) async throws -> Response {
        let form = try await Self.form(request)
        if let s = session(request) {
            guard let sent = form["csrf"], AdminKey(value: s.csrf).matches(sent) else {
                throw APIError(.forbidden, "csrf", "logging out needs the page's CSRF token")
            }
            node.dashboardSessions.end(cookie: s.cookie)
        }
        return Self.redirect("/ui/login", extra: [Self.sessionCookie("", maxAge: 0)])
    }

    /// `POST /ui/tokens`: a one-time login link, valid two minutes; the admin key only (what
    /// `ferry ui` sends). The guard admits the key or a session; this checks the key again
    /// itself, so a link (a new twelve-hour session) never rests on the guard alone, and a
    /// session cannot renew itself through one.
    func loginToken(_ request: Request) throws -> Response {
        guard try AdminGuard<BasicRequestContext>.credential(of: request, key: node.adminKey, sessions: node.dashboardSessions) == .adminKey else {
            throw APIError(.unauthorized, "unauthorized", "a dashboard login link needs the node's admin key (DATA/admin.key), as `ferry ui` sends it")
        }
        let token = node.dashboardSessions.issueToken()
        let port = node.configuration.adminPort
        return json([
            "path": .string("/ui/login?token=\(token)"), "expiresSeconds": .int(Int64(DashboardSessions.tokenLifetime)),
            "port": .int(Int64(port)),
        ])
    }

    /// `GET /ui/events`: a server-sent event each second with the node, its peers and the
    /// group (for the mesh and health views), for a minute or until the session ends; the
    /// browser reconnects by itself. A session holds at most
    /// `DashboardSessions.maxStreamsPerSession` streams and the node
    /// `DashboardSessions.maxStreams`; past either, 429 `too_many_streams`.
    func events(_ request: Request) throws -> Response {
        guard let s = session(request) else { throw APIError(.unauthorized, "unauthorized", "log in at /ui/login") }
        let slot: StreamSlot
        do throws(DashboardSessions.StreamRefusal) { slot = try node.dashboardSessions.openStream(cookie: s.cookie) } catch {
            node.logger.notice("dashboard event stream refused", metadata: ["reason": "\(error)"])
            throw APIError(.tooManyRequests, "too_many_streams", error.description)
        }
        let shutdown = self.shutdown, sessions = node.dashboardSessions, cookie = s.cookie
        let body = ResponseBody { writer in
            // A write to a connection the client closed throws: the slot is given back then too.
            defer { slot.release() }
            let started = ContinuousClock.now
            while !shutdown.isFired && ContinuousClock.now - started < .seconds(60) && sessions.csrf(cookie: cookie) != nil {
                let snapshot = (try? self.eventSnapshot()) ?? .object([:])
                try await writer.write(ByteBuffer(string: "data: \(snapshot.canonicalString)\n\n"))
                try await Race.first({ try await Task.sleep(for: .seconds(1)) }, { await shutdown.wait() })
            }
            try await writer.finish(nil)
        }
        var headers = HTTPFields()
        headers[.contentType] = "text/event-stream"
        for (name, value) in Self.securityHeaders { headers.append(HTTPField(name: name, value: value)) }
        return Response(status: .ok, headers: headers, body: body)
    }

    func eventSnapshot() throws -> JSON {
        .object([
            "node": try nodeInfoJSON(), "peers": peersJSON()["peers"] ?? .array([]), "group": groupInfoJSON(),
            "metrics": .object(metricsSnapshot()), "time": .double(Date().timeIntervalSince1970),
        ])
    }

    /// The counters the health charts plot.
    func metricsSnapshot() -> [String: JSON] {
        let text = node.metrics.render(
            connectedPeers: manager.connectedCount, inboundConnections: listener.connections.count, storeBytes: node.store.sizeOnDisk(),
            documents: (try? node.store.info().documentCount) ?? 0, lastSequence: (try? node.store.lastSequence) ?? 0)
        var out: [String: JSON] = ["freeBytes": .int(Self.freeBytes(node.dataDirectory))]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, let value = Double(parts[1]) else { continue }
            let name = String(parts[0].split(separator: "{")[0])
            guard ["ferry_bytes_sent_total", "ferry_bytes_received_total", "ferry_last_sequence", "ferry_connected_peers", "ferry_store_size_bytes", "ferry_documents"].contains(name)
            else { continue }
            out[name] = .double((out[name]?.doubleValue ?? 0) + value)
        }
        return out
    }

    static func freeBytes(_ path: String) -> Int64 {
        var s = statvfs()
        guard statvfs(path, &s) == 0 else { return 0 }
        return Int64(s.f_bavail) * Int64(s.f_frsize)
    }

    /// An `application/x-www-form-urlencoded` body (at most 8 KiB).
    static func form(_ request: Request) async throws -> [String: String] {
        let buffer = try await request.body.collect(upTo: 8192)
        var out: [String: String] = [:]
        for pair in String(buffer: buffer).split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1).map { String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "" }
            if kv.count == 2 { out[kv[0]] = kv[1] }
        }
        return out
    }

    // MARK: conflicts and queries (admin API routes the dashboard uses)

    /// `GET /conflicts?limit=N`: conflicted documents with every live leaf's body.
    func conflicts(_ request: Request) throws -> Response {
        let limit = try intParameter(request.uri.queryParameters.get("limit"), "limit", default: 100, 1...1000)
        var rows: [JSON] = []
        for id in try node.store.conflictedDocumentIDs(limit: limit) {
            guard let doc = try node.store.document(id), let tree = try node.store.revisionTree(id) else { continue }
            var leaves: [JSON] = []
            for leaf in tree.leaves where !leaf.deleted {
                let body = try node.store.document(id, revision: leaf.id)?.body ?? .null
                leaves.append(["rev": .string(leaf.id.description), "body": body, "winner": .bool(leaf.id == doc.revision)])
            }
            rows.append(["id": .string(id.rawValue), "rev": .string(doc.revision.description), "leaves": .array(leaves)])
        }
        return json(["conflicts": .array(rows)])
    }

    /// `POST /conflicts/resolve` `{"id", "resolver": "merge" | "lastWriteWins" | "deletesWin"}`:
    /// resolves one document's conflict now; the result replicates like any write.
    func resolveConflict(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        guard let text = body["id"]?.stringValue, let name = body["resolver"]?.stringValue else {
            throw APIError(.badRequest, "bad_request", "the body must be {\"id\": ID, \"resolver\": \"merge\" | \"lastWriteWins\" | \"deletesWin\"}")
        }
        let id: DocumentID
        do { id = try DocumentID(text) } catch { throw APIError(.badRequest, "bad_id", error.description) }
        let resolvers: [String: ConflictResolver] = ["merge": .merge, "lastWriteWins": .lastWriteWins, "deletesWin": .deletesWin]
        guard let resolver = resolvers[name] else {
            throw APIError(.badRequest, "bad_request", "unknown resolver \"\(LogText.escape(name))\": merge, lastWriteWins or deletesWin")
        }
        guard try node.store.revisionTree(id) != nil else { throw StoreError.notFound(id) }
        let written = try node.store.resolveConflict(id, with: resolver, logger: node.logger)
        let doc = try node.store.document(id)
        return json(["id": .string(id.rawValue), "written": .int(Int64(written)), "rev": doc.map { .string($0.revision.description) } ?? .null])
    }

    /// `POST /find`: a Mango query (CouchDB's `_find` body) with the index that served it.
    func find(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        let database = node.makeCouchDatabase()
        do {
            let found = try database.find(body: body, principal: .admin)
            let explained = try database.explain(try MangoQuery(parsing: body), body: body, principal: .admin)
            var o = found.json.objectValue ?? [:]
            o["index"] = explained["index"] ?? .null
            return json(.object(o))
        } catch let e as CouchError {
            throw APIError(.badRequest, e.error, e.reason)
        } catch let e as MangoError {
            throw APIError(e)
        }
    }
}
