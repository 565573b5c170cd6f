import FerryCore
import FerrySync

/// What an app chooses about one replication: direction, once or continuous, which
/// documents, filters, conflict resolution, blob fetching and retries. A node's wiring
/// (mesh relays, catch-up gates, metrics, liveness) is not here: the node sets it.
public struct ReplicationSettings: Sendable {
    public var direction: ReplicatorConfiguration.Direction = .pushAndPull
    /// Keep replicating as documents change, instead of stopping once caught up.
    public var continuous = false
    /// Only these documents, when set.
    public var documentIDs: Set<DocumentID>?
    /// Which local revisions are sent; the other side never sees those it refuses.
    public var pushFilter: RevisionFilter?
    /// Which incoming revisions are stored: the trust boundary, applied before anything is written.
    public var pullFilter: RevisionFilter?
    /// How conflicts are resolved, by document `type`.
    public var resolvers = ResolverSet()
    /// Which pulled blobs are fetched before their documents are stored (`.eager`), or on first read.
    public var blobPolicy = BlobFetchPolicy.eager
    /// Attempts before a failing replication stops (nil: keep retrying a continuous one).
    public var maxAttempts: Int?

    public init() {}

    /// The replicator's configuration for these settings, as this side (`nodeID`) runs it.
    func configuration(nodeID: String, resetCheckpoint: Bool) -> ReplicatorConfiguration {
        var c = ReplicatorConfiguration()
        c.direction = direction
        c.continuous = continuous
        c.documentIDs = documentIDs
        c.pushFilter = pushFilter
        c.pullFilter = pullFilter
        c.resolvers = resolvers
        c.blobPolicy = blobPolicy
        c.maxAttempts = maxAttempts
        c.wiring.nodeID = nodeID
        c.resetCheckpoint = resetCheckpoint
        return c
    }
}
