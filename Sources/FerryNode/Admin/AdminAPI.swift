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

    // MARK: peers and replications

    func peers() -> Response { json(peersJSON()) }

    func peersJSON() -> JSON {
        let iso = ISO8601DateFormatter()
        let members = node.membership.view?.selected ?? [:]
        let discovery = manager.discoveryStatus
        var discoveryJSON: [String: JSON] = ["state": .string(discovery.state)]
        if let reason = discovery.reason { discoveryJSON["reason"] = .string(reason) }
        return .object(["discovery": .object(discoveryJSON), "peers": .array(manager.peers.map { p in
            var o: [String: JSON] = [
                // The name the group knows the node by, else the one it was trusted or discovered under.
                "id": .string(p.nodeID), "name": (members[p.nodeID]?.name ?? p.name).map(JSON.string) ?? .null,
                "addresses": .array(p.addresses.map(JSON.string)), "port": p.port.map { .int(Int64($0)) } ?? .null,
                "source": .string(p.sources.map(\.rawValue).sorted().joined(separator: "+")), "trusted": .bool(p.trusted),
                "connected": .bool(p.connected), "dialled": .bool(p.dialled),
                "direction": p.direction.map { .string($0.rawValue) } ?? .null,
                "lastSeen": p.lastSeen.map { .string(iso.string(from: $0)) } ?? .null,
                // Whether the digest the peer last reported equals this node's now (null: either
                // unknown, or the peer is not connected and its report is stale).
                "digestMatches": p.connected ? node.digests.matches(p.nodeID).map(JSON.bool) ?? .null : .null,
            ]
            if let url = p.url { o["url"] = .string(url) }
            // The peer's own live links, as its heartbeats last reported them (a view of the whole group).
            if let links = node.mesh.view.links(of: p.nodeID) { o["links"] = .array(links.sorted().map(JSON.string)) }
            // `replication` is the link this node dialled, else the peer's link to this node;
            // `inbound` the latter when there are both.
            let inbound = p.inbound.map { link -> JSON in
                var j = statusJSON(link.status, link.summary, direction: .inbound).objectValue ?? [:]
                j["remoteAddresses"] = .array(link.remoteAddresses.map(JSON.string))
                j["since"] = .string(iso.string(from: link.since))
                return .object(j)
            }
            if let status = p.status, let summary = p.summary {
                o["replication"] = statusJSON(status, summary, direction: .outbound)
                if let inbound { o["inbound"] = inbound }
            } else if let inbound {
                o["replication"] = inbound
            }
            return .object(o)
        })])
    }

    /// A replication's status and counters; `direction` says which side dialled (peers only).
    func statusJSON(_ status: ReplicatorStatus, _ summary: ReplicationSummary, direction: PeerManager.Direction? = nil) -> JSON {
        var o: [String: JSON] = [
            "activity": .string(status.activity.rawValue), "completed": .int(Int64(status.completed)), "total": .int(Int64(status.total)),
            "error": status.error.map { .string($0.statusText) } ?? .null,
            "errorCode": status.error.map { .string($0.code) } ?? .null,
            "errorTransient": status.error.map { .bool($0.isTransient) } ?? .null,
            "pushed": .int(Int64(summary.pushed)), "pulled": .int(Int64(summary.pulled)), "rejected": .int(Int64(summary.rejected)),
            "conflicts": .int(Int64(summary.conflicts)), "bytesSent": .int(Int64(summary.bytesSent)),
            "bytesReceived": .int(Int64(summary.bytesReceived)),
            "blobsSent": .int(Int64(summary.blobsSent)), "blobsReceived": .int(Int64(summary.blobsReceived)),
            "blobBytesSent": .int(summary.blobBytesSent), "blobBytesReceived": .int(summary.blobBytesReceived),
            "blobBytesToSend": .int(summary.blobBytesToSend), "blobBytesToReceive": .int(summary.blobBytesToReceive),
            "blobsDeferred": .int(Int64(summary.blobsDeferred)),
        ]
        if let direction { o["direction"] = .string(direction.rawValue) }
        return .object(o)
    }

    func replications() -> Response {
        let list = manager.replications
        return json(["replications": .array(list.map { r in
            // Never the URL's password.
            var o = r.spec.publicJSON.objectValue!
            o["kind"] = .string(r.spec.isCouch ? "couchdb" : "ferry")
            o["source"] = .string(r.source.rawValue)
            o["status"] = statusJSON(r.status, r.summary)
            o["paused"] = .bool(manager.isPaused(r.spec.id))
            return .object(o)
        })])
    }

    func addReplication(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        let spec: ReplicationSpec
        do {
            spec = try ConfigReader(file: "request body").replication(body, "", defaultID: UUID().uuidString.lowercased().prefix(8).description)
        } catch { throw APIError(.badRequest, "bad_request", error.key.isEmpty ? error.reason : "\(error.key): \(error.reason)") }
        if node.configuration.replications.contains(where: { $0.id == spec.id }) {
            throw APIError(.conflict, "conflict", "replication \(spec.id) is defined in the config file")
        }
        // A new replication never replaces one by the same ID: DELETE it first.
        guard try node.replicationRegistry.add(spec) else {
            throw APIError(.conflict, "conflict", "replication \(spec.id) exists; DELETE /replications/\(spec.id) first to replace it")
        }
        manager.startReplication(spec, source: .api)
        return json(spec.publicJSON, status: .created)
    }

    /// `POST /replications/{id}/pause|resume|reset`: stop it until resumed; run it again from
    /// its checkpoint; run it again from the beginning (its checkpoint reset).
    func replicationAction(_ id: String, _ action: String) throws -> Response {
        let known: Bool
        switch action {
        case "pause": known = manager.pauseReplication(id)
        case "resume": known = manager.resumeReplication(id, resetCheckpoint: false)
        default: known = manager.resumeReplication(id, resetCheckpoint: true)
        }
        guard known else { throw APIError(.notFound, "not_found", "no replication \(id)") }
        node.logger.info("replication \(action)", metadata: ["id": "\(LogText.escape(id))"])
        return json(["id": .string(id), "paused": .bool(manager.isPaused(id))])
    }

    func removeReplication(_ id: String) throws -> Response {
        if node.configuration.replications.contains(where: { $0.id == id }) {
            throw APIError(.conflict, "conflict", "replication \(id) is defined in the config file; remove it there")
        }
        guard try node.replicationRegistry.remove(id) else { throw APIError(.notFound, "not_found", "no replication \(id)") }
        _ = manager.stopReplication(id)
        return json(["id": .string(id), "removed": true])
    }

    // MARK: trust

    func trustList() -> Response {
        json(["trusted": .array(node.trust.entries.map(\.json))])
    }

    /// `POST /trust`: a new entry; an ID already trusted is a 409 (change it with PUT).
    func addTrust(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        let t: NodeConfiguration.TrustEntry
        do { t = try ConfigReader(file: "request body").trustEntry(body, "") } catch { throw badBody(error) }
        let entry = TrustStore.Entry(nodeID: t.nodeID, name: t.name, policy: t.policy, source: .api)
        try node.trust.add(entry)
        manager.trustChanged()
        return json(entry.json, status: .created)
    }

    /// `PUT /trust/{id}`: changes an existing run-time entry; what the body omits stays as it is.
    func setTrust(_ request: Request, id: String) async throws -> Response {
        let body = try await readJSON(request)
        let change: TrustStore.Change
        do { change = try ConfigReader(file: "request body").trustChange(body, "", id: id.lowercased()) } catch { throw badBody(error) }
        guard let entry = try node.trust.update(id.lowercased(), change) else {
            throw APIError(.notFound, "not_found", "node \(id) is not in the trust store (add it with POST /trust)")
        }
        manager.trustChanged()
        return json(entry.json)
    }

    func badBody(_ error: ConfigError) -> APIError {
        APIError(.badRequest, "bad_request", error.reason.isEmpty ? error.description : "\(error.key.trimmingCharacters(in: CharacterSet(charactersIn: "."))) \(error.reason)")
    }

    func removeTrust(_ id: String) throws -> Response {
        guard try node.trust.remove(id.lowercased()) else {
            if node.trust.entry(id.lowercased())?.source == .group {
                throw APIError(.notFound, "not_found", "node \(id) is trusted as a member of this node's group: remove it with `ferry group remove` (DELETE /group/members/{id})")
            }
            throw APIError(.notFound, "not_found", "node \(id) is not in the trust store")
        }
        manager.trustChanged()
        return json(["id": .string(id.lowercased()), "removed": true])
    }

    // MARK: group

    /// `GET /group`: the group, this node's role, and every node with a counting entry.
    func groupInfo() -> Response { json(groupInfoJSON()) }

    func groupInfoJSON() -> JSON {
        let m = node.membership
        let me = node.identity.nodeID
        guard let group = m.group, let view = m.view else {
            return ["group": .null, "self": .string(me), "admin": false, "members": []]
        }
        return .object([
            "group": .string(group), "self": .string(me), "admin": .bool(view.isAdmin(me)),
            "members": .array(view.selected.values.sorted { $0.node < $1.node }.map { e in
                [
                    "id": .string(e.node), "name": e.name.map(JSON.string) ?? .null, "admin": .bool(e.admin && e.state == .member),
                    "state": .string(e.state.rawValue), "version": .int(e.version), "signer": .string(e.signer),
                    "founder": .bool(e.node == group), "addresses": .array(e.addresses.map(JSON.string)),
                ]
            }),
        ])
    }

    /// `POST /group/invitations` `{"admin"?, "expiresSeconds"?, "addresses"?}` → the code.
    func invite(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        guard body.objectValue != nil else { throw APIError(.badRequest, "bad_request", "the body must be a JSON object") }
        if let key = body.objectValue?.keys.first(where: { !["admin", "expiresSeconds", "addresses"].contains($0) }) {
            throw APIError(.badRequest, "bad_request", "unknown member \"\(key)\"")
        }
        let admin = body["admin"]?.boolValue ?? false
        let seconds = body["expiresSeconds"].map { $0.doubleValue ?? -1 } ?? 600
        guard seconds > 0, seconds <= 7 * 86_400 else {
            throw APIError(.badRequest, "bad_request", "expiresSeconds must be a number in (0, 604800]")
        }
        var addresses: [String]?
        if let list = body["addresses"] {
            guard case .array(let items) = list, !items.isEmpty, items.allSatisfy({ $0.stringValue != nil }) else {
                throw APIError(.badRequest, "bad_request", "addresses must be a non-empty array of \"host:port\" strings")
            }
            addresses = items.compactMap(\.stringValue)
        }
        let invitation = try node.membership.invite(admin: admin, lifetime: seconds, addresses: addresses)
        return json(
            [
                "code": .string(invitation.code.text), "group": .string(invitation.group), "admin": .bool(invitation.admin),
                "expires": .string(ISO8601DateFormatter().string(from: invitation.expires)),
                "addresses": .array(invitation.code.addresses.map(JSON.string)),
            ], status: .created)
    }

    /// `POST /group/join` `{"code"}`: joins through the code's inviter.
    func join(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        guard let code = body["code"]?.stringValue else { throw APIError(.badRequest, "bad_request", "the body needs {\"code\": \"ferry1-…\"}") }
        let joined: GroupMembership.Joined
        joined = try await node.membership.join(code: code, name: node.configuration.name)
        return json(["group": .string(joined.group), "inviter": .string(joined.inviter), "members": .int(Int64(joined.members))])
    }

    /// `DELETE /group/members/{id-or-name}`: signs a removed entry.
    func removeMember(_ who: String) throws -> Response {
        let entry = try node.membership.remove(who.removingPercentEncoding ?? who)
        return json(["id": .string(entry.node), "state": .string(entry.state.rawValue), "version": .int(entry.version)])
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
