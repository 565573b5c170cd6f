import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import FerryDiscovery
import Foundation
import Logging
import ServiceLifecycle

/// The headless peer: a ServiceGroup of the TLS WebSocket listener, DNS-SD discovery,
/// the peer manager (one replication per trusted peer, plus persistent replications),
/// the loopback admin API and, optionally, a Unix-socket listener, with graceful shutdown
/// on SIGTERM/SIGINT.
public final class FerryNode: Sendable {
    /// A peer to replicate with: its listener URL and pinned node ID.
    public struct Peer: Sendable, Equatable {
        public let url: String
        public let nodeID: String

        /// Parses `wss://host:port/db/sync#<node ID>`.
        public init(parsing text: String) throws(NodeError) {
            guard let hash = text.lastIndex(of: "#") else {
                throw .badConfiguration("peer \"\(text)\" lacks its pinned node ID: use URL#NODEID")
            }
            guard let id = NodeIDFormat.normalized(text[text.index(after: hash)...]) else {
                throw .badConfiguration("peer \"\(text)\": the node ID after # must be 64 hex digits (see `ferry id`)")
            }
            url = String(text[..<hash])
            nodeID = id
        }
    }

    /// What the node is bound to once it is ready.
    public struct Ready: Sendable {
        public let nodeID: String
        public let port: Int
        public let adminPort: Int
        public let url: String
        public let adminURL: String
        /// Whether discovery works, as its first attempt found; nil when it is off.
        /// `unavailable` while it has not answered within `discoveryAnswerLimit`.
        public var discovery: DiscoveryAvailability?
        /// The CouchDB API's loopback port and base URL (`http://127.0.0.1:PORT/`).
        public var couchPort = 0
        public var couchURL = ""
        /// The CouchDB API's LAN listener (`https://HOST:PORT/`), when configured.
        public var couchLANURL: String?
    }

    /// How long readiness waits for discovery's first attempt to start.
    static let discoveryAnswerLimit: Duration = .seconds(2)

    public let configuration: NodeConfiguration
    public let dataDirectory: String
    public let store: DocumentStore
    public let identity: NodeIdentity
    public let trust: TrustStore
    /// The CouchDB API's users, changeable while the node runs.
    public let couchUsers: CouchUserStore
    /// The node's group: signed member entries, invitations and the join exchange.
    public let membership: GroupMembership
    /// The group's access rules and roles: what each member and CouchDB user may read and write.
    public let access: GroupAccess
    /// The secret every admin API request carries (DATA/admin.key).
    public let adminKey: AdminKey
    /// The web dashboard's sessions and one-time login links (in memory).
    public let dashboardSessions = DashboardSessions()
    public let metrics: NodeMetrics
    /// How late the scheduler wakes a task (blocking calls on the cooperative pool show here).
    public let schedulerLag: SchedulerLagProbe
    /// One link at a time catches this node up (docs/protocol.md, "Join catch-up").
    let catchUpGate = CatchUpGate(logger: Logger(label: "ferry.sync.catchup"))
    let replicationRegistry: ReplicationRegistry
    let logger: Logger
    let lock: DataDirectoryLock
    let clock: any Clock<Duration>
    /// Who is linked to whom and who sent what: one per node, shared by all its links.
    let mesh: MeshRelay
    /// This node's content digest and the digests its peers last reported (anti-entropy, status).
    public let digests: MeshDigests
    /// The replicators of the running node, for reads that fetch deferred blobs.
    let liveReplicators = LiveReplicators()
    /// The listener's port once bound: where members are told this node listens.
    let listenerPort = Latch<Int>()
    private let stopState = Locked<StopState>(StopState())

    /// Whether `stop` was called, and the running group it stops.
    struct StopState {
        var stopped = false
        var group: ServiceGroup?
    }

