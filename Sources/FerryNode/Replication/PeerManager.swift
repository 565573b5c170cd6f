import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

// Every way a peer becomes known ends in `reconcile` on one peer table (here); the ways
// are in extensions beside it: DNS-SD (+Discovery), where to dial (+Dialling), members'
// address records (+Addresses), persistent replications (+Replications), and what
// `/peers` lists (+Listing). The one-dialer rule is `dials(_:)`, used by dialCandidates and
// deliverAddressRecord.

/// Keeps one continuous push-and-pull replication alive to every trusted peer it knows,
/// discovered or static, and runs the node's persistent replications.
///
/// One-dialer rule: of two nodes that discover each other, the one with the lower node ID
/// (lowercase hex string order) dials; the other waits for it. Static peers are always
/// dialled (the operator asked for it). Untrusted discovered peers are listed, never dialled.
/// Where to dial: every URL known for the peer (static, DNS-SD, its signed address record)
/// is a candidate, the most recently learned first, and one that fails falls back to the
/// others; a URL the peer's newer record replaced comes last (`dialCandidates`).
/// Trust changes apply at once (`trustChanged()`), and peers that dialled this node are
/// listed too, from the responder's live sessions.
public final class PeerManager: Service, Sendable {
    /// A peer as the admin API lists it.
    public struct PeerInfo: Sendable {
        public var nodeID: String
        public var name: String?
        public var addresses: [String]
        public var port: Int?
        public var sources: Set<PeerSource>
        public var trusted: Bool
        public var dialled: Bool
        /// Whether a replication connection to or from the peer is up.
        public var connected: Bool
        /// Which way the live connections go; nil when none is up.
        public var direction: Direction?
        public var lastSeen: Date?
        public var url: String?
        /// The replication this node dialled, if any.
        public var status: ReplicatorStatus?
        public var summary: ReplicationSummary?
        /// The peer's connections to this node, combined; nil when there is none.
        public var inbound: InboundLink?
    }

    /// Which way a peer's live connections go.
    public enum Direction: String, Sendable {
        /// This node dialled the peer.
        case outbound
        /// The peer dialled this node.
        case inbound
        /// Both at once (each side has the other as a static peer, for example).
        case both
    }

    /// A peer's connections to this node's listener, as one status (several only while one replaces another).
    public struct InboundLink: Sendable {
        /// `.busy` while a request that moves documents is answered, else `.idle`.
        public var status: ReplicatorStatus
        /// From this node's side: `pushed` sent to the peer, `pulled` received and stored.
        public var summary: ReplicationSummary
        public var remoteAddresses: [String]
        public var since: Date
    }

    struct PeerState {
        var nodeID: String
        var name: String?
        var instance: String?
        var addresses: [String] = []
        var port: Int?
        var staticURL: String?
        /// Where the peer's signed member entry says it listens (a group member).
        var memberURL: String?
        var discovered = false
        var lastSeen: Date?
        var link: ReplicationLink?
        /// When each candidate URL was last learned (`State.learn()`: higher is later), so
        /// the freshest evidence of where the peer listens is dialled first.
        var staticLearned: UInt64 = 0
        var memberLearned: UInt64 = 0
        var discoveredLearned: UInt64 = 0
        /// URLs the peer's own newer address record replaced: a cached DNS-SD answer naming
        /// one again is tried last, never first.
        var superseded: Set<String> = []
        /// The candidates the link was last given, to tell when they changed.
        var candidates: [String] = []
    }

    struct State {
        var peers: [String: PeerState] = [:]
        var instances: [String: String] = [:]  // DNS-SD instance → node ID
        var replications: [String: (spec: ReplicationSpec, source: PeerSource, link: ReplicationLink)] = [:]
        /// Replications paused (their links stopped, their entries kept) until resumed or restarted.
        var paused: Set<String> = []
        var stopping = false
        /// The trust store as last seen, to tell which entries a change touched.
        var trustSeen: [String: PeerPolicy] = [:]
        /// Per peer, its last inbound session that ended: listed (offline, with why) until it is back.
        var endedInbound: [String: EndedInbound] = [:]
        /// Orders what is learned of peers' addresses (a counter, not a clock: only the order matters).
        var learned: UInt64 = 0

        /// The next learning stamp, above every one before.
        mutating func learn() -> UInt64 {
            learned += 1
            return learned
        }
    }

