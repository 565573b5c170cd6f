import Crypto
import FerryCore
import FerryStore
import Foundation
import Logging

/// The passive side of replication: answers a peer's requests on any endpoint,
/// applying that peer's read and write policy.
public final class ReplicationResponder: Sendable {
    /// How a responder serves its peers.
    public struct Options: Sendable {
        /// Refuse every push (a permanent `forbidden` error).
        public var readOnly = false
        public var allowPush = true
        public var allowPull = true
        /// The policy of each peer, by node ID; `defaultPolicy` for the rest.
        public var policies: [String: PeerPolicy] = [:]
        public var defaultPolicy = PeerPolicy.trusted
        /// Consulted first, per request, so a trust store can change while peers are connected.
        public var policyLookup: (@Sendable (String) -> PeerPolicy?)?
        /// This node's identity, sent in hello.
        public var nodeID = "anonymous"
        /// What this node's own roles let it hold now (the group's rules; `.all` without
        /// them): a node that may hold everything drops nothing on a peer's word.
        public var ownRead: @Sendable () -> AccessRule = { .all }
        /// Resolvers applied to documents that pushed revisions put in conflict (the same
        /// deterministic resolvers the node's replicators use).
        public var resolvers = ResolverSet()
        /// How long a live `changes` request may wait before answering empty (a heartbeat).
        public var maxLongPoll: Duration = .seconds(60)
        /// While a live `changes` request waits, the feed is also re-read this often, to see
        /// commits made by other processes on the same database. Default 500 ms.
        public var pollInterval: Duration = .milliseconds(500)
        /// A live `changes` request answers this much later when the only new changes are
        /// relayed ones (see `ReplicatorConfiguration.relayDelay`). Default 10 ms.
        public var relayDelay: Duration = ReplicatorTuning.relayDelay
        /// The pull filter for pushed revisions: the same trust boundary a replicator's
        /// pull filter is, applied to what peers push here.
        public var incomingFilter: RevisionFilter?
        /// Where counters go; nil: nowhere.
        public var metrics: SyncMetrics?
        /// The node's catch-up lease, shared with its replicators: a pushing peer's first
        /// push-direction checkpoint read waits its turn. Nil: nothing waits.
        public var catchUpGate: CatchUpGate?
        /// Heartbeats and the silence watchdog, when the peer offers them too. Default 1 s, dead after 4 s.
        public var liveness = Liveness()
        /// The node's mesh view and relay ledger (see `ReplicatorConfiguration.mesh`), used
        /// for peers whose node ID the transport proves; nil: none.
        public var mesh: MeshRelay?
        /// The node's digests (see `ReplicatorConfiguration.digests`): heartbeats carry this
        /// node's, and the peers' are recorded for status and anti-entropy.
        public var digests: MeshDigests?
        /// When the blobs of revisions peers push here are fetched: with the push (`eager`,
        /// the default), or later on first read from a peer this node pulls from (`lazy`, or
        /// by size). Peers that may not read everything always send the content.
        public var blobPolicy = BlobFetchPolicy.eager
        /// A per-peer policy that replaces `blobPolicy` for that peer; nil: none.
        public var blobPolicyLookup: (@Sendable (String) -> BlobFetchPolicy?)?
        /// Told when a session ends, with why (nil: a normal close).
        public var sessionEnded: (@Sendable (SessionStatus, SyncError?) -> Void)?
        /// Fetches a blob deferred here (left for first read by a lazy policy) from another
        /// peer, excluding the one named, when a peer asks for it: so an eager peer pulling
        /// through a lazy node gets the blob. Returns whether it is here now; nil: such a
        /// request is answered `not_found`.
        public var fetchDeferredBlob: (@Sendable (BlobReference, _ excluding: String?) async throws -> Bool)?
        public init() {}

        func blobPolicy(for peer: String) -> BlobFetchPolicy { blobPolicyLookup?(peer) ?? blobPolicy }

        func policy(for peer: String) -> PeerPolicy { policyLookup?(peer) ?? policies[peer] ?? defaultPolicy }
    }

    let store: DocumentStore
    let options: Options
    let logger: Logger
    let clock: any Clock<Duration>
    /// Deferred blobs being fetched for peers that asked for them.
    let onBehalfFetches = OnBehalfFetches()

