import FerryCore
import FerryStore
import Logging

/// What a resolver decides for a document in conflict.
public enum Resolution: Sendable, Equatable {
    /// Keep the conflict visible; do nothing.
    case keepConflict
    /// Keep this leaf and tombstone the other contenders.
    case keep(RevisionID)
    /// Delete the document: tombstone every live leaf.
    case delete
    /// Write this body as a child of the winning leaf and tombstone the other contenders.
    case merge(JSON)
}

/// The revisions competing in a conflict, as a resolver sees them.
public struct ConflictContext: Sendable {
    public let id: DocumentID
    public let tree: RevisionTree
    /// Live leaves, best first by the winner rule.
    public let liveLeaves: [RevisionTree.Revision]
    /// Tombstones that deleted a live revision on a branch that is still contended.
    public let contendingTombstones: [RevisionTree.Revision]

    public func body(of revision: RevisionTree.Revision) -> JSON? {
        revision.body.flatMap { try? JSON.parse($0) }
    }
}

/// Chooses a resolution for a conflict. Built-in resolvers are deterministic: peers that
/// resolve the same conflict produce identical revisions, so resolutions converge.
public struct ConflictResolver: Sendable {
    public let name: String
    public let resolve: @Sendable (ConflictContext) -> Resolution

    public init(name: String, _ resolve: @escaping @Sendable (ConflictContext) -> Resolution) {
        self.name = name
        self.resolve = resolve
    }

    /// The default: the deterministic winner shows and the conflict stays visible.
    public static let keepConflicts = ConflictResolver(name: "default") { _ in .keepConflict }

    /// Any contending deletion wins over edits.
    public static let deletesWin = ConflictResolver(name: "deletesWin") { ctx in
        if !ctx.contendingTombstones.isEmpty { return .delete }
        return ctx.liveLeaves.count > 1 ? .keep(ctx.liveLeaves[0].id) : .keepConflict
    }

    /// The contender with the latest hybrid logical clock wins; ties go to the winner rule.
    public static let lastWriteWins = ConflictResolver(name: "lastWriteWins") { ctx in
        let all = ctx.liveLeaves + ctx.contendingTombstones
        guard let latest = all.max(by: { a, b in
            a.hlc != b.hlc ? a.hlc < b.hlc : RevisionTree.beats(b, a)
        }) else { return .keepConflict }
        return latest.deleted ? .delete : .keep(latest.id)
    }

    /// Field-level three-way merge of the live leaves against their nearest common
    /// ancestor. Where both sides changed a field differently, the better leaf (by the
    /// winner rule) wins. Leaves with no common ancestor (the same ID created on two peers)
    /// merge against an empty base. When a body it needs is no longer retained it falls
    /// back to lastWriteWins, so a conflict never stays unresolved under this policy.
    public static let merge = ConflictResolver(name: "merge") { ctx in
        guard ctx.liveLeaves.count > 1 else {
            return ctx.contendingTombstones.isEmpty ? .keepConflict : .keep(ctx.liveLeaves[0].id)
        }
        let first = ctx.liveLeaves[0]
        guard var merged = ctx.body(of: first)?.objectValue else { return lastWriteWins.resolve(ctx) }
        for other in ctx.liveLeaves.dropFirst() {
            guard let theirs = ctx.body(of: other)?.objectValue else { return lastWriteWins.resolve(ctx) }
            var base: [String: JSON] = [:]
            if let ancestorID = ctx.tree.commonAncestor(first.id, other.id) {
                guard let ancestor = ctx.tree.revision(ancestorID), let body = ctx.body(of: ancestor)?.objectValue else {
                    return lastWriteWins.resolve(ctx)
                }
                base = body
            }
            merged = ThreeWayMerge.merge(base: base, ours: merged, theirs: theirs)
        }
        return .merge(.object(merged))
    }
}

/// Field-level three-way merge of JSON objects.
enum ThreeWayMerge {
    /// `ours` wins fields that both sides changed differently (it is the better-ranked side).
    static func merge(base: [String: JSON], ours: [String: JSON], theirs: [String: JSON]) -> [String: JSON] {
        var out: [String: JSON] = [:]
        for key in Set(base.keys).union(ours.keys).union(theirs.keys) {
            let b = base[key]
            let o = ours[key]
            let t = theirs[key]
            let value: JSON?
            if o == t {
                value = o
            } else if o == b {
                value = t
            } else if t == b {
                value = o
            } else if case .object(let oo)? = o, case .object(let to)? = t {
                value = .object(merge(base: b?.objectValue ?? [:], ours: oo, theirs: to))
            } else {
                value = o
            }
            if let value { out[key] = value }
        }
        return out
    }
}

/// Resolvers chosen by the winning revision's `type` member, with a default.
public struct ResolverSet: Sendable {
    public var byType: [String: ConflictResolver]
    public var fallback: ConflictResolver

    public init(fallback: ConflictResolver = .keepConflicts, byType: [String: ConflictResolver] = [:]) {
        self.fallback = fallback
        self.byType = byType
    }

    func resolver(for tree: RevisionTree) -> ConflictResolver {
        guard let body = tree.winner?.body, let type = (try? JSON.parse(body))?["type"]?.stringValue else {
            return fallback
        }
        return byType[type] ?? fallback
    }

    var isDefaultOnly: Bool { fallback.name == "default" && byType.isEmpty }
}