    /// A peer's inbound session that ended, as `/peers` shows it until the peer connects again.
    struct EndedInbound {
        var summary: ReplicationSummary
        var error: SyncError?
        var remoteAddress: String?
        var connectedAt: Date
    }

    /// Static peers, trust mode, scheme and group: read only.
    let configuration: NodeConfiguration
    /// This node's certificate, presented when dialling.
    let identity: NodeIdentity
    let trust: TrustStore
    let replicators: ReplicationFactory
    /// The persistent replications to start, with where each was declared.
    let initialReplications: [(ReplicationSpec, PeerSource)]
    /// The live sessions of peers that dialled this node.
    let inboundSessions: @Sendable () -> [ReplicationResponder.SessionStatus]
    /// The responder's sessions as they end, and the group's changes: followed while running.
    let endedSessions: AsyncStream<InboundEnding>
    let membershipEvents: AsyncStream<MembershipEvent>
    let discovery: (any PeerDiscovery)?
    let clock: any Clock<Duration>
    let state = Locked(State())
    /// What discovery last reported (nil: nothing yet).
    let discoveryReport = Locked<DiscoveryAvailability?>(nil)
    /// One-shot pushes of this node's address record to members that do not dial it.
    let recordDeliveries = Locked<[Replicator]>([])
    let logger: Logger

    init(
        configuration: NodeConfiguration, identity: NodeIdentity, trust: TrustStore, replicators: ReplicationFactory,
        replications: [(ReplicationSpec, PeerSource)], inboundSessions: @escaping @Sendable () -> [ReplicationResponder.SessionStatus],
        endedSessions: AsyncStream<InboundEnding> = AsyncStream { $0.finish() },
        membershipEvents: AsyncStream<MembershipEvent> = AsyncStream { $0.finish() }, live: LiveReplicators? = nil,
        discovery: (any PeerDiscovery)?, clock: any Clock<Duration>, logger: Logger
    ) {
        self.configuration = configuration
        self.identity = identity
        self.trust = trust
        self.replicators = replicators
        initialReplications = replications
        self.inboundSessions = inboundSessions
        self.endedSessions = endedSessions
        self.membershipEvents = membershipEvents
        self.discovery = discovery
        self.clock = clock
        self.logger = logger
        // Reads of deferred blobs fetch through the replicators this manager runs.
        live?.source { [weak self] in self?.activeReplicators ?? [] }
    }

    /// Discovery as `GET /peers` states it: `off` (the node runs none), `starting` (no report
    /// yet), `on`, or `unavailable` with the reason.
    var discoveryStatus: (state: String, reason: String?) {
        guard discovery != nil else { return ("off", nil) }
        switch discoveryReport.withLock({ $0 }) {
        case nil: return ("starting", nil)
        case .available: return ("on", nil)
        case .unavailable(let reason): return ("unavailable", reason)
        }
    }

    /// This node's ID, for the one-dialer rule.
    var nodeID: String { identity.nodeID }

    /// The one-dialer rule: of two nodes that know each other (by DNS-SD or as members),
    /// the one with the lower node ID dials; the other waits to be dialled. A static peer is
    /// dialled whatever the IDs (`dialCandidates`).
    func dials(_ peer: String) -> Bool { nodeID < peer }

    public func run() async throws {
        let trusted = currentTrust()
        state.withLock { $0.trustSeen = trusted }
        addStaticPeers()
        for (spec, source) in initialReplications { startReplication(spec, source: source) }
        await withTaskGroup(of: Void.self) { followers in
            followers.addTask { for await change in self.membershipEvents { self.handle(change) } }
            followers.addTask { for await ending in self.endedSessions { self.inboundEnded(ending.session, error: ending.error) } }
            // The discovery service stops after this one (reverse start order), so its event
            // stream must not be what ends this loop.
            if let discovery {
                for await event in discovery.events.cancelOnGracefulShutdown() { self.handle(event) }
            }
            try? await gracefulShutdown()
            followers.cancelAll()
        }
        await stopAll()
    }

    /// Takes the configured static peers (first of all, so anything learned later is fresher).
    func addStaticPeers() {
        for peer in configuration.peers {
            state.withLock { s in
                var p = s.peers[peer.nodeID] ?? PeerState(nodeID: peer.nodeID)
                p.name = peer.name ?? p.name
                p.staticURL = peer.url
                p.staticLearned = s.learn()
                s.peers[peer.nodeID] = p
            }
            reconcile(peer.nodeID)
        }
    }