    public init(
        store: DocumentStore, options: Options = Options(), clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger = Logger(label: "ferry.sync.responder")
    ) {
        self.store = store
        self.options = options
        self.clock = clock
        self.logger = logger
    }

    /// Serves one endpoint until it closes. `authenticatedPeer` is the node ID proven by the
    /// transport (the TLS client certificate's fingerprint): when given, it — not the ID the
    /// peer claims in hello — selects the peer's policy and checkpoint namespace.
    public func serve(_ endpoint: any MessageEndpoint, authenticatedPeer: String? = nil) async {
        let session = ResponderSession(responder: self, authenticatedPeer: authenticatedPeer)
        let connection = Connection(endpoint: endpoint, handler: { request in await session.handle(request) }, metrics: options.metrics)
        let live = LiveSession(session: session, connection: connection, remoteAddress: endpoint.remoteAddress, connectedAt: Date())
        let id = live.session.sessionID
        liveSessions.withLock { $0[id] = live }
        session.connection.withLock { $0 = connection }
        await connection.run()
        session.catchUpEnded()
        session.blobsEnded()
        _ = liveSessions.withLock { $0.removeValue(forKey: id) }
        options.sessionEnded?(live.status, connection.closeReason)
    }

    /// One peer connected to this responder, as the node lists it.
    public struct SessionStatus: Sendable {
        /// Numbers sessions in the order they connected.
        public let id: Int
        /// The node ID the transport proved, else the one the peer claimed in hello (nil before hello).
        public let peerID: String?
        /// Whether `peerID` was proven by the transport (mutual TLS) rather than claimed.
        public let authenticated: Bool
        public let remoteAddress: String?
        public let connectedAt: Date
        /// Whether a request that moves documents or blobs is being answered now.
        public let busy: Bool
        /// From this node's side: `pushed` counts revisions sent to the peer, `pulled`
        /// revisions received from it and stored, `rejected` those refused at the trust
        /// boundary; the byte counts include the traffic so far.
        public let summary: ReplicationSummary
    }

    /// Every session open now, oldest first, with live counters.
    public var sessions: [SessionStatus] {
        liveSessions.withLock { Array($0.values) }.sorted { $0.session.sessionID < $1.session.sessionID }.map { $0.status }
    }

    private let liveSessions = Locked<[Int: LiveSession]>([:])
}

/// A session being served, with its connection (for live traffic counts).
struct LiveSession: Sendable {
    let session: ResponderSession
    let connection: Connection
    let remoteAddress: String?
    let connectedAt: Date

    var status: ReplicationResponder.SessionStatus {
        var summary = session.counts.withLock { $0 }
        let c = connection.counters.withLock { $0 }
        summary.bytesSent = c.bytesSent
        summary.bytesReceived = c.bytesReceived
        return .init(
            id: session.sessionID, peerID: session.peerID, authenticated: session.authenticatedPeer != nil,
            remoteAddress: remoteAddress, connectedAt: connectedAt, busy: session.working.withLock { $0 } > 0, summary: summary)
    }
}

/// Numbers responder sessions across the process.
private let sessionNumbers = Locked(0)

/// One peer's session with a responder: remembers the peer's identity after hello.
final class ResponderSession: Sendable {
    let responder: ReplicationResponder
    private let peer = Locked<String?>(nil)
    let authenticatedPeer: String?
    /// Revisions this peer pushed in this session: not announced back to it.
    let peerHeld = PeerHeldRevisions()
    let sessionID: Int
    /// Documents moved in this session (bytes come from the connection).
    let counts = Locked(ReplicationSummary())
    /// Requests that move documents or blobs being answered now.
    let working = Locked(0)
    /// The pushing peer's stated coverage and this session's place with the catch-up gate.
    let catchUp = ResponderCatchUp()
    /// The session's connection, for heartbeats (set before any request is read).
    let connection = Locked<Connection?>(nil)
    /// Blobs a restricted peer may fetch or refer to in this session (see `BlobGrants`).
    let blobGrants = Locked(BlobGrants())
    /// Blobs this peer is pushing in chunks (see `ResponderBlobs.swift`).
    let blobAssemblies = Locked<[BlobDigest: BlobAssembly]>([:])
    /// Trees the latest changes replies read, for the getRevs that follow them.
    let recentTrees = Locked(ResponderTreeCache())
    /// The feed's length past the last reply that counted it (`pendingChanges`).
    let pendingEstimate = Locked<PendingEstimate?>(nil)

