import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle

/// The loopback-only admin REST API (Hummingbird): node status, documents, changes,
/// peers, replications, trust and Prometheus metrics, all JSON but the metrics.
/// docs/operations.md is the reference for every route.
struct AdminAPI: Sendable {
    let node: FerryNode
    let manager: PeerManager
    /// For the bound port and the count of live inbound connections.
    let listener: WebSocketListener
    let readiness: ReadinessBox
    /// Fired when the node begins a graceful shutdown: open long-polls answer at once.
    let shutdown = ShutdownSignal()

    /// Largest request body accepted (a document plus its envelope).
    var maxBodyBytes: Int { node.configuration.limits.maxDocumentBytes + 64 * 1024 }

    /// The routes behind the error middleware and the guard; `application()` serves them.
    func router() -> Router<BasicRequestContext> {
        let router = Router()
        router.add(middleware: APIErrorMiddleware(logger: node.logger))
        router.add(middleware: AdminGuard<BasicRequestContext>(
            key: node.adminKey, allowedOrigins: node.configuration.adminAllowedOrigins,
            publicMetrics: node.configuration.adminPublicMetrics, sessions: node.dashboardSessions))
        router.get("/") { _, _ in try nodeInfo() }
        router.get("/docs") { request, _ in try listDocuments(request) }
        router.get("/docs/**") { request, ctx in try getDocument(request, id: try documentID(ctx, allowReserved: true)) }
        router.put("/docs/**") { request, ctx in try await putDocument(request, id: try documentID(ctx)) }
        router.delete("/docs/**") { request, ctx in try deleteDocument(request, id: try documentID(ctx)) }
        router.get("/changes") { request, _ in try await changes(request) }
        router.get("/peers") { _, _ in peers() }
        router.get("/replications") { _, _ in replications() }
        router.post("/replications") { request, _ in try await addReplication(request) }
        router.delete("/replications/:id") { _, ctx in try removeReplication(ctx.parameters.require("id")) }
        router.post("/replications/:id/pause") { _, ctx in try replicationAction(ctx.parameters.require("id"), "pause") }
        router.post("/replications/:id/resume") { _, ctx in try replicationAction(ctx.parameters.require("id"), "resume") }
        router.post("/replications/:id/reset") { _, ctx in try replicationAction(ctx.parameters.require("id"), "reset") }
        router.get("/trust") { _, _ in trustList() }
        router.post("/trust") { request, _ in try await addTrust(request) }
        router.put("/trust/:id") { request, ctx in try await setTrust(request, id: ctx.parameters.require("id")) }
        router.delete("/trust/:id") { _, ctx in try removeTrust(ctx.parameters.require("id")) }
        router.get("/group") { _, _ in groupInfo() }
        router.post("/group/invitations") { request, _ in try await invite(request) }
        router.post("/group/join") { request, _ in try await join(request) }
        router.delete("/group/members/:id") { _, ctx in try removeMember(ctx.parameters.require("id")) }
        router.get("/metrics") { _, _ in metrics() }
        addBlobRoutes(to: router)
        addCouchUserRoutes(to: router)
        addAccessRoutes(to: router)
        addDashboardRoutes(to: router)
        router.get("/conflicts") { request, _ in try conflicts(request) }
        router.post("/conflicts/resolve") { request, _ in try await resolveConflict(request) }
        router.post("/find") { request, _ in try await find(request) }
        return router
    }

    func application() -> some Service {
        let readiness = self.readiness
        let app = Application(
            router: router(),
            server: .init { responder in AdminHTTP1Channel(responder: responder) },
            configuration: .init(
                address: .hostname(node.configuration.adminInterface, port: node.configuration.adminPort), serverName: "ferry"),
            onServerRunning: { channel in readiness.adminBound(channel.localAddress?.port ?? 0) },
            eventLoopGroupProvider: FrontDoorEventLoops.admin,
            logger: node.logger)
        return AdminService(server: app, shutdown: shutdown)
    }

