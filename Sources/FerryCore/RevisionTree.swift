/// The revision history of one document: a forest of revisions linked to their
/// parents, with a deterministic winner and the other live leaves as conflicts.
public struct RevisionTree: Sendable, Equatable {
    /// One revision in the tree.
    public struct Revision: Sendable, Equatable {
        public let id: RevisionID
        /// Index of the parent in `revisions`, or nil for a root (generation 1, or
        /// the oldest revision kept after pruning).
        public internal(set) var parent: Int?
        public let deleted: Bool
        /// Canonical JSON body; nil when it was dropped by compaction or never received.
        public internal(set) var body: [UInt8]?
        public let hlc: HLCTimestamp
        public internal(set) var isLeaf: Bool
    }

    /// Every revision, parents before their children.
    public internal(set) var revisions: [Revision] {
        get { storage }
        set {
            storage = newValue
            reindex()
        }
    }
    /// The revisions themselves; edited in place by this type's mutations, which keep
    /// `positions` and `leafCount` up to date as they go.
    private var storage: [Revision] = []
    /// Position of each revision by ID, kept only for wide trees: a tree of many leaves
    /// (replicated conflicts) would otherwise cost a scan per lookup, so per insert.
    private var positions: [RevisionID: Int]?
    /// Number of leaves (live or deleted), kept with every change.
    public private(set) var leafCount = 0

    /// Trees up to this size are searched by a scan, cheaper than building a dictionary on
    /// every decode (a document's linear history stays below it at the default depth).
    static let indexThreshold = 128

    public init() {}

    public static func == (a: RevisionTree, b: RevisionTree) -> Bool { a.storage == b.storage }

    public var isEmpty: Bool { revisions.isEmpty }

    public func index(of id: RevisionID) -> Int? {
        if let positions { return positions[id] }
        return storage.firstIndex(where: { $0.id == id })
    }

    /// Rebuilds the derived lookups after `revisions` was replaced or edited in place.
    private mutating func reindex() {
        leafCount = storage.reduce(0) { $0 + ($1.isLeaf ? 1 : 0) }
        guard storage.count > Self.indexThreshold else {
            positions = nil
            return
        }
        var map = [RevisionID: Int](minimumCapacity: storage.count)
        for (i, r) in storage.enumerated() { map[r.id] = i }
        positions = map
    }

    /// Appends a revision as a new leaf, under `parent` (which stops being one); returns its index.
    private mutating func appendLeaf(_ revision: Revision) -> Int {
        if let p = revision.parent, storage[p].isLeaf {
            storage[p].isLeaf = false
            leafCount -= 1
        }
        return append(revision)
    }

    private mutating func append(_ revision: Revision) -> Int {
        storage.append(revision)
        if revision.isLeaf { leafCount += 1 }
        if positions != nil {
            positions![revision.id] = storage.count - 1
        } else if storage.count > Self.indexThreshold {
            reindex()
        }
        return storage.count - 1
    }

    public func revision(_ id: RevisionID) -> Revision? {
        index(of: id).map { revisions[$0] }
    }

    public func contains(_ id: RevisionID) -> Bool { index(of: id) != nil }

    public var leaves: [Revision] { revisions.filter(\.isLeaf) }

    /// The winner rule, identical on every peer and the same as CouchDB's: a live leaf beats
    /// a deleted one, then the higher generation wins, then the higher hash (compared as
    /// `RevisionID.collationBytes`, so a 32-hex hash counts as its 16 raw bytes).
    public static func beats(_ a: Revision, _ b: Revision) -> Bool {
        if a.deleted != b.deleted { return !a.deleted }
        return b.id < a.id
    }

    public var winnerIndex: Int? {
        var best: Int?
        for (i, r) in revisions.enumerated() where r.isLeaf {
            if let b = best {
                if Self.beats(r, revisions[b]) { best = i }
            } else {
                best = i
            }
        }
        return best
    }

    public var winner: Revision? { winnerIndex.map { revisions[$0] } }

    /// The revisions a sender may base a delta on for a revision of `generation`: those
    /// older than it whose body is kept (the winner's is stored apart, so always counts),
    /// newest first, at most `limit`. Both sides of a transfer name them this one way.
    public func deltaBases(below generation: Int, limit: Int = 10) -> [RevisionID] {
        let w = winnerIndex
        return revisions.enumerated()
            .filter { ($0.element.body != nil || $0.offset == w) && $0.element.id.generation < generation }
            .map(\.element.id)
            .sorted(by: >)
            .prefix(limit)
            .map { $0 }
    }

    /// Live leaves other than the winner, best first.
    public var conflicts: [RevisionID] {
        guard let w = winnerIndex else { return [] }
        return revisions.enumerated()
            .filter { $0.offset != w && $0.element.isLeaf && !$0.element.deleted }
            .map(\.element)
            .sorted(by: Self.beats)
            .map(\.id)
    }

    public var hasConflicts: Bool {
        revisions.lazy.filter { $0.isLeaf && !$0.deleted }.count > 1
    }

    /// Appends a new revision created locally as a child of `parent` (nil for a new document).
    @discardableResult
    public mutating func addChild(
        _ id: RevisionID, of parent: RevisionID?, deleted: Bool, body: [UInt8]?, hlc: HLCTimestamp
    ) throws(RevisionTreeError) -> Int {
        var parentIndex: Int?
        if let parent {
            guard let p = index(of: parent) else { throw .unknownParent(parent) }
            guard id.generation == parent.generation + 1 else { throw .inconsistentHistory(id) }
            parentIndex = p
        } else if id.generation != 1 {
            throw .inconsistentHistory(id)
        }
        if contains(id) { throw .duplicate(id) }
        return appendLeaf(Revision(id: id, parent: parentIndex, deleted: deleted, body: body, hlc: hlc, isLeaf: true))
    }

