import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// Keeps one continuous push-and-pull replication alive to every trusted peer it knows,
/// discovered or static, and runs the node's persistent replications.
///
/// One-dialer rule: of two nodes that discover each other, the one with the lower node ID
/// (lowercase hex string order) dials; the other waits for it. Static peers are always
/// dialled (the operator asked for it). Untrusted discovered peers are listed, never dialled.
public final class PeerManager: Service, Sendable {
    /// A peer as the admin API lists it.
    public struct PeerInfo: Sendable {
        public var nodeID: String
        public var name: String?
        public var addresses: [String]
        public var port: Int?
        public var sources: Set<String>
        public var trusted: Bool
        public var dialled: Bool
        /// Whether a replication connection to or from the peer is up.
        public var connected: Bool
        public var lastSeen: Date?
        public var url: String?
        public var status: ReplicatorStatus?
        public var summary: ReplicationSummary?
    }

    struct PeerState {
        var nodeID: String
        var name: String?
        var instance: String?
        var addresses: [String] = []
        var port: Int?
        var staticURL: String?
        var discovered = false
        var lastSeen: Date?
        var link: ReplicationLink?
    }

    struct State {
        var peers: [String: PeerState] = [:]
        var instances: [String: String] = [:]  // DNS-SD instance → node ID
        var replications: [String: (spec: ReplicationSpec, source: String, link: ReplicationLink)] = [:]
        var stopping = false
    }

    let node: NodeContext
    let discovery: (any PeerDiscovery)?
    let state = Mutex(State())
    let logger: Logger

    init(node: NodeContext, discovery: (any PeerDiscovery)?, logger: Logger) {
        self.node = node
        self.discovery = discovery
        self.logger = logger
    }

    public func run() async throws {
        for peer in node.configuration.peers {
            state.withLock { s in
                var p = s.peers[peer.nodeID] ?? PeerState(nodeID: peer.nodeID)
                p.name = peer.name ?? p.name
                p.staticURL = peer.url
                s.peers[peer.nodeID] = p
            }
            reconcile(peer.nodeID)
        }
        for (spec, source) in node.replicationSpecs() { startReplication(spec, source: source) }
        // The discovery service stops after this one (reverse start order), so its event
        // stream must not be what ends this loop.
        if let discovery {
            for await event in discovery.events.cancelOnGracefulShutdown() { self.handle(event) }
        }
        try? await gracefulShutdown()
        await stopAll()
    }

    func handle(_ event: DiscoveryEvent) {
        switch event {
        case .appeared(let peer):
            guard peer.nodeID != node.identity.nodeID else { return }
            let isNew = state.withLock { s -> Bool in
                let isNew = s.peers[peer.nodeID]?.discovered != true
                var p = s.peers[peer.nodeID] ?? PeerState(nodeID: peer.nodeID)
                p.instance = peer.instance
                p.name = p.name ?? peer.instance
                p.addresses = peer.addresses
                p.port = peer.port
                p.discovered = true
                p.lastSeen = Date()
                s.peers[peer.nodeID] = p
                s.instances[peer.instance] = peer.nodeID
                return isNew
            }
            if isNew {
                logger.info(
                    "peer discovered",
                    metadata: ["peer": "\(peer.nodeID)", "instance": "\(peer.instance)", "addresses": "\(peer.addresses)", "trusted": "\(node.trust.isTrusted(peer.nodeID))"])
            }
            if node.configuration.trustMode == .tofu, !node.trust.isTrusted(peer.nodeID), !node.trust.hasTOFUEntry {
                do {
                    try node.trust.add(.init(nodeID: peer.nodeID, name: peer.instance, policy: .trusted, source: "tofu"))
                    logger.notice("trust on first use: pinned the first peer seen in this group", metadata: ["peer": "\(peer.nodeID)"])
                } catch {
                    logger.error("could not save the TOFU trust entry", metadata: ["error": "\(error)"])
                }
            }
            reconcile(peer.nodeID)
        case .disappeared(let instance):
            let id = state.withLock { s -> String? in
                guard let id = s.instances.removeValue(forKey: instance) else { return nil }
                s.peers[id]?.discovered = false
                return id
            }
            if let id {
                logger.info("peer went away", metadata: ["peer": "\(id)", "instance": "\(instance)"])
                // Its replicator keeps retrying with backoff: the peer may only be restarting.
            }
        case .unavailable, .available:
            break
        }
    }

    /// The URL to dial a peer at, or nil when this node should not dial it.
    func dialURL(_ p: PeerState) -> String? {
        guard node.trust.isTrusted(p.nodeID) else { return nil }
        if let url = p.staticURL { return url }
        guard p.discovered, let address = p.addresses.first, let port = p.port else { return nil }
        guard node.identity.nodeID < p.nodeID else { return nil }  // the lower ID dials
        let scheme = node.configuration.insecure ? "ws" : "wss"
        return "\(scheme)://\(address):\(port)/\(node.configuration.group)/sync"
    }

    /// Starts, restarts (new address) or stops the link to one peer to match what is known.
    func reconcile(_ id: String) {
        let (toStop, toStart): (ReplicationLink?, ReplicationLink?) = state.withLock { s in
            guard !s.stopping, var p = s.peers[id] else { return (nil, nil) }
            let url = dialURL(p)
            if let link = p.link, link.url == url { return (nil, nil) }
            let old = p.link
            p.link = url.map { makeLink(url: $0, peerID: id, spec: nil) }
            s.peers[id] = p
            return (old, p.link)
        }
        if let toStop {
            logger.info("peer link changed", metadata: ["peer": "\(id)", "old": "\(toStop.url)", "new": "\(toStart?.url ?? "none")"])
            toStop.stop()
        }
        toStart?.start()
    }

