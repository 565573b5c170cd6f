import FerryCore

/// Everything that shapes one replicator; each field has a documented default.
public struct ReplicatorConfiguration: Sendable {
    /// Which way documents move.
    public enum Direction: String, Sendable {
        case push, pull, pushAndPull
        var pulls: Bool { self != .push }
        var pushes: Bool { self != .pull }
    }

    /// Default `.pushAndPull`.
    public var direction: Direction = .pushAndPull
    /// One-shot (false, the default) stops when caught up; continuous keeps listening.
    public var continuous = false
    /// Replicate only these documents (nil: all).
    public var documentIDs: Set<DocumentID>?
    /// Revisions that may be pushed; part of the push checkpoint key.
    public var pushFilter: RevisionFilter?
    /// Revisions that may be pulled in; part of the pull checkpoint key.
    public var pullFilter: RevisionFilter?
    /// A Mango selector the other side is asked to filter its changes by (CouchDB's
    /// `filter=_selector`), so that what this node would refuse anyway is not sent. Only a
    /// hint: what comes in is still judged by `pullFilter`, which should hold the same
    /// selector (and whose name is part of the pull checkpoint key). Nil: none.
    public var remoteSelector: JSON?
    /// What the remote peer may write here (checked on pull, before the pull filter).
    public var remotePolicy = PeerPolicy.trusted
    /// Whether this node's own read access is narrowed by content (group rules with
    /// selectors): each pull session then first asks the peer which held documents it may no
    /// longer read (docs/protocol.md §3, accessCheck).
    public var checksHeldAccess = false
    /// What this node's own roles let it read (group rules), when narrowed: part of the pull
    /// checkpoint key, so a change of its roles re-examines the peer's feed for what it may
    /// now hold.
    public var ownReadFingerprint: String?
    /// What this node's own roles let it hold now (the group's rules; `.all` without them):
    /// removal notices count only on a node they do not let read everything.
    public var ownRead: @Sendable () -> AccessRule = { .all }
    /// Conflict resolvers by document type. Default: keep conflicts visible.
    public var resolvers = ResolverSet()
    /// Consecutive failed attempts before giving up; nil means 10 for one-shot and
    /// unlimited for continuous replication.
    public var maxAttempts: Int?
    /// The first retry waits this long; each further one doubles, up to `maxAttemptWait`.
    public var initialAttemptWait: Duration = .milliseconds(250)
    public var maxAttemptWait: Duration = .seconds(300)
    /// A continuous replication that the peer refuses because it does not trust this node
    /// (`not_trusted_by_peer`) retries after this, doubling up to `maxNotTrustedRetryWait`,
    /// however long that lasts: only a new attempt can tell when the peer's operator has
    /// added this node, and then replication should start at once. Defaults 200 ms and 1.5 s
    /// (each wait is jittered down to half).
    public var notTrustedRetryWait: Duration = .milliseconds(200)
    public var maxNotTrustedRetryWait: Duration = .milliseconds(1500)
    /// How long a live changes request waits on the peer before it answers empty.
    public var heartbeat: Duration = .seconds(30)
    /// Send and accept deltas. Default true.
    public var deltas = true
    /// When the blobs of pulled revisions are fetched: before the revision is stored
    /// (`eager`, the default), on first read (`lazy`), or by size.
    public var blobPolicy = BlobFetchPolicy.eager
    /// Start from sequence 0 instead of the saved checkpoints, once: the first session of each
    /// direction resets, and a reconnect after it resumes from the checkpoints that session saved.
    public var resetCheckpoint = false
    /// Changes per batch. Default 1000: each batch costs a durable commit of the local
    /// checkpoint, so small batches are bound by fsync latency (2–3 ms here), not bandwidth.
    public var batchSize = 1000
    /// Revisions per getRevs/putRevs request (each pulled request is one insert
    /// transaction), and their estimated bytes: bounds memory in flight. Default 250, 2 MiB.
    public var maxRevisionsPerRequest = 250
    public var maxBytesPerRequest = 2 << 20
    /// Once a continuous replication has caught up, the peer's copy of a checkpoint is
    /// written at most this long after the first batch it covers, not after every batch
    /// (the local copy still is). A lagging peer copy costs nothing but a re-read of
    /// changes after a restart. Default 5 s.
    public var remoteCheckpointDelay: Duration = .seconds(5)
    /// Once a continuous replication has caught up, revisions whose wire form (a delta
    /// against the parent, or a first generation's whole body) is at most this many bytes
    /// travel inline: in the peer's changes replies, and pushed without a revsDiff round
    /// trip. 0 turns this off. Default 4096.
    public var inlineLimit = 4096
    /// Ancestors sent with each revision.
    public var maxHistory = 100
    /// While idle, a continuous push also re-reads the local changes feed this often, to see
    /// commits made by other processes on the same database. Default 500 ms.
    public var localPollInterval: Duration = .milliseconds(500)
    /// A caught-up push waits this long before passing on revisions this node only
    /// relays (stored from other peers, not made here); local edits go at once. In a full
    /// mesh every peer gets a write straight from its author, so relays are answered
    /// "exists": the delay takes them out of the moments a write is being delivered, and
    /// lets a relay that crosses one from the peer be skipped. Each hop of a partial mesh
    /// adds it. Default 10 ms; zero relays at once.
    public var relayDelay: Duration = ReplicatorTuning.relayDelay

