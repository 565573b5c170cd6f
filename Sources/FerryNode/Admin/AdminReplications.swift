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

/// The admin API's peers and replications: `/peers` (every known peer, its links and
/// live status) and the persistent replications (`/replications`: list, add, remove, pause,
/// resume, reset).
extension AdminAPI {
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
}