    /// Re-evaluates every peer (after the trust store changed).
    public func trustChanged() {
        let ids = state.withLock { Array($0.peers.keys) }
        for id in ids { reconcile(id) }
    }

    func makeLink(url: String, peerID: String, spec: ReplicationSpec?) -> ReplicationLink {
        var rc = ReplicatorConfiguration()
        rc.continuous = spec?.continuous ?? true
        rc.direction = spec?.direction ?? .pushAndPull
        rc.documentIDs = spec?.documentIDs.map { Set($0.compactMap { try? DocumentID($0) }) }
        rc.nodeID = node.identity.nodeID
        rc.remotePolicy = node.trust.policy(for: peerID) ?? .trusted
        rc.resolvers = node.configuration.resolvers
        rc.pullFilter = node.pullFilter
        rc.metrics = node.metrics.sync
        rc.maxAttemptWait = .seconds(30)
        let identity = node.identity, logger = self.logger
        let connector: Replicator.Connector = {
            var c = try WebSocketConnector(url: url, serverTrust: .pinned([peerID]), identity: identity)
            c.logger = logger
            return try await c.connector()
        }
        return ReplicationLink(
            url: url, peerID: peerID,
            replicator: Replicator(store: node.store, connector: connector, configuration: rc, logger: logger.with("peer", peerID)),
            clock: node.clock, logger: logger)
    }

    // MARK: persistent replications

    /// Starts a replication; `source` is "config" or "api".
    func startReplication(_ spec: ReplicationSpec, source: String) {
        let link = makeLink(url: spec.url, peerID: spec.peerID, spec: spec)
        let old = state.withLock { s -> ReplicationLink? in
            let old = s.replications[spec.id]?.link
            s.replications[spec.id] = (spec, source, link)
            return old
        }
        old?.stop()
        link.start()
    }

    /// Stops and forgets a replication; false if unknown.
    func stopReplication(_ id: String) -> Bool {
        guard let entry = state.withLock({ $0.replications.removeValue(forKey: id) }) else { return false }
        entry.link.stop()
        return true
    }

    public var replications: [(spec: ReplicationSpec, source: String, status: ReplicatorStatus, summary: ReplicationSummary)] {
        state.withLock { s in
            s.replications.values.sorted { $0.spec.id < $1.spec.id }.map {
                ($0.spec, $0.source, $0.link.replicator.status, $0.link.replicator.summary)
            }
        }
    }

    /// Every known peer, with trust and link status.
    public var peers: [PeerInfo] {
        let inbound = node.inboundPeers()
        return state.withLock { s in
            s.peers.values.sorted { $0.nodeID < $1.nodeID }.map { p in
                var sources: Set<String> = []
                if p.staticURL != nil { sources.insert("static") }
                if p.discovered || p.instance != nil { sources.insert("dns-sd") }
                let linkActive = p.link.map { [.idle, .busy].contains($0.replicator.status.activity) } ?? false
                return PeerInfo(
                    nodeID: p.nodeID, name: p.name ?? node.trust.entry(p.nodeID)?.name, addresses: p.addresses, port: p.port,
                    sources: sources, trusted: node.trust.isTrusted(p.nodeID), dialled: p.link != nil,
                    connected: linkActive || inbound.contains(p.nodeID),
                    lastSeen: p.lastSeen, url: p.link?.url, status: p.link?.replicator.status,
                    summary: p.link?.replicator.summary)
            }
        }
    }

    /// Number of peers with a live connection either way.
    public var connectedCount: Int { peers.filter(\.connected).count }

    func stopAll() async {
        let links = state.withLock { s -> [ReplicationLink] in
            s.stopping = true
            return s.peers.values.compactMap(\.link) + s.replications.values.map(\.link)
        }
        for link in links { link.stop() }
        for link in links { await link.wait() }
    }
}

/// One replicator kept running: restarted with backoff after it stops on an error
/// (a permanent error too: the peer may be reconfigured), until `stop()`.
final class ReplicationLink: Sendable {
    let url: String
    let peerID: String
    let replicator: Replicator
    let clock: any Clock<Duration>
    let logger: Logger
    private let task = Mutex<Task<Void, Never>?>(nil)
    private let stopped = Mutex(false)

    /// Wait after a replicator stops on an error before starting it again.
    static let restartWait: Duration = .seconds(30)

    init(url: String, peerID: String, replicator: Replicator, clock: any Clock<Duration>, logger: Logger) {
        self.url = url
        self.peerID = peerID
        self.replicator = replicator
        self.clock = clock
        self.logger = logger
    }

    func start() {
        let t = Task { [self] in
            while !stopped.withLock({ $0 }) {
                await replicator.run()
                if stopped.withLock({ $0 }) || !replicator.configuration.continuous && replicator.status.error == nil { break }
                logger.info("replication stopped; restarting later", metadata: ["peer": "\(peerID)", "error": "\(replicator.status.error.map { "\($0)" } ?? "none")"])
                do { try await clock.sleep(for: Self.restartWait) } catch { break }
            }
        }
        task.withLock { $0 = t }
    }

    func stop() {
        stopped.withLock { $0 = true }
        replicator.stop()
        task.withLock { $0 }?.cancel()
    }

    func wait() async { await task.withLock { $0 }?.value }
}

extension Logger {
    func with(_ key: String, _ value: String) -> Logger {
        var copy = self
        copy[metadataKey: key] = "\(value)"
        return copy
    }
}