    // MARK: node

    func nodeInfo() throws -> Response { json(try nodeInfoJSON()) }

    func nodeInfoJSON() throws -> JSON {
        let info = try node.store.info()
        return .object([
            "id": .string(node.identity.nodeID), "name": .string(node.configuration.name), "version": .string(FerryVersion.current),
            "group": .string(node.configuration.group), "port": .int(Int64(listener.boundPort ?? 0)),
            "database": .string(node.store.uuid), "docCount": .int(Int64(info.documentCount)),
            "deletedCount": .int(Int64(info.deletedCount)), "conflictedCount": .int(Int64(info.conflictedCount)),
            "lastSequence": .int(Int64(info.lastSequence)), "digest": .string(try node.store.contentDigest()),
            "access": .object([
                "version": .string(node.access.version), "rules": .int(Int64(node.access.snapshot.rules.count)),
                "removed": .int(try node.store.accessRemovals().total),
            ]),
            "schedulerLag": Self.lagJSON(node.schedulerLag.snapshot),
        ])
    }

    /// `{"lastMs","worstMs","slowWakes","wakes"}`: the scheduler lag probe's figures.
    static func lagJSON(_ s: SchedulerLagProbe.Snapshot) -> JSON {
        [
            "lastMs": .int(s.last.milliseconds), "worstMs": .int(s.worst.milliseconds), "slowWakes": .int(Int64(s.slowWakes)),
            "wakes": .int(Int64(s.wakes)),
        ]
    }

    // MARK: documents

    func documentID(_ ctx: BasicRequestContext, allowReserved: Bool = false) throws -> DocumentID {
        let raw = ctx.parameters.getCatchAll().map { String($0).removingPercentEncoding ?? String($0) }.joined(separator: "/")
        do { return try DocumentID(raw, allowReserved: allowReserved) } catch { throw APIError(.badRequest, "bad_id", error.description) }
    }

    func getDocument(_ request: Request, id: DocumentID) throws -> Response {
        let q = request.uri.queryParameters
        if q.get("tree") == "true" { return try revisionTree(id) }
        let rev = try q.get("rev").map(revision)
        guard let doc = try node.store.document(id, revision: rev) else { throw StoreError.notFound(id) }
        return json(doc.json(includeConflicts: q.get("conflicts") == "true"))
    }

    /// `GET /docs/{id}?tree=true`: every revision held, parents first:
    /// `{"id","revisions":[{"rev","parent","deleted","leaf","winner","bodyKept"}]}`.
    func revisionTree(_ id: DocumentID) throws -> Response {
        guard let tree = try node.store.revisionTree(id) else { throw StoreError.notFound(id) }
        let winner = tree.winnerIndex
        return json([
            "id": .string(id.rawValue),
            "revisions": .array(tree.revisions.enumerated().map { i, r in
                [
                    "rev": .string(r.id.description), "parent": r.parent.map { .string(tree.revisions[$0].id.description) } ?? .null,
                    "deleted": .bool(r.deleted), "leaf": .bool(r.isLeaf), "winner": .bool(i == winner), "bodyKept": .bool(r.body != nil),
                ]
            }),
        ])
    }

    func putDocument(_ request: Request, id: DocumentID) async throws -> Response {
        let body = try await readJSON(request)
        let input = try DocumentInput(parsing: body)
        if let bodyID = input.id, bodyID != id.rawValue {
            throw APIError(.badRequest, "bad_id", "_id \"\(bodyID)\" in the body does not match the URL's \"\(id)\"")
        }
        if input.deleted { throw APIError(.badRequest, "bad_request", "use DELETE /docs/{id}?rev= to delete") }
        let query = request.uri.queryParameters.get("rev")
        if let q = query, let b = input.rev, q != b {
            throw APIError(.badRequest, "bad_request", "?rev=\(q) and _rev \(b) disagree")
        }
        let parent = try (query ?? input.rev).map(revision)
        let rev = try node.store.put(id, body: input.body, parent: parent)
        return json(["id": .string(id.rawValue), "rev": .string(rev.description)], status: .created)
    }