extension RevisionTree {
    /// The contenders of a conflict: live leaves, plus tombstone leaves that deleted a live
    /// revision, unless every live leaf descends through a tombstone (it was written after
    /// a deletion was seen, so that deletion is settled).
    func conflictContext(_ id: DocumentID) -> ConflictContext? {
        let live = revisions.filter { $0.isLeaf && !$0.deleted }.sorted(by: RevisionTree.beats)
        guard !live.isEmpty else { return nil }
        var tombstones: [Revision] = []
        for t in revisions where t.isLeaf && t.deleted {
            guard let p = t.parent, !revisions[p].deleted else { continue }
            // Tombstones written by a resolution settle a conflict; they do not contend.
            if let body = t.body, DocumentStore.isResolutionTombstone(body) { continue }
            let settled = live.allSatisfy { leaf in
                guard let ancestor = commonAncestor(leaf.id, t.id) else { return false }
                // Walk from the live leaf up to the common ancestor looking for a tombstone.
                var cursor = index(of: leaf.id)
                while let c = cursor, revisions[c].id != ancestor {
                    if revisions[c].deleted { return true }
                    cursor = revisions[c].parent
                }
                return false
            }
            if !settled { tombstones.append(t) }
        }
        guard live.count > 1 || !tombstones.isEmpty else { return nil }
        return ConflictContext(id: id, liveLeaves: live, contendingTombstones: tombstones.sorted(by: RevisionTree.beats), tree: self)
    }
}

extension ConflictContext {
    init(id: DocumentID, liveLeaves: [RevisionTree.Revision], contendingTombstones: [RevisionTree.Revision], tree: RevisionTree) {
        self.id = id
        self.tree = tree
        self.liveLeaves = liveLeaves
        self.contendingTombstones = contendingTombstones
    }
}

extension DocumentStore {
    /// Applies a resolution in one transaction. Tombstones have body `{"@resolved":true}` and merged bodies
    /// are children of the best live leaf, so the same resolution yields the same revision
    /// IDs on every peer. Returns the number of revisions written.
    /// Resolves conflicts in the given documents with `resolvers`. Returns how many had
    /// live conflicts and how many revisions the resolutions wrote.
    func resolveConflicts(in ids: Set<DocumentID>, using resolvers: ResolverSet, logger: Logger) throws(StoreError)
        -> (conflicts: Int, written: Int)
    {
        guard !ids.isEmpty else { return (0, 0) }
        var conflicts = 0
        var written = 0
        // With the default resolver nothing is written: count live conflicts from the index.
        // Otherwise only documents that may contend need their trees (deletesWin/LWW also
        // look at tombstoned branches, so they read every touched document).
        if resolvers.isDefaultOnly { return (try conflicted(among: ids).count, 0) }
        let trees = try revisionTrees(ids)
        for id in ids.sorted() {
            guard let tree = trees[id], let ctx = tree.conflictContext(id) else { continue }
            if ctx.liveLeaves.count > 1 { conflicts += 1 }
            let resolution = resolvers.resolver(for: tree).resolve(ctx)
            if resolution == .keepConflict { continue }
            do {
                written += try apply(resolution, to: ctx)
            } catch {
                // A local edit raced the resolution; the next exchange resolves again.
                guard case .conflict = error else { throw error }
                logger.debug("conflict resolution raced a local edit", metadata: ["id": "\(LogText.escape(id.rawValue))"])
            }
        }
        return (conflicts, written)
    }

    /// The body of tombstones written by conflict resolution (identical on every peer).
    static let resolutionTombstone: JSON = ["@resolved": true]
    static let resolutionTombstoneBytes = resolutionTombstone.canonicalBytes

    static func isResolutionTombstone(_ body: [UInt8]) -> Bool { body == resolutionTombstoneBytes }

    @discardableResult
    func apply(_ resolution: Resolution, to ctx: ConflictContext) throws(StoreError) -> Int {
        try write { txn in
            var written = 0
            switch resolution {
            case .keepConflict:
                break
            case .delete:
                for leaf in ctx.liveLeaves {
                    try txn.delete(ctx.id, revision: leaf.id, tombstoneBody: Self.resolutionTombstone)
                    written += 1
                }
            case .keep(let keeper):
                for leaf in ctx.liveLeaves where leaf.id != keeper {
                    try txn.delete(ctx.id, revision: leaf.id, tombstoneBody: Self.resolutionTombstone)
                    written += 1
                }
            case .merge(let body):
                let best = ctx.liveLeaves[0]
                for leaf in ctx.liveLeaves.dropFirst() {
                    try txn.delete(ctx.id, revision: leaf.id, tombstoneBody: Self.resolutionTombstone)
                    written += 1
                }
                let current = best.body.flatMap { try? JSON.parse($0) }
                if current != body {
                    try txn.put(ctx.id, body: body, parent: best.id)
                    written += 1
                }
            }
            return written
        }
    }
}

extension DocumentStore {
    /// Resolves one document's conflict now with `resolver` (an operator's choice, in the
    /// admin API or the dashboard); returns how many revisions it wrote (0: no live conflict).
    public func resolveConflict(_ id: DocumentID, with resolver: ConflictResolver, logger: Logger) throws(StoreError) -> Int {
        try resolveConflicts(in: [id], using: ResolverSet(fallback: resolver), logger: logger).written
    }
}