    /// What the node this replicator runs in shares with it: its identity, counters, mesh,
    /// digests, catch-up lease and liveness. An app replicating on its own leaves the defaults.
    public var wiring = ReplicatorWiring()

    public init() {}

    var effectiveMaxAttempts: Int { maxAttempts ?? (continuous ? Int.max : 10) }

    /// Whether this side of the link replicates every document both ways, which a mesh
    /// link must for relay suppression to rely on it (the pull filter is node-wide, so the
    /// same whichever peer a revision comes from).
    var replicatesEverything: Bool { replicatesWhatPolicyAdmits && remotePolicy.admitsEverything }

    /// Whether this side of the link replicates, both ways, every document the group's access
    /// rules grant the peer, nothing narrowed by hand: a mesh link under the rules, which
    /// relay suppression may rely on between nodes judging by the same rules.
    var replicatesGroupGrant: Bool { replicatesWhatPolicyAdmits && remotePolicy.followsGroupRules != nil }

    /// Continuous, both ways, no document-ID list or push filter: the peer's policy alone says what moves.
    private var replicatesWhatPolicyAdmits: Bool { direction == .pushAndPull && continuous && documentIDs == nil && pushFilter == nil }
}

/// What a replicator is doing.
public struct ReplicatorStatus: Sendable, Equatable {
    /// The replicator's lifecycle phase.
    public enum Activity: String, Sendable {
        case stopped, offline, connecting, idle, busy
    }
    public var activity: Activity
    /// Changes examined and changes seen, across both directions.
    public var completed: Int
    public var total: Int
    /// The last error: permanent when stopped, the transient cause when offline.
    public var error: SyncError?

    public static let initial = ReplicatorStatus(activity: .stopped, completed: 0, total: 0, error: nil)

    public init(activity: Activity, completed: Int, total: Int, error: SyncError?) {
        self.activity = activity
        self.completed = completed
        self.total = total
        self.error = error
    }
}

/// One document replicated, or refused, in either direction.
public struct DocumentEvent: Sendable, Equatable {
    /// Which way a document moved.
    public enum Direction: String, Sendable { case push, pull }
    public let direction: Direction
    public let id: String
    public let revision: String
    public let deleted: Bool
    /// Set when the revision was refused at the trust boundary or by the peer.
    public let rejection: String?
    /// Set when the document was purged here because this node may no longer read it.
    public var accessRemoved = false
}

/// Totals of one replicator's work.
public struct ReplicationSummary: Sendable, Equatable {
    public var pushed = 0
    public var pulled = 0
    public var rejected = 0
    /// Conflicts created by pulled revisions.
    public var conflicts = 0
    /// Conflicts resolved (revisions written by resolvers).
    public var resolved = 0
    public var bytesSent = 0
    public var bytesReceived = 0
    public var deltasSent = 0
    public var deltasReceived = 0
    public var blobsSent = 0
    public var blobsReceived = 0
    /// Blob content bytes sent and received (chunks, or whole blobs), counted as they move.
    public var blobBytesSent: Int64 = 0
    public var blobBytesReceived: Int64 = 0
    /// The bytes of the blobs being sent or received now and those done (a progress bar's
    /// total): each blob adds its length when its transfer starts.
    public var blobBytesToSend: Int64 = 0
    public var blobBytesToReceive: Int64 = 0
    /// Blobs of pulled revisions left to be fetched on first read (a lazy policy).
    public var blobsDeferred = 0
    public init() {}
}

/// What a node shares with each of its replicators, apart from the replication's own
/// settings: who it is, where counters go, its mesh view, digests, catch-up lease and
/// liveness. Each field has a default that fits a replicator running on its own.
public struct ReplicatorWiring: Sendable {
    /// This node's identity, sent in hello.
    public var nodeID = "anonymous"
    /// Where counters go (documents, rejections by reason, bytes, deltas, errors); nil: nowhere.
    public var metrics: SyncMetrics?
    /// The node's catch-up lease, shared with its other replicators and its responder: the
    /// pull of each connection waits its turn before it starts (when its intake is complete:
    /// see docs/protocol.md §6, join catch-up), so that one link at a time catches this node
    /// up and the others start from the coverage it leaves. Nil (the default): the pull
    /// starts at once.
    public var catchUpGate: CatchUpGate?
    /// Heartbeats on an idle connection and the silence watchdog, when the peer offers them
    /// too (docs/protocol.md §3 heartbeat). Default: one per second, dead after 4 s silent.
    public var liveness = Liveness()
    /// The node's mesh view and relay ledger, one per node and shared by all its replicators
    /// and its responder: heartbeats carry this node's links, and a revision a peer will get
    /// from its own link to the sender is not relayed to it. nil (the default): neither.
    public var mesh: MeshRelay?
    /// The node's content digest and its peers' reported ones, shared like `mesh`:
    /// heartbeats carry the digest, and a full continuous link whose peer's digest differs
    /// from this node's while both are idle reconciles (`antiEntropy`). nil (the default): neither.
    public var digests: MeshDigests?
    /// When a link compares digests and reconciles; see `AntiEntropy`.
    public var antiEntropy = AntiEntropy()

    public init() {}
}