    /// Opens the data directory (lock, store, identity, trust store, persisted replications).
    /// Fails at once if another node holds the directory, or anything stored is bad.
    public init(
        configuration: NodeConfiguration, dataDirectory: String, clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger = Logger(label: "ferry.node")
    ) throws {
        if !NodeConfiguration.isLoopback(configuration.adminInterface) {
            throw NodeError.badConfiguration("the admin API serves on loopback only, not \(configuration.adminInterface)")
        }
        self.configuration = configuration
        self.dataDirectory = dataDirectory
        self.logger = logger
        self.clock = clock
        mesh = MeshRelay(clock: clock)
        let metrics = NodeMetrics()
        self.metrics = metrics
        schedulerLag = SchedulerLagProbe(clock: clock, histogram: metrics.schedulerLag, logger: logger)
        do {
            try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        } catch {
            throw NodeError.startFailed("cannot create the data directory \(dataDirectory): \(error.localizedDescription)")
        }
        lock = try DataDirectoryLock(directory: dataDirectory)
        // After the lock: a restore still running holds it, so this marker means one that died.
        try DataDirectoryBackup.refuseUnusable(dataDirectory)
        var storeOptions = StoreOptions()
        storeOptions.maxBodyBytes = configuration.limits.maxDocumentBytes
        // Membership entries are checked first: only signed entries of this node's group go in.
        let ledger = try MembershipLedger(dataDirectory: dataDirectory)
        identity = try NodeIdentity.loadOrCreate(directory: dataDirectory, name: configuration.name)
        let access = GroupAccess(ledger: ledger, nodeID: identity.nodeID)
        self.access = access
        let rule = configuration.validation
        storeOptions.validator = Validator { proposed in
            if let reason = ledger.validate(proposed) { return reason }
            if let reason = access.validateHolding(proposed) { return reason }
            return rule?.violation(id: proposed.id, deleted: proposed.deleted, body: proposed.body, size: proposed.body.canonicalBytes.count)
        }
        store = try DocumentStore.open(directory: dataDirectory, options: storeOptions)
        // Blobs a crash left complete are finished; partial ones too old to resume are removed.
        let tidied = store.blobs.tidyPartials(
            removingUnwrittenSince: Date().addingTimeInterval(-Double(configuration.blobCollection.partialMaxAgeSeconds)))
        if tidied.count > 0 {
            logger.info("removed old partial blobs", metadata: ["count": "\(tidied.count)", "bytes": "\(tidied.bytes)"])
        }
        digests = MeshDigests(store: store, clock: clock)
        adminKey = try AdminKey.loadOrCreate(dataDirectory: dataDirectory)
        trust = try TrustStore(dataDirectory: dataDirectory, configuration: configuration, access: access)
        couchUsers = try CouchUserStore(dataDirectory: dataDirectory, configuration: configuration)
        couchUsers.table.groupRestriction.withLock { $0 = { name, policy in access.restrict(policy, principal: "user:" + name) } }
        replicationRegistry = try ReplicationRegistry(dataDirectory: dataDirectory)
        let (interface, port) = (configuration.interface, listenerPort)
        membership = GroupMembership(
            ledger: ledger,
            context: .init(
                store: store, identity: identity, trust: trust, databaseName: configuration.group, name: configuration.name,
                insecure: configuration.insecure,
                listenAddresses: { port.value.map { GroupMembership.listenAddresses(interface: interface, port: $0) } ?? [] }),
            clock: clock, logger: logger)
        try membership.loadFromStore()
        try access.load(from: store)
        access.recompute()
    }

    var nodeFile: String { "\(dataDirectory)/node.json" }

    /// Builds this node's replicators and responders (trust policy, resolvers, pull filter, metrics).
    public var replicators: ReplicationFactory {
        var factory = ReplicationFactory(
            store: store, nodeID: identity.nodeID, trust: trust, configuration: configuration, metrics: metrics.sync, clock: clock,
            logger: logger)
        factory.catchUpGate = catchUpGate
        factory.access = access
        factory.mesh = mesh
        factory.digests = digests
        let fetcher = DeferredBlobFetcher(store: store, replicators: liveReplicators.list, logger: logger)
        factory.fetchDeferredBlob = { ref, excluding in try await fetcher.ensure(ref.digest, excluding: excluding) }
        return factory
    }

    func makeResponder(authenticated: Bool) -> ReplicationResponder { replicators.responder(authenticated: authenticated) }

    func makeListener(responder: ReplicationResponder) -> WebSocketListener {
        var config = WebSocketListener.Configuration()
        config.host = configuration.interface
        config.port = configuration.port
        config.databaseName = configuration.group
        config.insecure = configuration.insecure
        config.maxConnections = configuration.limits.maxConnections
        config.maxOpenConnections = DescriptorBudget.current.replicationTotal(configured: configuration.limits.maxOpenConnections)
        config.maxConnectionsPerAddress = configuration.limits.maxConnectionsPerAddress
        config.handshakeTimeout = .seconds(Int64(configuration.limits.handshakeTimeoutSeconds))
        config.maxMessageSize = configuration.limits.maxMessageBytes
        config.idleTimeout = .seconds(Int64(configuration.limits.idleTimeoutSeconds))
        config.boundPortLatch = listenerPort
        if let password = configuration.password {
            config.authentication = .password(user: password.user, password: password.password)
        } else if configuration.acceptAnyPeer {
            config.authentication = .mutualTLS(.acceptAnyPeer)
        } else {
            config.authentication = .mutualTLS(.dynamic(trust.ids))
            if !configuration.insecure {
                let membership = self.membership
                config.enrollment = .init(
                    isOpen: { membership.invitations.isOpen },
                    serve: { endpoint, peer, remote in await membership.serveJoin(endpoint, peer: peer, remote: remote) })
            }
        }
        return WebSocketListener(identity: identity, configuration: config, responder: responder, logger: logger)
    }