    init(responder: ReplicationResponder, authenticatedPeer: String?) {
        self.responder = responder
        self.authenticatedPeer = authenticatedPeer
        sessionID = sessionNumbers.withLock { n -> Int in
            n += 1
            return n
        }
    }

    /// The proven or claimed node ID of the peer; nil before hello.
    var peerID: String? { peer.withLock { $0 } }

    /// The peer's ID as logs show it (claimed IDs are the peer's text).
    var peerForLog: String { LogText.escape(peer.withLock { $0 } ?? "?") }

    static let workingProfiles: Set<String> = [
        SyncProtocol.Profile.getRevs, SyncProtocol.Profile.putRevs, SyncProtocol.Profile.revsDiff,
        SyncProtocol.Profile.getBlob, SyncProtocol.Profile.putBlob,
    ]

    var store: DocumentStore { responder.store }
    var options: ReplicationResponder.Options { responder.options }
    var policy: PeerPolicy { options.policy(for: peer.withLock { $0 } ?? "") }

    func handle(_ request: Message) async -> Message? {
        let counted = Self.workingProfiles.contains(request.profile ?? "")
        if counted { working.withLock { $0 += 1 } }
        defer { if counted { working.withLock { $0 -= 1 } } }
        do {
            let profile = request.profile ?? ""
            if profile != SyncProtocol.Profile.hello && peer.withLock { $0 } == nil {
                throw SyncError.protocolViolation("the first request must be hello")
            }
            let reply: Message
            switch profile {
            case SyncProtocol.Profile.hello: reply = try hello(request)
            case SyncProtocol.Profile.getCheckpoint: reply = try await getCheckpoint(request)
            case SyncProtocol.Profile.setCheckpoint: reply = try setCheckpoint(request)
            case SyncProtocol.Profile.changes: reply = try await changes(request)
            case SyncProtocol.Profile.getRevs: reply = try await answer(request) { try self.getRevs(request) }
            case SyncProtocol.Profile.revsDiff: reply = try await answer(request) { try self.revsDiff(request) }
            case SyncProtocol.Profile.putRevs: reply = try await answer(request) { try self.putRevs(request) }
            case SyncProtocol.Profile.hasBlobs: reply = try hasBlobs(request)
            case SyncProtocol.Profile.getBlob: reply = try await getBlob(request)
            case SyncProtocol.Profile.putBlob: reply = try await putBlob(request)
            case SyncProtocol.Profile.accessRemoved: reply = try await answer(request) { try self.accessRemoved(request) }
            case SyncProtocol.Profile.accessCheck: reply = try await answer(request) { try self.accessCheck(request) }
            default: throw SyncError(.unknownRequest, message: "unknown request \"\(profile)\"", isTransient: false)
            }
            return reply
        } catch {
            let e = SyncError.from(error)
            responder.logger.warning(
                "request failed",
                metadata: [
                    "peer": "\(peerForLog)", "profile": "\(LogText.escape(request.profile ?? "?"))",
                    "error": "\(LogText.escape(describing: e))",
                ])
            return Message.errorReply(to: request.number, e)
        }
    }

    /// Runs a request's synchronous store work: a bulk one (a request body of at least
    /// `ReplicatorTuning.offPoolRequestBytes`) on threads made for blocking work, so that its
    /// reads and its write transaction never hold one of the cooperative pool's threads; a
    /// live one (a revision or two) in place, where two thread hand-offs cost more than the work.
    func answer(_ request: Message, _ work: @escaping @Sendable () throws -> Message) async throws -> Message {
        guard request.body.count >= ReplicatorTuning.offPoolRequestBytes else { return try work() }
        return try await BlockingIO.run(work)
    }

    func reply(_ request: Message, _ body: JSON) -> Message {
        Message(kind: .response, number: request.number, body: body.canonicalBytes)
    }