    func deleteDocument(_ request: Request, id: DocumentID) throws -> Response {
        guard let r = request.uri.queryParameters.get("rev") else {
            throw APIError(.badRequest, "bad_request", "DELETE needs ?rev= with the revision being deleted")
        }
        let keep = request.uri.queryParameters.get("keepProperties") == "true"
        // The store calls this a conflict (no such leaf); over HTTP a missing document is 404.
        guard try node.store.revisionTree(id) != nil else { throw StoreError.notFound(id) }
        let rev = try node.store.delete(id, revision: try revision(r), keepProperties: keep)
        return json(["id": .string(id.rawValue), "rev": .string(rev.description), "deleted": true])
    }

    /// `GET /docs?limit=N&after=ID&prefix=P&deleted=true` → `{"rows":[{"id","rev"[,"deleted"]}],"next":ID|null}`;
    /// the node's own `_ferry/` documents only with a `prefix` inside theirs.
    func listDocuments(_ request: Request) throws -> Response {
        let q = request.uri.queryParameters
        let limit = try intParameter(q.get("limit"), "limit", default: 1000, 1...10_000)
        var after: DocumentID?
        if let s = q.get("after") {
            do { after = try DocumentID(s, allowReserved: true) } catch { throw APIError(.badRequest, "bad_id", error.description) }
        }
        let deleted = q.get("deleted") == "true"
        let prefix = q.get("prefix") ?? ""
        // The node's own documents are listed only when asked for by their prefix: a user's
        // lists and counts leave them out (`DocumentStore.documentCount`).
        let internalAsked = prefix.hasPrefix(DocumentID.nodeInternalPrefix)
        var rows: [(id: DocumentID, revision: RevisionID, deleted: Bool)] = []
        // From just below the prefix (IDs sort by their bytes), a page at a time, to its end.
        var cursor = after ?? (prefix.count > 1 ? try? DocumentID(String(prefix.dropLast()), allowReserved: true) : nil)
        scan: while rows.count <= limit {
            let page = try node.store.allDocuments(after: cursor, limit: 1000, includeDeleted: deleted)
            for d in page {
                if !prefix.isEmpty && !d.id.rawValue.hasPrefix(prefix) {
                    if d.id.rawValue > prefix { break scan }
                    continue
                }
                if d.id.isNodeInternal && !internalAsked { continue }
                rows.append(d)
                if rows.count > limit { break scan }
            }
            guard page.count == 1000, let last = page.last else { break }
            cursor = last.id
        }
        let page = rows.prefix(limit)
        return json([
            "rows": .array(page.map { d in
                var o: [String: JSON] = ["id": .string(d.id.rawValue), "rev": .string(d.revision.description)]
                if d.deleted { o["deleted"] = true }
                return .object(o)
            }),
            "next": rows.count > limit ? .string(page.last!.id.rawValue) : .null,
        ])
    }

    // MARK: changes