    /// The parts of a running node, each built after what it needs and given only that.
    struct Parts {
        let listener: WebSocketListener
        let manager: PeerManager
        let admin: AdminAPI
    }

    /// Builds responder, listener, peer manager and admin API, in that order, each from what
    /// exists before it: the manager follows the membership's and the responder's events.
    func makeParts(discovery: (any PeerDiscovery)?, readiness: ReadinessBox = ReadinessBox(), logger: Logger? = nil) -> Parts {
        let pinned = configuration.password == nil && !configuration.acceptAnyPeer
        // Peers whose inbound session ended stay listed (why, and when) by the peer manager.
        let (endedSessions, sessionEnded) = AsyncStream.makeStream(of: InboundEnding.self)
        let responder = replicators.responder(authenticated: pinned, sessionEnded: { sessionEnded.yield(InboundEnding(session: $0, error: $1)) })
        let listener = makeListener(responder: responder)
        let replications = configuration.replications.map { ($0, PeerSource.config) } + replicationRegistry.specs.map { ($0, PeerSource.api) }
        let manager = PeerManager(
            configuration: configuration, identity: identity, trust: trust, replicators: replicators, replications: replications,
            inboundSessions: { responder.sessions }, endedSessions: endedSessions, membershipEvents: membership.events(),
            live: liveReplicators, discovery: discovery, clock: clock, logger: logger ?? self.logger)
        return Parts(listener: listener, manager: manager, admin: AdminAPI(node: self, manager: manager, listener: listener, readiness: readiness))
    }

    /// Stops the node gracefully, as SIGTERM does: a running node shuts down, and a node not
    /// yet running returns from `run` at once without starting anything.
    public func stop() {
        let group = stopState.withLock { state -> ServiceGroup? in
            state.stopped = true
            return state.group
        }
        // Unowned: `stop` is synchronous; the trigger returns at once and the group's `run` carries the shutdown out.
        if let group { Task { await group.triggerGracefulShutdown() } }
    }