    func hello(_ request: Message) throws -> Message {
        let hello = try HelloRequest(try request.json())
        let offered = hello.protocols
        guard let version = SyncProtocol.versions.first(where: offered.contains) else {
            throw SyncError.incompatibleVersion(
                "peer speaks protocol \(offered), this node speaks \(SyncProtocol.versions)")
        }
        peer.withLock { $0 = authenticatedPeer ?? hello.nodeID }
        noteHello(hello)
        armLiveness(peerOffers: hello.features)
        var answer = HelloReply(
            nodeID: options.nodeID, database: store.uuid, protocolVersion: version,
            features: SyncProtocol.features(liveness: options.liveness),
            allowPush: options.allowPush && !options.readOnly, allowPull: options.allowPull,
            coverage: coverageForHello(peerDatabase: hello.database))
        if let removed = try? store.accessRemovals().total, removed > 0 { answer.accessEpoch = removed }
        let own = options.ownRead()
        if !own.admitsEverything { answer.accessStamp = String(Hex.encode(SHA256.hash(data: Array(own.fingerprint.utf8))).prefix(16)) }
        return reply(request, answer.json)
    }

    /// Whose echoes a push records and a pull leaves out: the peer (as checkpoints are
    /// namespaced, so one peer cannot make another miss changes) and its database as it
    /// said in hello; nil before hello or when it named none.
    var echoKey: String? {
        let database = catchUp.state.withLock { $0.peerDatabase }
        guard !database.isEmpty else { return nil }
        return "peer/\(peer.withLock { $0 } ?? "")/\(database)"
    }

    /// Namespaced by peer so one peer cannot read or overwrite another's checkpoints.
    func checkpointKey(_ id: String) -> String { "checkpoint/peer/\(peer.withLock { $0 } ?? "")/\(id)" }

    func getCheckpoint(_ request: Message) async throws -> Message {
        let get = try GetCheckpointRequest(try request.json())
        // A pushing peer may wait here for its catch-up turn (ResponderCatchUp.swift).
        let holds = get.direction == .push ? try await pushCheckpointTurn() : nil
        return reply(request, CheckpointValue(value: try store.localDocument(checkpointKey(get.id)), holds: holds).json)
    }

    func setCheckpoint(_ request: Message) throws -> Message {
        let set = try SetCheckpointRequest(try request.json())
        try checkCheckpointQuota(set)
        try store.putLocalDocument(checkpointKey(set.id), body: set.value, durability: .normal)  // rolls back with the pushed revisions it covers
        if set.direction == .push, let n = set.value["seq"]?.intValue, n >= 0 {
            try pushCheckpointWritten(through: UInt64(n), caughtUp: set.caughtUp, skipped: set.skipped, skipsLost: set.skipsLost)
        }
        return reply(request, [:])
    }

    func requirePull() throws {
        guard options.allowPull else { throw SyncError.forbidden("this node does not allow pull") }
    }

    func requirePush() throws {
        guard options.allowPush && !options.readOnly else {
            throw SyncError.forbidden("this node is read-only: push is refused")
        }
    }

    func revsDiff(_ request: Message) throws -> Message {
        try requirePush()
        let query = try RevsDiffRequest(try request.json()).docs
        // A document purged here offered with a revision this node never knew is readable again.
        try store.liftAccessRefusals(offered: query)
        var answer = RevsDiffReply(store: try store.revsDiff(query))
        let access = DocumentAccess(policy)
        if !access.readsEverything && !query.isEmpty {
            // Of a document it may not read, the peer learns nothing: every revision it names
            // is missing, with no ancestors (they would reveal what the document holds).
            let trees = try store.revisionTrees(Array(query.keys))
            for (id, tree) in trees {
                if !access.mayRead(id, tree: tree) {
                    answer.entries[id] = MissingRevisions(missing: query[id] ?? [], possibleAncestors: [])
                } else if let entry = answer.entries[id] {
                    answer.entries[id]?.possibleAncestors = entry.possibleAncestors.filter { access.mayRead(id, revision: $0, in: tree) }
                }
            }
        }
        return reply(request, answer.json)
    }

