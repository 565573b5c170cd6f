/// The replicator's internal tuning: values measured on this code's hot paths that users
/// have no reason to change, kept in one place so that a change to them is deliberate.
/// (Settings a deployment may want to change live in `ReplicatorConfiguration`.)
enum ReplicatorTuning {
    /// A pulled chunk of at least this many accepted revisions is inserted on the
    /// database's own thread while the puller suspends (judging the next chunk keeps a
    /// cooperative thread: 2 on a 2-core machine); a smaller one, as in live sync, is
    /// inserted in place, where two thread hand-offs would cost more than the insert
    /// (Benchmarks/README.md, "How the pull runs").
    static let suspendingInsertThreshold = 32

    /// A responder answers a request body of at least this many bytes (a bulk `putRevs`,
    /// `getRevs`, `revsDiff` or access check: a few revisions of 1 KiB, or about 40 asked
    /// for) on `BlockingIO` threads; a smaller one, as in live sync, in place
    /// (docs/architecture.md, "Blocking calls and the cooperative pool").
    static let offPoolRequestBytes = 4096

    /// How much later than a local edit a relayed revision goes out, on both sides of a
    /// link (`ReplicatorConfiguration.relayDelay`, `ReplicationResponder.Options.relayDelay`).
    static let relayDelay: Duration = .milliseconds(10)

    // MARK: the mesh

    /// A digest view no link asked for in this long is no longer computed (`MeshDigests`):
    /// views are kept per peer coverage, and a peer gone for a minute is not coming back soon.
    static let digestViewKeptFor: Duration = .seconds(60)

    /// An unchanged digest is repeated every this many heartbeats: about 8 bytes a second per
    /// idle link, and a peer that missed one learns it within ten heartbeats.
    static let digestRepeat = 10

    // MARK: the responder

    /// Pages of the changes feed whose trees the responder keeps (`ResponderTreeCache`): the
    /// one whose revisions are being fetched, and the next ones the peer asked for ahead of them.
    static let treeCachePages = 3

    /// Bytes of bodies kept per cached page; a page's documents past it are read again when
    /// asked, so a feed of large documents costs a read, not memory.
    static let treeCacheBytesPerPage = 8 << 20

    /// The largest winner body a changes read restores into the cache (larger ones are read
    /// when asked): small documents ride along with their feed entry for free.
    static let treeCacheBodyBytes = 16 << 10

    /// The smallest pushed batch whose echo is recorded: a live push of a revision or two is
    /// left out on its connection already (`PeerHeldRevisions`), and re-reading a few entries
    /// later costs less than rewriting the record on every write of a mesh.
    static let minimumEchoBatch = 16

    /// Full pages with nothing for the peer read on within one request; past them the answer
    /// is empty but not caught up, and the peer asks again from its `lastSeq`, so one request
    /// never scans an unbounded feed for a narrowly restricted peer.
    static let maxPagesReadOn = 50

    /// The pending count a feed reports is taken again every this many pages (an estimate in
    /// between, so writes made meanwhile show then): a `COUNT` per page cost more than a page.
    static let pendingRecount = 16

    /// Revisions remembered per connection as already held by the peer (`PeerHeldRevisions`);
    /// when full it starts over, which only lets some echoes through.
    static let peerHeldRevisions = 10_000
}