    /// Runs until `stop`, SIGTERM/SIGINT when `handlesSignals` (or cancellation); `onReady`
    /// runs once both listeners are bound.
    public func run(
        discovery customDiscovery: (any PeerDiscovery)? = nil, handlesSignals: Bool = true,
        onReady: @escaping @Sendable (Ready) -> Void = { _ in }
    ) async throws {
        // Before any listener is sized from it (docs/operations.md, "Connection limits").
        DescriptorBudget.raiseSoftLimit(logger: logger)
        let readiness = ReadinessBox()
        let discovery: (any PeerDiscovery)?
        if let customDiscovery {
            discovery = customDiscovery
        } else if configuration.discovery {
            var dc = DNSSDDiscovery.Configuration(advertisement: nil, group: configuration.group)
            dc.retryInterval = .seconds(configuration.discoveryRetrySeconds)
            discovery = DNSSDDiscovery(configuration: dc, clock: clock, logger: logger)
        } else {
            discovery = nil
        }
        let parts = makeParts(discovery: discovery, readiness: readiness)
        let (listener, manager, admin) = (parts.listener, parts.manager, parts.admin)
        var services: [any Service] = [StartupGuard(role: .listener(configuration.interface, configuration.port), service: listener)]
        if let discovery { services.append(DeferredAdvertisement(discovery: discovery, listener: listener, node: self)) }
        services.append(manager)
        services.append(
            DataDirectoryWatch(
                directory: dataDirectory, database: (dataDirectory as NSString).appendingPathComponent(DocumentStore.databaseFileName),
                clock: clock, logger: logger))
        services.append(MembershipFollower(membership: membership, store: store))
        let couchTable = couchUsers.table
        services.append(
            AccessFollower(
                access: access, store: store,
                policiesChanged: {
                    manager.trustChanged()
                    // Live Couchbase Lite replications judge by their users' new policies.
                    couchTable.policiesChanged()
                    // Inbound sessions stated their half of each link under the old rules
                    // (relay suppression compares versions): their peers connect again.
                    listener.closeForReconnect("the group's access rules changed")
                }, logger: logger))
        services.append(makeIndexBuilder())
        if let collector = makeBlobCollector() { services.append(collector) }
        services.append(schedulerLag)
        services.append(
            StartupGuard(role: .admin(configuration.adminInterface, configuration.adminPort), service: admin.application()))
        services.append(contentsOf: try makeCouchServices(readiness: readiness))
        if let path = configuration.unixSocket {
            services.append(
                StartupGuard(role: .unixSocket(path), service: UnixSocketService(path: path, responder: makeResponder(authenticated: false), readiness: readiness)))
        }
        services.append(ReadinessService(node: self, listener: listener, readiness: readiness, discovery: discovery, onReady: onReady))
        // Every fixed port at once, before anything starts: one message names every clash.
        try PortPreflight.check(services.compactMap { ($0 as? any BindingService)?.tcpAddress })
        // A service that fails (one that cannot bind, say) stops the others gracefully: they
        // end cleanly and quickly, and `run` throws that service's error.
        var groupConfiguration = ServiceGroupConfiguration(
            services: services.map { .init(service: $0, failureTerminationBehavior: .gracefullyShutdownGroup) },
            gracefulShutdownSignals: handlesSignals ? [.sigterm, .sigint] : [], logger: logger)
        // A graceful shutdown that stalls (a peer that never answers) becomes cancellation.
        groupConfiguration.maximumGracefulShutdownDuration = Self.maximumGracefulShutdown
        let group = ServiceGroup(configuration: groupConfiguration)
        let stopped = stopState.withLock { state -> Bool in
            if !state.stopped { state.group = group }
            return state.stopped
        }
        if stopped { return }
        do {
            try await group.run()
        } catch is CancellationError where stopState.withLock({ $0.stopped }) {
            // Asked to stop, it stopped: what was still in flight after the grace period was cancelled.
            logger.warning(
                "the graceful stop took longer than \(Self.maximumGracefulShutdown); what was still in flight was cancelled")
        }
    }

    /// How long in-flight work may take to finish on SIGTERM before it is cancelled.
    public static let maximumGracefulShutdown: Duration = .seconds(10)

    func writeNodeFile(_ ready: Ready) throws {
        var info: [String: JSON] = [
            "id": .string(identity.nodeID), "pid": .int(Int64(getpid())), "port": .int(Int64(ready.port)),
            "url": .string(ready.url), "adminURL": .string(ready.adminURL), "adminPort": .int(Int64(ready.adminPort)),
            "database": .string(store.uuid), "name": .string(configuration.name), "group": .string(configuration.group),
            "adminKeyFile": .string(AdminKey.path(dataDirectory: URL(fileURLWithPath: dataDirectory).standardizedFileURL.path)),
        ]
        if let unix = configuration.unixSocket { info["unix"] = .string(unix) }
        info["couchURL"] = .string(ready.couchURL)
        info["couchPort"] = .int(Int64(ready.couchPort))
        if let lan = ready.couchLANURL { info["couchLANURL"] = .string(lan) }
        try writeAtomically(.object(info), to: nodeFile)
    }

    func removeNodeFile() { try? FileManager.default.removeItem(atPath: nodeFile) }

    func readyInfo(port: Int, adminPort: Int) -> Ready {
        let host = configuration.interface == "0.0.0.0" || configuration.interface == "::" ? "127.0.0.1" : configuration.interface
        let scheme = configuration.insecure ? "ws" : "wss"
        return Ready(
            nodeID: identity.nodeID, port: port, adminPort: adminPort,
            url: "\(scheme)://\(host):\(port)/\(configuration.group)/sync",
            adminURL: "http://127.0.0.1:\(adminPort)")
    }
}

/// Advertises this node once the listener's port is known (it may be ephemeral), then runs discovery.
struct DeferredAdvertisement: Service {
    let discovery: any PeerDiscovery
    let listener: WebSocketListener
    let node: FerryNode

    func run() async throws {
        let port = try await listener.waitUntilBound()
        let id = node.identity.nodeID
        discovery.advertise(Advertisement(
            instanceName: DiscoveredPeer.instanceName(nodeName: node.configuration.name, nodeID: id), nodeID: id, group: node.configuration.group,
            protocolVersion: SyncProtocol.versions.max() ?? 1, port: port))
        try await discovery.run()
    }
}