    /// Inserts an existing revision with its ancestry (`history`, newest first, starting
    /// with the parent), as replication does. Unknown ancestors are added without bodies;
    /// a history that does not reach a known revision starts a new branch. Returns false
    /// when the revision was already present, leaving the tree unchanged.
    @discardableResult
    public mutating func insert(
        _ id: RevisionID, history: [RevisionID], deleted: Bool, body: [UInt8]?, hlc: HLCTimestamp
    ) throws(RevisionTreeError) -> Bool {
        for (i, ancestor) in history.enumerated() where ancestor.generation != id.generation - 1 - i {
            throw .inconsistentHistory(id)
        }
        if let existing = index(of: id) {
            // Fill in a body we had lost, so deltas and merges can use it again.
            if storage[existing].body == nil, let body, !storage[existing].isLeaf {
                storage[existing].body = body
            }
            return false
        }
        // Find the newest ancestor we already hold.
        var known: Int?
        var missing = history.count
        for (i, ancestor) in history.enumerated() {
            if let k = index(of: ancestor) {
                known = k
                missing = i
                break
            }
        }
        var parent = known
        if let p = parent, storage[p].isLeaf {
            storage[p].isLeaf = false
            leafCount -= 1
        }
        for ancestor in history[..<missing].reversed() {
            parent = append(
                Revision(id: ancestor, parent: parent, deleted: false, body: nil, hlc: .zero, isLeaf: false))
        }
        _ = appendLeaf(Revision(id: id, parent: parent, deleted: deleted, body: body, hlc: hlc, isLeaf: true))
        return true
    }

    /// Whether inserting a revision with `history` (newest first) would add a leaf, rather
    /// than extend one: its nearest held ancestor is not a leaf, or it holds none.
    public func addsLeaf(history: [RevisionID]) -> Bool {
        for ancestor in history {
            if let k = index(of: ancestor) { return !storage[k].isLeaf }
        }
        return true
    }

    /// Revision IDs from `id` back towards the root, newest first, at most `limit` of them.
    public func history(of id: RevisionID, limit: Int = .max) -> [RevisionID] {
        var out: [RevisionID] = []
        var cursor = index(of: id)
        while let c = cursor, out.count < limit {
            out.append(revisions[c].id)
            cursor = revisions[c].parent
        }
        return out
    }

    /// The nearest revision that is an ancestor of (or equal to) both `a` and `b`.
    public func commonAncestor(_ a: RevisionID, _ b: RevisionID) -> RevisionID? {
        let ancestorsOfA = Set(history(of: a))
        return history(of: b).first(where: { ancestorsOfA.contains($0) })
    }

    /// For each revision, its distance to the nearest leaf below it (0 for leaves).
    func distancesToLeaves() -> [Int] {
        var dist = [Int](repeating: .max, count: revisions.count)
        for (i, r) in revisions.enumerated() where r.isLeaf {
            var cursor: Int? = i
            var d = 0
            while let c = cursor, d < dist[c] {
                dist[c] = d
                d += 1
                cursor = revisions[c].parent
            }
        }
        return dist
    }

    /// Removes every revision that is `maxDepth` or more generations above all of its
    /// leaves. Leaves (and so the winner and conflicts) are always kept.
    public mutating func prune(maxDepth: Int) {
        precondition(maxDepth >= 1)
        let dist = distancesToLeaves()
        guard dist.contains(where: { $0 >= maxDepth }) else { return }
        var newIndex = [Int?](repeating: nil, count: revisions.count)
        var kept: [Revision] = []
        for (i, r) in revisions.enumerated() where dist[i] < maxDepth {
            newIndex[i] = kept.count
            kept.append(r)
        }
        for k in kept.indices {
            kept[k].parent = kept[k].parent.flatMap { newIndex[$0] }
        }
        revisions = kept
    }

    /// Drops the bodies of non-leaf revisions more than `retainedAncestors` generations
    /// above their nearest leaf; nearer ancestors keep theirs for deltas and merges.
    public mutating func dropBodies(retainingAncestors retainedAncestors: Int) {
        let dist = distancesToLeaves()
        for i in storage.indices where !storage[i].isLeaf && dist[i] > retainedAncestors {
            storage[i].body = nil
        }
    }

    mutating func setBody(_ body: [UInt8]?, at index: Int) { storage[index].body = body }
}

/// Why a revision cannot be added to a tree.
public enum RevisionTreeError: FerryError, Equatable {
    case unknownParent(RevisionID)
    case inconsistentHistory(RevisionID)
    case duplicate(RevisionID)
    case corruptEncoding(String)

    public var domain: String { "core" }
    public var failure: FailureKind { .invalidRequest }
    public var code: String {
        switch self {
        case .unknownParent: return "unknown_revision"
        case .inconsistentHistory: return "inconsistent_history"
        case .duplicate: return "duplicate_revision"
        case .corruptEncoding: return "corrupt_revision_tree"
        }
    }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .unknownParent(let r): return "unknown revision \(r)"
        case .inconsistentHistory(let r): return "history of \(r) has inconsistent generations"
        case .duplicate(let r): return "revision \(r) already exists"
        case .corruptEncoding(let why): return "corrupt revision tree encoding: \(why)"
        }
    }
}
