import FerryCore
import FerryStore

/// Judges whole documents against one principal's policy: a read by every revision it would
/// reveal, a write by what it writes and by every revision it could replace or hide. The one
/// engine behind both doors (the native protocol and the CouchDB API), so they cannot drift.
///
/// Rules:
/// - **Read.** A document is readable when the read rule admits every live leaf (or, for a
///   deleted document, its winning tombstone). A reader is never told of an unreadable
///   document: not its ID, its revisions, nor that it exists. A revision of a readable
///   document is served only when the rule admits that revision too.
/// - **Write.** A revision is admitted when the write rule admits it, every leaf the document
///   already has, and every ancestor of it that is held (by the node's own criteria; a group
///   grant judges the revision and the leaves): a writer may not turn, hide or out-rank a
///   document it could not have written.
/// - A tombstone without fields is judged by the nearest ancestor whose body is kept, so a
///   rule by `type` still sees what was deleted.
public struct DocumentAccess: Sendable {
    public let policy: PeerPolicy
    /// The body members the read rule's verdicts read, when they depend on bodies: only
    /// those are decoded (20 group rules over 1 KiB documents: a full parse per judged
    /// revision was 27 % of a pull's serving CPU).
    let readMembers: Set<String>?

    public init(_ policy: PeerPolicy) {
        self.policy = policy
        readMembers = policy.read.needsBodies ? policy.read.bodyMembers : nil
    }

    /// True when nothing is restricted: every check passes without reading a body.
    public var readsEverything: Bool { policy.read.admitsEverything }
    public var writesEverything: Bool { policy.write.admitsEverything && policy.mayDelete }

    /// Whether a rule's verdict can depend on bodies (it names types).
    public static func needsBodies(_ rule: AccessRule) -> Bool { rule.needsBodies }

    // MARK: Reading

    /// Whether the reader may learn of the document at all.
    public func mayRead(_ id: DocumentID, tree: RevisionTree) -> Bool {
        Self.admitsDocument(policy.read, id, tree: tree, members: readMembers)
    }

    /// Whether the reader may be sent this revision of the document.
    public func mayRead(_ id: DocumentID, revision: RevisionID, in tree: RevisionTree) -> Bool {
        mayRead(id, revisions: [revision], in: tree)
    }

    /// Whether the reader may be sent every one of these revisions of the document; with
    /// `documentJudged`, the caller already found the document readable (`mayRead(_:tree:)`).
    public func mayRead(_ id: DocumentID, revisions: [RevisionID], in tree: RevisionTree, documentJudged: Bool = false) -> Bool {
        let rule = policy.read
        if rule.admitsEverything { return true }
        guard documentJudged || Self.admitsDocument(rule, id, tree: tree, members: readMembers) else { return false }
        guard Self.needsBodies(rule) else { return true }  // by ID alone: already judged
        return revisions.allSatisfy { revision in
            guard let index = tree.index(of: revision) else { return false }
            // A live leaf was judged with the document (every live leaf is): no second parse.
            if tree.revisions[index].isLeaf && !tree.revisions[index].deleted { return true }
            return rule.admits(id: id, body: Self.judgedBody(at: index, in: tree, members: readMembers))
        }
    }

    /// Whether the read rule alone admits a document whose only known body is `body` (for
    /// places holding no tree; exact when the rule does not name types).
    public func mayRead(_ id: DocumentID, body: JSON?) -> Bool { policy.read.admits(id: id, body: body) }

    /// `members`: the rule's `bodyMembers`, when only those need decoding.
    static func admitsDocument(_ rule: AccessRule, _ id: DocumentID, tree: RevisionTree, members: Set<String>? = nil) -> Bool {
        if rule.admitsEverything { return true }
        guard needsBodies(rule) else { return rule.admits(id: id, body: nil) }
        var judged: [Int] = []
        for (i, r) in tree.revisions.enumerated() where r.isLeaf && !r.deleted { judged.append(i) }
        if judged.isEmpty, let w = tree.winnerIndex { judged = [w] }
        guard !judged.isEmpty else { return rule.admits(id: id, body: nil) }
        return judged.allSatisfy { rule.admits(id: id, body: judgedBody(at: $0, in: tree, members: members)) }
    }