    /// Sends the requested revisions, as deltas against ancestors the peer holds when smaller.
    func getRevs(_ request: Message) throws -> Message {
        try requirePull()
        let asked = try GetRevsRequest(try request.json())
        let useDeltas = asked.deltas
        let maxHistory = Int(min(max(1, asked.maxHistory), 1000))
        let access = DocumentAccess(policy)
        let fingerprint = access.readsEverything || !access.policy.read.needsBodies ? nil : access.policy.read.fingerprint
        let (trees, judged) = try servedTrees(asked.revs, readFingerprint: fingerprint)
        var out: [WireRevision] = []
        for wanted in asked.revs {
            let (id, rev) = (wanted.id, wanted.rev)
            // A revision the peer may not read is missing, exactly as one never held.
            guard let tree = trees[id],
                access.readsEverything || access.mayRead(id, revisions: [rev], in: tree, documentJudged: judged.contains(id)),
                let (wire, _) = WireRevision.make(
                    id: id, revision: rev, tree: tree, receiverHas: Pusher.readableBases(wanted.ancestors, id, tree, access),
                    useDeltas: useDeltas, maxHistory: maxHistory)
            else {
                out.append(.missing(id: id.rawValue, rev: rev.description))
                continue
            }
            if !access.readsEverything { grantBlobs(of: tree.revision(rev)?.body) }
            out.append(wire)
        }
        let sent = out.count(where: { !$0.missing })
        counts.withLock { $0.pushed += sent }
        return Message(kind: .response, number: request.number, body: WireRevision.encodeBatch(out))
    }

    /// The trees of the asked documents: those the latest changes replies read when they hold
    /// every asked revision's body, the others read now; and which of them the read rule
    /// with `fingerprint` already found readable as they stand (nil: none to check).
    func servedTrees(_ wanted: [RevisionRequest], readFingerprint fingerprint: String?) throws
        -> (trees: [DocumentID: RevisionTree], judged: Set<DocumentID>)
    {
        let purges = store.contentVersion.purges
        var trees: [DocumentID: RevisionTree] = [:]
        var judged = Set<DocumentID>()
        recentTrees.withLock { cache in
            for w in wanted where trees[w.id] == nil {
                guard let kept = cache.take(w.id, purges: purges) else { continue }
                trees[w.id] = kept.tree
                if let fingerprint, kept.readableUnder == fingerprint { judged.insert(w.id) }
            }
        }
        var unread = Set<DocumentID>()
        for w in wanted where trees[w.id]?.revision(w.rev)?.body == nil { unread.insert(w.id) }
        if !unread.isEmpty {
            for id in unread {
                trees[id] = nil
                judged.remove(id)
            }
            trees.merge(try store.revisionTrees(unread)) { _, fresh in fresh }
        }
        return (trees, judged)
    }

    /// Purges what the pusher says this node may no longer read, within the pusher's write policy.
    func accessRemoved(_ request: Message) throws -> Message {
        try requirePush()
        let asked = try AccessRemovedRequest(try request.json())
        let removals = try AccessRemovalApplier.apply(asked.removed, writer: policy, own: responder.options.ownRead(), store: store)
        for r in removals {
            responder.logger.info("access removed", metadata: ["peer": "\(peerForLog)", "id": "\(LogText.escape(r.id))"])
        }
        return reply(request, .object([:]))
    }

    /// Answers which of the documents the peer holds it may no longer read here.
    func accessCheck(_ request: Message) throws -> Message {
        try requirePull()
        let asked = try AccessCheckRequest(try request.json())
        let access = DocumentAccess(policy)
        guard !access.readsEverything else { return reply(request, AccessCheckReply(removed: []).json) }
        let ids = asked.held.compactMap { try? DocumentID($0.id) }
        let trees = try store.revisionTrees(ids)
        var removed: [RemovalNotice] = []
        for held in asked.held {
            guard let doc = try? DocumentID(held.id), let tree = trees[doc], let notice = access.removalNotice(doc, held: held, tree: tree)
            else { continue }
            removed.append(notice)
        }
        return reply(request, AccessCheckReply(removed: removed).json)
    }

