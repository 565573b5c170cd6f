import FerryCore
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle

/// Ferry's version, as the admin API and `ferry --version` report it.
public enum FerryVersion {
    public static let current = "0.3.0"
}

/// The loopback-only admin REST API (Hummingbird): node status, documents, changes,
/// peers, replications, trust and Prometheus metrics, all JSON but the metrics.
/// docs/operations.md is the reference for every route.
struct AdminAPI: Sendable {
    let node: FerryNode
    let context: NodeContext
    let readiness: ReadinessBox

    /// Largest request body accepted (a document plus its envelope).
    var maxBodyBytes: Int { node.configuration.limits.maxDocumentBytes + 64 * 1024 }

    func application() -> some Service {
        let router = Router()
        router.add(middleware: JSONErrorMiddleware(logger: node.logger))
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
        router.get("/trust") { _, _ in trustList() }
        router.post("/trust") { request, _ in try await addTrust(request) }
        router.delete("/trust/:id") { _, ctx in try removeTrust(ctx.parameters.require("id")) }
        router.get("/metrics") { _, _ in metrics() }
        let readiness = self.readiness
        return Application(
            router: router,
            configuration: .init(
                address: .hostname(node.configuration.adminInterface, port: node.configuration.adminPort), serverName: "ferry"),
            onServerRunning: { channel in readiness.adminBound(channel.localAddress?.port ?? 0) },
            logger: node.logger)
    }

    // MARK: node

    func nodeInfo() throws -> Response {
        let info = try node.store.info()
        return json([
            "id": .string(node.identity.nodeID), "name": .string(node.configuration.name), "version": .string(FerryVersion.current),
            "group": .string(node.configuration.group), "port": .int(Int64(context.listener.boundPort ?? 0)),
            "database": .string(node.store.uuid), "docCount": .int(Int64(info.documentCount)),
            "deletedCount": .int(Int64(info.deletedCount)), "conflictedCount": .int(Int64(info.conflictedCount)),
            "lastSequence": .int(Int64(info.lastSequence)), "digest": .string(try node.store.contentDigest()),
        ])
    }

    // MARK: documents

    func documentID(_ ctx: BasicRequestContext, allowReserved: Bool = false) throws -> DocumentID {
        let raw = ctx.parameters.getCatchAll().map { String($0).removingPercentEncoding ?? String($0) }.joined(separator: "/")
        do { return try DocumentID(raw, allowReserved: allowReserved) } catch { throw APIError(.badRequest, "bad_id", error.description) }
    }

