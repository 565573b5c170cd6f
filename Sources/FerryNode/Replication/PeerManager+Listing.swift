import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

// What `/peers` shows: every known peer with its trust, links and live status.
extension PeerManager {
    /// Every known peer, with trust and link status: static and discovered peers, and every
    /// peer connected to this node's listener (an inbound-only peer has source "inbound").
    /// Only IDs the transport proved count: a password client's hello ID is a mere claim.
    public var peers: [PeerInfo] {
        let proven = inboundSessions().filter { $0.authenticated && $0.peerID != nil }
        let inbound = Dictionary(grouping: proven, by: { $0.peerID! })
        let (known, ended) = state.withLock { s in (s.peers.values.sorted { $0.nodeID < $1.nodeID }, s.endedInbound) }
        func info(
            nodeID: String, name: String?, addresses: [String], port: Int?, sources: Set<PeerSource>, lastSeen: Date?,
            link: ReplicationLink?, status: ReplicatorStatus?, inbound: [ReplicationResponder.SessionStatus]
        ) -> PeerInfo {
            var p = self.info(
                nodeID: nodeID, name: name, addresses: addresses, port: port, sources: sources, lastSeen: lastSeen, link: link,
                status: status, inbound: inbound)
            if p.inbound == nil, let e = ended[nodeID] { p.inbound = Self.endedLink(e) }
            return p
        }
        var list: [PeerInfo] = known.map { p in
            var sources: Set<PeerSource> = []
            if p.staticURL != nil { sources.insert(.static) }
            if p.memberURL != nil { sources.insert(.group) }
            if p.discovered || p.instance != nil { sources.insert(.dnsSD) }
            let status = p.link?.replicator.status
            return info(
                nodeID: p.nodeID, name: p.name, addresses: p.addresses, port: p.port, sources: sources, lastSeen: p.lastSeen,
                link: p.link, status: status, inbound: inbound[p.nodeID] ?? [])
        }
        let listed = Set(known.map(\.nodeID))
        for (id, sessions) in inbound where !listed.contains(id) {
            list.append(info(
                nodeID: id, name: nil, addresses: [], port: nil, sources: [.inbound], lastSeen: nil, link: nil, status: nil,
                inbound: sessions))
        }
        // An inbound-only peer whose session ended stays listed, offline, while it is trusted.
        for (id, e) in ended where !listed.contains(id) && inbound[id] == nil && trust.isTrusted(id) {
            list.append(info(
                nodeID: id, name: nil, addresses: e.remoteAddress.map { [$0] } ?? [], port: nil, sources: [.inbound],
                lastSeen: e.connectedAt, link: nil, status: nil, inbound: []))
        }
        return list.sorted { $0.nodeID < $1.nodeID }
    }

    func info(
        nodeID: String, name: String?, addresses: [String], port: Int?, sources: Set<PeerSource>, lastSeen: Date?, link: ReplicationLink?,
        status: ReplicatorStatus?, inbound sessions: [ReplicationResponder.SessionStatus]
    ) -> PeerInfo {
        let outboundUp = status.map { [.idle, .busy].contains($0.activity) } ?? false
        let inbound = Self.inboundLink(sessions)
        // `connected` and `direction` count live sessions only (an ended one is added by the caller).
        let direction: Direction? =
            switch (outboundUp, inbound != nil) {
            case (true, true): .both
            case (true, false): .outbound
            case (false, true): .inbound
            case (false, false): nil
            }
        return PeerInfo(
            nodeID: nodeID, name: name ?? trust.entry(nodeID)?.name, addresses: addresses, port: port, sources: sources,
            trusted: trust.isTrusted(nodeID), dialled: link != nil, connected: direction != nil, direction: direction,
            lastSeen: lastSeen ?? sessions.map(\.connectedAt).max(), url: link?.url, status: status,
            summary: link?.replicator.summary, inbound: inbound)
    }

    /// One peer's inbound sessions as one status; nil when there is none.
    static func inboundLink(_ sessions: [ReplicationResponder.SessionStatus]) -> InboundLink? {
        guard let first = sessions.first else { return nil }
        var summary = ReplicationSummary()
        for s in sessions.map(\.summary) {
            summary.pushed += s.pushed
            summary.pulled += s.pulled
            summary.rejected += s.rejected
            summary.conflicts += s.conflicts
            summary.bytesSent += s.bytesSent
            summary.bytesReceived += s.bytesReceived
            summary.blobsSent += s.blobsSent
            summary.blobsReceived += s.blobsReceived
            summary.blobBytesSent += s.blobBytesSent
            summary.blobBytesReceived += s.blobBytesReceived
        }
        let busy = sessions.contains(where: \.busy)
        return InboundLink(
            status: ReplicatorStatus(activity: busy ? .busy : .idle, completed: 0, total: 0, error: nil), summary: summary,
            remoteAddresses: sessions.compactMap(\.remoteAddress), since: sessions.map(\.connectedAt).min() ?? first.connectedAt)
    }

    /// An ended inbound session as an offline link: its counters, and why it ended.
    static func endedLink(_ e: EndedInbound) -> InboundLink {
        InboundLink(
            status: ReplicatorStatus(
                activity: .offline, completed: 0, total: 0, error: e.error ?? .disconnected("the peer closed the connection")),
            summary: e.summary, remoteAddresses: e.remoteAddress.map { [$0] } ?? [], since: e.connectedAt)
    }

    /// Number of peers with a live connection either way.
    public var connectedCount: Int { peers.filter(\.connected).count }
}