    /// Inserts pushed revisions through the trust boundary; answers per revision.
    func putRevs(_ request: Message) throws -> Message {
        try requirePush()
        let wires = try WireRevision.decodeBatch(request.body)
        let pipeline = IncomingPipeline(policy: policy, filter: options.incomingFilter, maxBodyBytes: store.options.maxBodyBytes)
        let trees = try store.revisionTrees(Set(wires.compactMap { try? DocumentID($0.id, allowReserved: true) }))
        var results: [PutResult] = []
        var accepted: [(Int, IncomingRevision)] = []
        for wire in wires where !wire.missing {
            let existing = (try? DocumentID(wire.id, allowReserved: true)).flatMap { trees[$0] }
            switch pipeline.check(wire, existing: existing, baseBody: { id, base in
                trees[id]?.revision(base)?.body.flatMap { try? JSON.parse($0).objectValue }
            }) {
            case .accepted(let rev):
                if let refusal = blobRefusal(rev) {
                    let rejection = Rejection(stage: .policy, reason: refusal)
                    options.metrics?.rejected(stage: rejection.stage.rawValue, direction: "push")
                    counts.withLock { $0.rejected += 1 }
                    results.append(PutResult(id: wire.id, rev: wire.rev, status: .rejected(rejection)))
                    continue
                }
                accepted.append((results.count, rev))
                results.append(PutResult(id: wire.id, rev: wire.rev, status: .stored))
            case .rejected(_, _, let rejection):
                options.metrics?.rejected(stage: rejection.stage.rawValue, direction: "push")
                responder.logger.warning(
                    "pushed revision rejected",
                    metadata: [
                        "peer": "\(peerForLog)", "id": "\(LogText.escape(wire.id))", "rev": "\(LogText.escape(wire.rev))",
                        "reason": "\(LogText.escape(describing: rejection))",
                    ])
                counts.withLock { $0.rejected += 1 }
                results.append(PutResult(id: wire.id, rev: wire.rev, status: .rejected(rejection)))
                if rejection.stage == .policy, let peer = peerID { mesh?.view.withdrawMomentarily(peer) }
            case .needFull:
                results.append(PutResult(id: wire.id, rev: wire.rev, status: .needFull))
            }
        }
        recordRelayed(accepted.map(\.1), absentFrom: trees)
        // Recorded with the revisions: this peer's later pulls leave their feed entries out.
        // Only catch-up-sized batches: a live push of a revision or two is left out on this
        // connection already (`peerHeld`), and re-reading a few entries later costs less than
        // rewriting the record on every write of a mesh.
        let echoFor = accepted.count >= ReplicatorTuning.minimumEchoBatch ? echoKey : nil
        let outcomes = try store.insertRevisions(accepted.map(\.1), durability: .normal, echoKey: echoFor)
        var touched = Set<DocumentID>()
        var branched = Set<DocumentID>()
        for ((_, rev), outcome) in zip(accepted, outcomes) {
            guard case .inserted(_, let hasBranches) = outcome else { continue }
            touched.insert(rev.id)
            if hasBranches { branched.insert(rev.id) }
        }
        options.metrics?.received(touched.count)
        options.metrics?.unverifiable(stored: accepted.map(\.1), outcomes: outcomes)
        // The default resolver writes nothing; its count is not needed here, and reading it costs a query per push.
        // A document left with one leaf has nothing to resolve.
        if !options.resolvers.isDefaultOnly {
            _ = try store.resolveConflicts(in: branched, using: options.resolvers, logger: responder.logger)
        }
        for ((index, rev), outcome) in zip(accepted, outcomes) {
            if case .rejected = outcome {} else { peerHeld.record(rev.id, rev.revision) }
            switch outcome {
            case .inserted: counts.withLock { $0.pulled += 1 }
            case .alreadyPresent:
                results[index].status = .exists
                options.metrics?.duplicates(1)
            case .rejected(let e):
                counts.withLock { $0.rejected += 1 }
                let rejection = Rejection(storeError: e)
                options.metrics?.rejected(stage: rejection.stage.rawValue, direction: "push")
                results[index].status = .rejected(rejection)
            }
        }
        return reply(request, PutRevsReply(results: results).json)
    }
}
