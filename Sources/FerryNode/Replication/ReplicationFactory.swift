import FerryCore
import FerryStore
import FerrySync
import Logging

/// Builds every replicator and responder a node runs, so each way in or out (peer links,
/// persistent replications, the Unix socket, `ferry sync`, `ferry serve --stdio`) applies
/// the same trust policy, resolvers, pull filter, read-only switch and metrics.
public struct ReplicationFactory: Sendable {
    public var store: DocumentStore
    /// The ID this side presents in hello.
    public var nodeID: String
    public var trust: TrustStore
    public var resolvers: ResolverSet
    public var pullFilter: RevisionFilter?
    public var readOnly: Bool
    public var metrics: SyncMetrics?
    public var clock: any Clock<Duration>
    public var logger: Logger
    /// The node's one catch-up lease, shared by every replicator and responder it builds; nil: none.
    public var catchUpGate: CatchUpGate?
    /// The group's access rules: when this node's own reading is narrowed by content, each
    /// pull first checks what it holds (nil: no group rules apply).
    public var access: GroupAccess?

    /// What this node's own roles let it read, as a stable text ("" without rules, or when
    /// they admit everything).
    public var ownAccessStamp: String {
        let rule = Self.ownRead(access)
        return rule.admitsEverything ? "" : rule.fingerprint
    }

    /// What this node's own roles let it hold now (`.all` without rules), with the group's
    /// signed entries every member holds: as its peers' policies for it say (so both ends of a
    /// link compute the same view of what both may read).
    static func ownRead(_ access: GroupAccess?) -> AccessRule {
        carryingMembership(PeerPolicy(read: AccessRule.all.restricted(by: access?.own?.read))).read
    }
    /// The node's one mesh view and relay ledger, given to every replicator and responder
    /// (heartbeats carry links; relays a peer gets elsewhere are skipped). nil: neither.
    public var mesh: MeshRelay?
    /// The node's digest and its peers' reported ones (heartbeats, status, anti-entropy); nil: none.
    public var digests: MeshDigests?
    /// Heartbeat interval and silence limit for every link.
    public var liveness = Liveness()
    /// When the blobs of incoming revisions are fetched, for every replicator and the responder.
    public var blobPolicy = BlobFetchPolicy.eager
    /// Per peer node ID, the policy that replaces `blobPolicy` for pushes from that peer.
    public var blobPolicyByPeer: [String: BlobFetchPolicy] = [:]
    /// Fetches a blob deferred here from another peer when a peer asks for it (the
    /// responders' `fetchDeferredBlob`); nil: such a request is answered `not_found`.
    public var fetchDeferredBlob: (@Sendable (BlobReference, _ excluding: String?) async throws -> Bool)?

    /// Takes resolvers, pull filter and read-only from `configuration`.
    public init(
        store: DocumentStore, nodeID: String, trust: TrustStore, configuration: NodeConfiguration, metrics: SyncMetrics? = nil,
        clock: any Clock<Duration> = ContinuousClock(), logger: Logger
    ) {
        self.store = store
        self.nodeID = nodeID
        self.trust = trust
        resolvers = configuration.resolvers
        pullFilter = configuration.pullFilter?.filter(name: "config-pull")
        readOnly = configuration.readOnly
        blobPolicy = configuration.blobPolicy
        blobPolicyByPeer = configuration.blobPolicyByPeer
        self.metrics = metrics
        self.clock = clock
        self.logger = logger
    }

    /// Nothing readable or writable: the policy of a peer that is no longer trusted.
    static let denyAll = PeerPolicy(read: .none, write: .none, mayDelete: false)

    /// A trusted peer's policy widened to read and write group membership entries
    /// (`_ferry/members/`): they carry their own authority (an admin's signature, checked by
    /// the store's validation on the way in), so a peer restricted to other documents still
    /// relays them. Deletions of them are refused by that validation.
    static func carryingMembership(_ policy: PeerPolicy) -> PeerPolicy {
        var p = policy
        func carry(_ rule: inout AccessRule) {
            if !rule.ownCriteriaEmpty { rule.idPrefixes += ReservedNamespace.replicatedPrefixes }
            rule.grant = rule.grant?.admitting(prefixes: ReservedNamespace.replicatedPrefixes)
        }
        carry(&p.read)
        carry(&p.write)
        return p
    }

    /// The pull filter, letting membership entries through (they are validated instead).
    static func carryingMembership(_ filter: RevisionFilter) -> RevisionFilter {
        RevisionFilter(name: filter.name) { input in
            ReservedNamespace.replicatedPrefixes.contains(where: { input.id.rawValue.hasPrefix($0) }) || filter.admits(input)
        }
    }

    /// A responder for incoming sessions. `authenticated` says whether the transport proves
    /// peer IDs (mutual TLS): then a peer missing from the trust store (trust revoked while it
    /// was connected) gets nothing. Password, acceptAnyPeer, Unix-socket and stdio clients
    /// (authenticated by the transport's own means) get the full policy.
    public func responder(
        authenticated: Bool, sessionEnded: (@Sendable (ReplicationResponder.SessionStatus, SyncError?) -> Void)? = nil
    ) -> ReplicationResponder {
        var r = ReplicationResponder.Options()
        r.mesh = mesh
        r.digests = digests
        r.liveness = liveness
        r.blobPolicy = blobPolicy
        let byPeer = blobPolicyByPeer
        if !byPeer.isEmpty { r.blobPolicyLookup = { byPeer[$0] } }
        r.sessionEnded = sessionEnded
        r.fetchDeferredBlob = fetchDeferredBlob
        r.nodeID = nodeID
        let access = self.access
        r.ownRead = { Self.ownRead(access) }
        r.readOnly = readOnly
        let trust = self.trust
        r.policyLookup = { trust.policy(for: $0).map(Self.carryingMembership) }
        r.defaultPolicy = authenticated ? Self.denyAll : .trusted
        r.resolvers = resolvers
        r.incomingFilter = pullFilter.map(Self.carryingMembership)
        r.metrics = metrics
        r.catchUpGate = catchUpGate
        return ReplicationResponder(store: store, options: r, clock: clock, logger: logger)
    }

    /// A replicator with `peerID` (its trust-store policy bounds what it may write here;
    /// a peer not in the store, or nil, gets the full policy), then `configure` for the rest.
    public func replicator(
        peerID: String?, connector: @escaping Replicator.Connector, logger: Logger? = nil,
        configure: (inout ReplicatorConfiguration) -> Void = { _ in }
    ) -> Replicator {
        var rc = ReplicatorConfiguration()
        rc.wiring.nodeID = nodeID
        rc.remotePolicy = Self.carryingMembership(peerID.flatMap(trust.policy(for:)) ?? .trusted)
        rc.resolvers = resolvers
        rc.pullFilter = pullFilter.map(Self.carryingMembership)
        rc.wiring.metrics = metrics
        rc.wiring.catchUpGate = catchUpGate
        rc.wiring.mesh = mesh
        rc.wiring.digests = digests
        rc.wiring.liveness = liveness
        rc.blobPolicy = blobPolicy
        rc.checksHeldAccess = access?.own?.read.needsBodies ?? false
        rc.ownReadFingerprint = ownAccessStamp.isEmpty ? nil : ownAccessStamp
        let access = self.access
        rc.ownRead = { Self.ownRead(access) }
        configure(&rc)
        return Replicator(store: store, connector: connector, configuration: rc, clock: clock, logger: logger ?? self.logger)
    }
}
