import FerryCore
import FerryStore

/// The revision trees (winner bodies included) that a session's latest changes replies read,
/// so that the getRevs that follow them are answered without reading the same rows again.
///
/// On a bulk pull's serving side, reading each asked document again cost a quarter of the
/// CPU (P1, 100k x 1 KiB: 15.1 us per document before, see Benchmarks/README.md). A kept
/// tree is the document as it stood at the changes read, moments earlier: the revision a
/// peer asks for is one that read named, and a revision's content never changes. Any purge
/// committed since empties the cache (a purged revision is never sent from it), and the
/// cache is bounded in pages and in bytes.
struct ResponderTreeCache: Sendable {
    static let pagesKept = ReplicatorTuning.treeCachePages
    static let maxBytesPerPage = ReplicatorTuning.treeCacheBytesPerPage
    static let maxBodyBytes = ReplicatorTuning.treeCacheBodyBytes

    /// A kept tree, and the read rule (its fingerprint) that found the document readable as
    /// this tree holds it, if one did: the same tree under the same rule needs no second verdict.
    struct Kept: Sendable {
        let tree: RevisionTree
        /// The document's sequence at the read: names this state of it.
        let sequence: UInt64
        var readableUnder: String?
    }

    private var pages: [[DocumentID: Kept]] = []
    private var purges: UInt64 = 0

    /// Keeps a page's trees that hold their winner's body, within the page's byte budget.
    mutating func keep(_ page: [(Change, RevisionTree)], purges: UInt64) {
        forgetIfPurged(purges)
        var trees: [DocumentID: Kept] = [:]
        var bytes = 0
        for (change, tree) in page {
            guard let w = tree.winnerIndex, tree.revisions[w].body != nil else { continue }
            bytes += tree.revisions.reduce(64) { $0 + 64 + ($1.body?.count ?? 0) }
            if bytes > Self.maxBytesPerPage { break }
            trees[change.id] = Kept(tree: tree, sequence: change.sequence)
        }
        guard !trees.isEmpty else { return }
        pages.append(trees)
        if pages.count > Self.pagesKept { pages.removeFirst() }
    }

    /// The latest kept tree of `id`, taken out of the cache (each is asked for once); nil when none.
    mutating func take(_ id: DocumentID, purges: UInt64) -> Kept? {
        forgetIfPurged(purges)
        for i in pages.indices.reversed() {
            if let kept = pages[i].removeValue(forKey: id) { return kept }
        }
        return nil
    }

    /// Notes that the read rule with `fingerprint` found these documents readable in the
    /// state their sequence names (a kept tree of another state is left as it is).
    mutating func markReadable(_ documents: [(id: DocumentID, sequence: UInt64)], under fingerprint: String) {
        for d in documents {
            for i in pages.indices where pages[i][d.id]?.sequence == d.sequence { pages[i][d.id]?.readableUnder = fingerprint }
        }
    }

    var count: Int { pages.reduce(0) { $0 + $1.count } }

    private mutating func forgetIfPurged(_ purges: UInt64) {
        guard purges != self.purges else { return }
        pages.removeAll()
        self.purges = purges
    }
}

/// The feed's length past a changes reply, as last counted or derived (`pendingChanges`).
struct PendingEstimate: Sendable {
    let after: UInt64
    let count: Int
    /// Replies answered from this count since it was taken.
    let reused: Int
}
