import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

// One file by design (hence its length): every way a peer becomes known ends in `reconcile` on one peer
// table. The one-dialer rule is `dials(_:)`, used by dialCandidates and deliverAddressRecord.

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

    func handle(_ event: DiscoveryEvent) {
        switch event {
        case .appeared(let peer):
            guard peer.nodeID != nodeID else { return }
            let isNew = state.withLock { s -> Bool in
                let isNew = s.peers[peer.nodeID]?.discovered != true
                var p = s.peers[peer.nodeID] ?? PeerState(nodeID: peer.nodeID)
                // Fresh evidence only when it says something new: a re-appearance, or another address or port.
                if isNew || p.addresses.first != peer.addresses.first || p.port != peer.port { p.discoveredLearned = s.learn() }
                p.instance = peer.instance
                p.name = p.name ?? peer.nodeName
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
                    metadata: [
                        "peer": "\(LogText.escape(peer.nodeID))", "instance": "\(LogText.escape(peer.instance))",
                        "addresses": "\(LogText.escape(peer.addresses.joined(separator: ",")))",
                        "trusted": "\(trust.isTrusted(peer.nodeID))",
                    ])
            }
            if configuration.trustMode == .tofu, !trust.isTrusted(peer.nodeID), !trust.hasTOFUEntry {
                do {
                    try trust.add(.init(nodeID: peer.nodeID, name: peer.nodeName, policy: .trusted, source: .tofu))
                    logger.notice(
                        "trust on first use: pinned the first peer seen in this group", metadata: ["peer": "\(LogText.escape(peer.nodeID))"])
                } catch {
                    logger.error("could not save the TOFU trust entry", metadata: ["error": "\(LogText.escape(describing: error))"])
                }
                trustChanged()
            }
            // Seen again (after a partition, say): dial now rather than at the end of a backoff wait.
            reconcile(peer.nodeID, redial: isNew)
        case .disappeared(let instance):
            let id = state.withLock { s -> String? in
                guard let id = s.instances.removeValue(forKey: instance) else { return nil }
                s.peers[id]?.discovered = false
                return id
            }
            if let id {
                logger.info("peer went away", metadata: ["peer": "\(LogText.escape(id))", "instance": "\(LogText.escape(instance))"])
                // Where DNS-SD saw it is now the last candidate (the peer may only be restarting,
                // there or elsewhere): its record or static URL, if any, is dialled first.
                reconcile(id)
            }
        case .unavailable(let reason):
            discoveryReport.withLock { $0 = .unavailable(reason: reason) }
        case .available:
            discoveryReport.withLock { $0 = .available }
        }
    }

    /// Every URL to dial a peer at, best first; empty when this node should not dial it.
    ///
    /// Static URL, where DNS-SD sees the peer, and its signed address record (or entry):
    /// the one learned last comes first, since it is the freshest evidence of where the peer
    /// listens. Two exceptions: a URL the peer's newer record replaced comes last (a cached
    /// DNS-SD answer must not override the record), and so does where DNS-SD saw a peer that
    /// went away. A dial that fails tries the next (`dialler`). Every candidate is dialled
    /// pinned to the peer's ID: a record names only where its own signer listens.
    func dialCandidates(_ p: PeerState) -> [String] {
        guard trust.isTrusted(p.nodeID) else { return [] }
        // A static peer is dialled whatever the IDs; otherwise the lower ID dials.
        guard p.staticURL != nil || dials(p.nodeID) else { return [] }
        var found: [(url: String, rank: (Int, UInt64))] = []
        func add(_ url: String?, _ learned: UInt64) {
            guard let url else { return }
            found.append((url, (p.superseded.contains(url) ? 0 : 1, learned)))
        }
        add(p.staticURL, p.staticLearned)
        add(p.memberURL, p.memberLearned)
        if let address = p.addresses.first, let port = p.port {
            let scheme = configuration.insecure ? "ws" : "wss"
            add("\(scheme)://\(address):\(port)/\(configuration.group)/sync", p.discovered ? p.discoveredLearned : 0)
        }
        var out: [String] = []
        for c in found.sorted(by: { $0.rank > $1.rank }) where !out.contains(c.url) { out.append(c.url) }
        return out
    }

    /// The candidates to dial peer `id` at now (read at each dial, so a link in its retry
    /// wait tries what was learned meanwhile).
    func dialCandidates(_ id: String) -> [String] {
        guard let p = state.withLock({ $0.peers[id] }) else { return [] }
        return dialCandidates(p)
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

    /// Dials `url` over TLS, accepting only `peerID`'s certificate. With `candidates`, each
    /// dial reads them anew and tries them in order until one connects (`url` when none).
    func dialler(url: String, peerID: String, candidates: (@Sendable () -> [String])? = nil) -> Replicator.Connector {
        let identity = self.identity, logger = self.logger
        return {
            let listed = candidates?() ?? []
            let urls = listed.isEmpty ? [url] : listed
            var failure: (any Error)?
            for (i, candidate) in urls.enumerated() {
                try Task.checkCancellation()
                do {
                    var c = try WebSocketConnector(url: candidate, serverTrust: .pinned([peerID]), identity: identity)
                    c.logger = logger
                    // A dial begun while the network was down must not outlive its healing by long.
                    c.connectTimeout = Self.dialTimeout
                    return try await c.connector()
                } catch {
                    failure = error
                    if i + 1 < urls.count {
                        logger.debug(
                            "dial failed; trying where else the peer may listen",
                            metadata: ["url": "\(LogText.escape(candidate))", "next": "\(LogText.escape(urls[i + 1]))"])
                    }
                }
            }
            throw failure ?? CancellationError()
        }
    }

    func makeLink(
        url: String, peerID: String, spec: ReplicationSpec?, resetCheckpoint: Bool = false, candidates: (@Sendable () -> [String])? = nil
    ) -> ReplicationLink {
        let policy = trust.policy(for: peerID)
        let connector = dialler(url: url, peerID: peerID, candidates: candidates)
        let replicator = replicators.replicator(peerID: peerID, connector: connector, logger: logger.with("peer", peerID)) { rc in
            rc.continuous = spec?.continuous ?? true
            rc.direction = spec?.direction ?? .pushAndPull
            rc.documentIDs = spec?.documentIDs.map { Set($0.compactMap { try? DocumentID($0) }) }
            // The replication's own policy, else the peer's, else the node's.
            if let policy = spec?.blobPolicy ?? self.configuration.blobPolicyByPeer[peerID] { rc.blobPolicy = policy }
            // A dead link must be back within seconds of the network healing; a failed dial
            // every 1.5 s (at most) to a peer that is gone costs nothing measurable.
            rc.maxAttemptWait = Self.maxRedialWait
            rc.resetCheckpoint = resetCheckpoint
        }
        return ReplicationLink(
            url: url, peerID: peerID, policy: policy, ownAccess: replicators.ownAccessStamp, replicator: replicator, clock: clock, logger: logger)
    }

    /// The longest wait between dials of a peer whose link is down.
    static let maxRedialWait: Duration = .milliseconds(1500)
    /// How long one dial (TCP, TLS, WebSocket upgrade) may take.
    static let dialTimeout: TimeAmount = .seconds(3)

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

    // MARK: persistent replications

    /// Starts a replication; `source` is `.config` or `.api`.
    func startReplication(_ spec: ReplicationSpec, source: PeerSource, resetCheckpoint: Bool = false) {
        let link =
            spec.peerID.map { makeLink(url: spec.url, peerID: $0, spec: spec, resetCheckpoint: resetCheckpoint) }
            ?? makeCouchLink(spec, resetCheckpoint: resetCheckpoint)
        let old = state.withLock { s -> ReplicationLink? in
            let old = s.replications[spec.id]?.link
            s.replications[spec.id] = (spec, source, link)
            s.paused.remove(spec.id)
            return old
        }
        old?.stop()
        link.start()
    }

    /// Stops a replication until it is resumed (not across a restart of the node); false if unknown.
    func pauseReplication(_ id: String) -> Bool {
        guard let link = state.withLock({ s -> ReplicationLink? in
            guard let entry = s.replications[id] else { return nil }
            s.paused.insert(id)
            return entry.link
        }) else { return false }
        link.stop()
        return true
    }

    /// Runs a (paused or running) replication again, from its checkpoint or, with
    /// `resetCheckpoint`, from the beginning; false if unknown.
    func resumeReplication(_ id: String, resetCheckpoint: Bool) -> Bool {
        guard let entry = state.withLock({ $0.replications[id] }) else { return false }
        startReplication(entry.spec, source: entry.source, resetCheckpoint: resetCheckpoint)
        return true
    }

    func isPaused(_ id: String) -> Bool { state.withLock { $0.paused.contains(id) } }

    /// Stops and forgets a replication; false if unknown.
    func stopReplication(_ id: String) -> Bool {
        guard let entry = state.withLock({ $0.replications.removeValue(forKey: id) }) else { return false }
        entry.link.stop()
        return true
    }

    /// Every replicator this node runs now: to peers and persistent replications.
    var activeReplicators: [Replicator] {
        state.withLock { s in
            s.peers.values.compactMap { $0.link?.replicator } + s.replications.values.map { $0.link.replicator }
        }
    }

    public var replications: [(spec: ReplicationSpec, source: PeerSource, status: ReplicatorStatus, summary: ReplicationSummary)] {
        state.withLock { s in
            s.replications.values.sorted { $0.spec.id < $1.spec.id }.map {
                ($0.spec, $0.source, $0.link.replicator.status, $0.link.replicator.summary)
            }
        }
    }

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

extension PeerManager {
    /// Takes the dial URLs of the group's active members (from their signed address records,
    /// else their entries). Every member is listed (offline while not connected), whichever
    /// dials; of two members only the lower node ID dials (as for discovered peers), so each
    /// pair has one link, while a static peer is dialled anyway. A member's URL that changed
    /// is the freshest evidence of where it listens: dialled before a static URL or an older
    /// DNS-SD answer, and the URL it replaced is tried last from then on (`dialCandidates`).
    /// With no avahi-daemon (or discovery off) members are thus still dialled. Members that
    /// left lose the URL, and are no longer listed unless known otherwise (static, DNS-SD).
    public func memberAddressesChanged(_ urls: [String: String]) {
        let (touched, gone) = state.withLock { s -> ([String], [ReplicationLink]) in
            var touched: [String] = []
            var gone: [ReplicationLink] = []
            for (id, p) in s.peers where p.memberURL != nil && urls[id] == nil {
                if p.staticURL == nil && p.instance == nil {
                    s.peers[id] = nil
                    if let link = p.link { gone.append(link) }
                } else {
                    s.peers[id]?.memberURL = nil
                    touched.append(id)
                }
            }
            for (id, url) in urls where id != nodeID {
                var p = s.peers[id] ?? PeerState(nodeID: id)
                guard p.memberURL != url else { continue }
                if let old = p.memberURL { p.superseded.insert(old) }
                p.superseded.remove(url)
                p.memberURL = url
                p.memberLearned = s.learn()
                s.peers[id] = p
                touched.append(id)
            }
            return (touched, gone)
        }
        for link in gone { link.stop() }
        for id in touched { reconcile(id) }
    }
}

/// An inbound session that ended, as the responder reports it to the peer manager.
struct InboundEnding: Sendable {
    let session: ReplicationResponder.SessionStatus
    let error: SyncError?
}

extension PeerManager {
    /// Pushes this node's new address record (`document`) to each member that would not
    /// learn it otherwise: those with a lower node ID, which dial this node (at the address
    /// they knew, now stale) rather than being dialled. Each push is one-shot, retried with
    /// backoff for a few minutes; a member offline all that time gets the record from any
    /// other member later, as it gets every document.
    public func deliverAddressRecord(_ document: DocumentID, to urls: [String: String]) {
        for (peerID, url) in urls where !dials(peerID) && peerID != nodeID {
            let connector = dialler(url: url, peerID: peerID)
            let replicator = replicators.replicator(peerID: peerID, connector: connector, logger: logger.with("peer", peerID)) { rc in
                rc.continuous = false
                rc.direction = .push
                rc.documentIDs = [document]
                rc.maxAttempts = 20
                rc.maxAttemptWait = .seconds(15)
            }
            let started = state.withLock { !$0.stopping }
            guard started else { return }
            recordDeliveries.withLock { $0.append(replicator) }
            replicator.start()
            logger.info("telling a member where this node listens now", metadata: ["peer": "\(peerID)", "url": "\(url)"])
        }
    }
}