    func handle(_ change: MembershipEvent) {
        switch change {
        case .membersChanged(let urls):
            memberAddressesChanged(urls)
            trustChanged()
        case .addressAnnounced(let document, let urls):
            deliverAddressRecord(document, to: urls)
        }
    }

    /// Starts, restarts (new address or policy) or stops the link to one peer to match what
    /// is known. With `redial`, a link kept as it is ends any wait and dials at once.
    func reconcile(_ id: String, redial: Bool = false) {
        let policy = trust.policy(for: id)
        let (toStop, toStart, kept, moreToTry): (ReplicationLink?, ReplicationLink?, ReplicationLink?, Bool) = state.withLock { s in
            guard !s.stopping, var p = s.peers[id] else { return (nil, nil, nil, false) }
            let candidates = dialCandidates(p)
            let url = candidates.first
            let moreToTry = candidates != p.candidates
            p.candidates = candidates
            s.peers[id] = p
            if let link = p.link, link.url == url, link.policy == policy, link.ownAccess == replicators.ownAccessStamp {
                return (nil, nil, link, moreToTry)
            }
            let old = p.link
            p.link = url.map { makeLink(url: $0, peerID: id, spec: nil, candidates: { [weak self] in self?.dialCandidates(id) ?? [] }) }
            s.peers[id] = p
            return (old, p.link, nil, false)
        }
        if let toStop {
            logger.info(
                "peer link changed",
                metadata: ["peer": "\(LogText.escape(id))", "old": "\(LogText.escape(toStop.url))", "new": "\(LogText.escape(toStart?.url ?? "none"))"])
            toStop.stop()
        }
        toStart?.start()
        // Same first choice but other fallbacks: a link waiting to retry tries them now.
        if let kept, redial || moreToTry { kept.redial() }
    }

    /// Re-evaluates every peer after the trust store changed: a newly trusted peer is dialled
    /// at once (when this node is the one to dial), a link whose peer's entry changed starts
    /// again with the new policy or, unchanged, ends its retry wait and dials now, and a
    /// peer no longer trusted loses its link.
    public func trustChanged() {
        let now = currentTrust()
        let (ids, changed, replications) = state.withLock { s -> ([String], Set<String>, [ReplicationLink]) in
            var changed = Set<String>()
            for (id, policy) in now where s.trustSeen[id] != policy { changed.insert(id) }
            for id in s.trustSeen.keys where now[id] == nil { changed.insert(id) }
            s.trustSeen = now
            return (Array(s.peers.keys), changed, s.replications.values.filter { $0.spec.peerID.map(changed.contains) ?? false }.map(\.link))
        }
        for id in ids { reconcile(id, redial: changed.contains(id)) }
        for link in replications { link.redial() }
    }

    func currentTrust() -> [String: PeerPolicy] {
        Dictionary(trust.entries.map { ($0.nodeID, trust.policy(for: $0.nodeID) ?? $0.policy) }, uniquingKeysWith: { a, _ in a })
    }

    /// Records a peer's inbound session that died (went silent, or failed), so that `/peers`
    /// keeps listing the peer (not connected, with why) until it connects again. A peer that
    /// closed its connection itself has left: it is no longer listed. Only proven IDs count.
    func inboundEnded(_ session: ReplicationResponder.SessionStatus, error: SyncError?) {
        guard session.authenticated, let id = session.peerID else { return }
        let died = error.map { $0.kind != .disconnected } ?? false
        state.withLock {
            $0.endedInbound[id] =
                died
                ? EndedInbound(summary: session.summary, error: error, remoteAddress: session.remoteAddress, connectedAt: session.connectedAt)
                : nil
        }
    }

    func stopAll() async {
        let links = state.withLock { s -> [ReplicationLink] in
            s.stopping = true
            return s.peers.values.compactMap(\.link) + s.replications.values.map(\.link)
        }
        for link in links { link.stop() }
        let deliveries = recordDeliveries.withLock { d in defer { d = [] }; return d }
        for replicator in deliveries { replicator.stop() }
        for link in links { await link.wait() }
        for replicator in deliveries { await replicator.waitUntilStopped() }
    }
}

/// An inbound session that ended, as the responder reports it to the peer manager.
struct InboundEnding: Sendable {
    let session: ReplicationResponder.SessionStatus
    let error: SyncError?
}