    func getDocument(_ request: Request, id: DocumentID) throws -> Response {
        let q = request.uri.queryParameters
        let rev = try q.get("rev").map(revision)
        guard let doc = try node.store.document(id, revision: rev) else { throw StoreError.notFound(id) }
        return json(doc.json(includeConflicts: q.get("conflicts") == "true"))
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

    /// `GET /docs?limit=N&after=ID&deleted=true` → `{"rows":[{"id","rev"[,"deleted"]}],"next":ID|null}`.
    func listDocuments(_ request: Request) throws -> Response {
        let q = request.uri.queryParameters
        let limit = try intParameter(q.get("limit"), "limit", default: 1000, 1...10_000)
        var after: DocumentID?
        if let s = q.get("after") {
            do { after = try DocumentID(s, allowReserved: true) } catch { throw APIError(.badRequest, "bad_id", error.description) }
        }
        let rows = try node.store.allDocuments(after: after, limit: limit + 1, includeDeleted: q.get("deleted") == "true")
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
        let since = UInt64(try intParameter(q.get("since"), "since", default: 0, 0...Int.max))
        let limit = try intParameter(q.get("limit"), "limit", default: 1000, 1...10_000)
        let feed = q.get("feed") ?? "normal"
        guard feed == "normal" || feed == "longpoll" else {
            throw APIError(.badRequest, "bad_request", "feed must be normal or longpoll")
        }
        var list = try node.store.changes(since: since, limit: limit)
        if list.isEmpty && feed == "longpoll" {
            let timeout = try intParameter(q.get("timeout"), "timeout", default: 30_000, 0...300_000)
            let store = node.store, clock = node.clock
            _ = try await withThrowingTaskGroup(of: Bool.self) { group in
                group.addTask {
                    try await store.waitForCommit(past: since, poll: .init(interval: .milliseconds(250), clock: clock))
                    return !Task.isCancelled
                }
                group.addTask {
                    try await clock.sleep(for: .milliseconds(timeout))
                    return false
                }
                let first = try await group.next() ?? false
                group.cancelAll()
                return first
            }
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

    func peers() -> Response {
        let iso = ISO8601DateFormatter()
        return json(["peers": .array(context.manager.withLock { $0 }?.peers.map { p in
            var o: [String: JSON] = [
                "id": .string(p.nodeID), "name": p.name.map(JSON.string) ?? .null,
                "addresses": .array(p.addresses.map(JSON.string)), "port": p.port.map { .int(Int64($0)) } ?? .null,
                "source": .string(p.sources.sorted().joined(separator: "+")), "trusted": .bool(p.trusted),
                "connected": .bool(p.connected), "dialled": .bool(p.dialled),
                "direction": p.direction.map { .string($0.rawValue) } ?? .null,
                "lastSeen": p.lastSeen.map { .string(iso.string(from: $0)) } ?? .null,
            ]
            if let url = p.url { o["url"] = .string(url) }
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
        } ?? [])])
    }

    /// A replication's status and counters; `direction` says which side dialled (peers only).
    func statusJSON(_ status: ReplicatorStatus, _ summary: ReplicationSummary, direction: PeerManager.Direction? = nil) -> JSON {
        var o: [String: JSON] = [
            "activity": .string(status.activity.rawValue), "completed": .int(Int64(status.completed)), "total": .int(Int64(status.total)),
            "error": status.error.map { .string("\($0)") } ?? .null,
            "errorCode": status.error.map { .string($0.code) } ?? .null,
            "pushed": .int(Int64(summary.pushed)), "pulled": .int(Int64(summary.pulled)), "rejected": .int(Int64(summary.rejected)),
            "conflicts": .int(Int64(summary.conflicts)), "bytesSent": .int(Int64(summary.bytesSent)),
            "bytesReceived": .int(Int64(summary.bytesReceived)),
        ]
        if let direction { o["direction"] = .string(direction.rawValue) }
        return .object(o)
    }

    func replications() -> Response {
        let list = context.manager.withLock { $0 }?.replications ?? []
        return json(["replications": .array(list.map { r in
            var o = r.spec.json.objectValue!
            o["source"] = .string(r.source)
            o["status"] = statusJSON(r.status, r.summary)
            return .object(o)
        })])
    }

    func addReplication(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        let spec: ReplicationSpec
        do {
            spec = try ConfigReader(file: "request body").replication(body, "", defaultID: UUID().uuidString.lowercased().prefix(8).description)
        } catch { throw APIError(.badRequest, "bad_request", error.description.replacingOccurrences(of: "request body: .", with: "")) }
        if node.configuration.replications.contains(where: { $0.id == spec.id }) {
            throw APIError(.conflict, "conflict", "replication \(spec.id) is defined in the config file")
        }
        try node.replicationRegistry.add(spec)
        context.manager.withLock { $0 }?.startReplication(spec, source: "api")
        return json(spec.json, status: .created)
    }

    func removeReplication(_ id: String) throws -> Response {
        if node.configuration.replications.contains(where: { $0.id == id }) {
            throw APIError(.conflict, "conflict", "replication \(id) is defined in the config file; remove it there")
        }
        guard try node.replicationRegistry.remove(id) else { throw APIError(.notFound, "not_found", "no replication \(id)") }
        _ = context.manager.withLock { $0 }?.stopReplication(id)
        return json(["id": .string(id), "removed": true])
    }

    // MARK: trust

    func trustList() -> Response {
        json(["trusted": .array(node.trust.entries.map(\.json))])
    }

    func addTrust(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        let t: NodeConfiguration.TrustEntry
        do { t = try ConfigReader(file: "request body").trustEntry(body, "") } catch {
            throw APIError(.badRequest, "bad_request", error.reason.isEmpty ? error.description : "\(error.key.trimmingCharacters(in: CharacterSet(charactersIn: "."))) \(error.reason)")
        }
        let entry = TrustStore.Entry(nodeID: t.nodeID, name: t.name, policy: t.policy, source: "api")
        try node.trust.add(entry)
        context.manager.withLock { $0 }?.trustChanged()
        return json(entry.json, status: .created)
    }

    func removeTrust(_ id: String) throws -> Response {
        guard try node.trust.remove(id.lowercased()) else { throw APIError(.notFound, "not_found", "node \(id) is not in the trust store") }
        context.manager.withLock { $0 }?.trustChanged()
        return json(["id": .string(id.lowercased()), "removed": true])
    }

    // MARK: metrics

    func metrics() -> Response {
        let info = try? node.store.info()
        let text = node.metrics.render(
            connectedPeers: context.manager.withLock { $0 }?.connectedCount ?? 0,
            inboundConnections: context.listener.connections.count,
            storeBytes: node.store.sizeOnDisk(), documents: info?.documentCount ?? 0, lastSequence: info?.lastSequence ?? 0)
        return Response(
            status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
            body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    // MARK: helpers

    func readJSON(_ request: Request) async throws -> JSON {
        let buffer: ByteBuffer
        do { buffer = try await request.body.collect(upTo: maxBodyBytes) } catch {
            throw APIError(.contentTooLarge, "too_large", "request body over \(maxBodyBytes) bytes")
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

/// An admin API error: HTTP status, a stable code and a reason.
struct APIError: Error {
    let status: HTTPResponse.Status
    let code: String
    let reason: String
    init(_ status: HTTPResponse.Status, _ code: String, _ reason: String) {
        self.status = status
        self.code = code
        self.reason = reason
    }
}

/// Turns every error (unknown routes included) into `{"error": code, "reason": text}`
/// with a fitting status, so clients never see an empty or HTML body.
struct JSONErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    let logger: Logger

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let e as APIError {
            return json(["error": .string(e.code), "reason": .string(e.reason)], status: e.status)
        } catch let e as any FerryError {
            let status: HTTPResponse.Status
            switch e.code {
            case "not_found", "revision_not_found": status = .notFound
            case "conflict": status = .conflict
            case "too_large": status = .contentTooLarge
            case "rejected": status = .forbidden
            case "busy": status = .serviceUnavailable
            case "corrupt", "io", "database": status = .internalServerError
            default: status = .badRequest
            }
            if status == .internalServerError { logger.error("admin API request failed", metadata: ["error": "\(e)"]) }
            return json(["error": .string(e.code), "reason": .string(e.description)], status: status)
        } catch let e as HTTPError {
            let reason = e.status == .notFound ? "no route \(request.method) \(request.uri.path)" : (e.body ?? "\(e.status)")
            return json(["error": .string(e.status == .notFound ? "not_found" : "http_error"), "reason": .string(reason)], status: e.status)
        } catch {
            logger.error("admin API request failed", metadata: ["error": "\(error)"])
            return json(["error": "internal", "reason": .string("\(error)")], status: .internalServerError)
        }
    }
}