    // MARK: Writing

    /// Why the writer may not store this revision, or nil when it may. `ancestors` is the
    /// revision's history (newest first, the parent first); `existing` the document's tree
    /// as stored, if any.
    public func writeRefusal(
        id: DocumentID, body: JSON, deleted: Bool, ancestors: [RevisionID], existing: RevisionTree?
    ) -> String? {
        if deleted && !policy.mayDelete { return "this writer may not delete documents" }
        let rule = policy.write
        if rule.admitsEverything { return nil }
        let fields = body.objectValue ?? [:]
        let held = existing.map { !$0.isEmpty } ?? false
        // A bare tombstone says nothing of what it deletes: judge it by what it replaces.
        if !(deleted && fields.isEmpty && held && Self.needsBodies(rule)) && !rule.admits(id: id, body: body) {
            return "this writer may not write \"\(id)\""
        }
        guard let tree = existing, held, Self.needsBodies(rule) else { return nil }
        for i in tree.revisions.indices where tree.revisions[i].isLeaf {
            if !rule.admits(id: id, body: Self.judgedBody(at: i, in: tree)) {
                // Names no revision: the writer may not read this one, and its ID hashes its body.
                return "\"\(id)\" is held here in a form this writer may not write"
            }
        }
        // Held ancestors are judged by the node's own criteria only: a group grant is by
        // content, and a document an admin moved (to another ward) is its new readers' to edit.
        let ancestorRule = AccessRule(idPrefixes: rule.idPrefixes, idPatterns: rule.idPatterns, types: rule.types)
        guard !ancestorRule.admitsEverything, ancestorRule.needsBodies else { return nil }
        for a in ancestors {
            guard let i = tree.index(of: a), tree.revisions[i].body != nil else { continue }
            if !ancestorRule.admits(id: id, body: Self.judgedBody(at: i, in: tree)) {
                return "\"\(id)\" descends from revision \(a), which this writer may not write"
            }
        }
        return nil
    }

    // MARK: Bodies

    /// The body a rule judges the revision at `index` by: its own, or for a tombstone without
    /// fields (or a revision whose body is not kept) the nearest ancestor's kept body.
    static func judgedBody(at index: Int, in tree: RevisionTree, members: Set<String>? = nil) -> JSON? {
        var cursor: Int? = index
        while let c = cursor {
            let r = tree.revisions[c]
            if let bytes = r.body {
                if let members {
                    // Only the named members are built; whether the tombstone holds any
                    // member at all is read from its bytes.
                    if let found = try? JSON.parseMembers(bytes, named: members), !(r.deleted && Self.isEmptyObject(bytes)) {
                        return .object(found)
                    }
                } else if let body = try? JSON.parse(bytes), !(r.deleted && (body.objectValue?.isEmpty ?? true)) {
                    return body
                }
            }
            cursor = r.parent
        }
        return nil
    }

    /// Whether `bytes` is the JSON object `{}` (whitespace allowed).
    static func isEmptyObject(_ bytes: [UInt8]) -> Bool {
        let text = bytes.filter { $0 != 0x20 && $0 != 0x09 && $0 != 0x0A && $0 != 0x0D }
        return text == [UInt8(ascii: "{"), UInt8(ascii: "}")]
    }
}

/// Document IDs no client or peer may write: Ferry's own `_ferry/` namespace, except group
/// membership entries (`_ferry/members/`), which carry an admin's signature that the store's
/// validator checks on every node.
public enum ReservedNamespace {
    public static let prefix = "_ferry/"
    /// The group's signed documents: member entries and members' address records (each
    /// checked by the node's validator).
    public static let replicatedPrefixes = ["_ferry/members/", "_ferry/addresses/", "_ferry/access/"]

    /// True when `id` is in the reserved namespace and replication may not carry it.
    public static func refusesReplicated(_ id: DocumentID) -> Bool {
        id.rawValue.hasPrefix(prefix) && !replicatedPrefixes.contains(where: { id.rawValue.hasPrefix($0) })
    }
}