    /// `GET /changes?since=N&limit=N[&feed=longpoll&timeout=ms]`.
    func changes(_ request: Request) async throws -> Response {
        let q = request.uri.queryParameters
        let requested = UInt64(try intParameter(q.get("since"), "since", default: 0, 0...Int.max))
        let limit = try intParameter(q.get("limit"), "limit", default: 1000, 1...10_000)
        let feed = q.get("feed") ?? "normal"
        guard feed == "normal" || feed == "longpoll" else {
            throw APIError(.badRequest, "bad_request", "feed must be normal or longpoll")
        }
        let timeout = try intParameter(q.get("timeout"), "timeout", default: 30_000, 0...300_000)
        // A `since` past the store's end is read as the end, so `last_seq` never points
        // past a change the client has not seen. The end is read before the changes: a
        // commit in between is then returned now or after the answered `last_seq`.
        let since = min(requested, try node.store.lastSequence)
        var list = try node.store.changes(since: since, limit: limit)
        if list.isEmpty && feed == "longpoll" && !shutdown.isFired {
            let store = node.store, clock = node.clock, shutdown = self.shutdown
            node.logger.debug("admin long-poll waiting", metadata: ["since": "\(since)", "timeout": "\(timeout)"])
            try await Race.first(
                { try await store.waitForCommit(past: since, poll: .init(interval: .milliseconds(250), clock: clock)) },
                { try await clock.sleep(for: .milliseconds(timeout)) },
                { await shutdown.wait() })
            list = try node.store.changes(since: since, limit: limit)
        }
        return json([
            "results": .array(list.map { c in
                ["seq": .int(Int64(c.sequence)), "id": .string(c.id.rawValue), "rev": .string(c.revision.description), "deleted": .bool(c.deleted)]
            }),
            "last_seq": .int(Int64(list.last?.sequence ?? since)),
        ])
    }

    // MARK: metrics

    func metrics() -> Response {
        let info = try? node.store.info()
        let text = node.metrics.render(
            connectedPeers: manager.connectedCount,
            inboundConnections: listener.connections.count,
            storeBytes: node.store.sizeOnDisk(), documents: info?.documentCount ?? 0, lastSequence: info?.lastSequence ?? 0,
            accessRules: node.access.snapshot.rules.count, accessRemoved: (try? node.store.accessRemovals().total) ?? 0)
        return Response(
            status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
            body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    // MARK: helpers

    func readJSON(_ request: Request) async throws -> JSON {
        let buffer: ByteBuffer
        do { buffer = try await request.body.collect(upTo: maxBodyBytes) } catch {
            // The store's own error, so the CLI says the same whether or not a node runs.
            let declared = request.headers[.contentLength].flatMap { Int($0) }
            throw APIError(StoreError.tooLarge(bytes: declared ?? maxBodyBytes + 1, limit: node.configuration.limits.maxDocumentBytes))
        }
        do { return try JSON.parse(Array(buffer.readableBytesView)) } catch {
            throw APIError(.badRequest, "bad_json", "the body is not valid JSON: \(error)")
        }
    }

    func revision(_ text: String) throws -> RevisionID {
        do { return try RevisionID(text) } catch { throw APIError(.badRequest, "bad_rev", "\"\(text)\" is not a revision ID") }
    }

    func intParameter(_ text: String?, _ name: String, default value: Int, _ range: ClosedRange<Int>) throws -> Int {
        guard let text else { return value }
        guard let n = Int(text), range.contains(n) else {
            throw APIError(.badRequest, "bad_request", "\(name) must be an integer in \(range.lowerBound)...\(range.upperBound)")
        }
        return n
    }
}

/// Renders a JSON body with a status.
func json(_ value: JSON, status: HTTPResponse.Status = .ok) -> Response {
    var bytes = value.canonicalBytes
    bytes.append(0x0A)
    return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
}

/// Runs the admin HTTP server. On graceful shutdown it first answers every open long-poll,
/// so the server's wait for in-flight requests never sits out a long-poll's timeout.
struct AdminService<Server: Service>: Service {
    let server: Server
    let shutdown: ShutdownSignal

    func run() async throws {
        try await withGracefulShutdownHandler {
            try await server.run()
        } onGracefulShutdown: {
            shutdown.fire()
        }
    }
}

/// A one-shot signal that any number of tasks await; firing it (or cancelling a waiter) ends the wait.
final class ShutdownSignal: Sendable {
    private let fired = Latch<Void>()

    var isFired: Bool { fired.value != nil }

    func fire() { fired.set(()) }

    /// Returns once fired, or once the waiting task is cancelled.
    func wait() async { _ = try? await fired.wait() }
}
