import FerryCore
import FerryStore

/// A sender's word that it holds a revision of a document the receiver lacks, and that as
/// it holds the document the receiver may not read it: the revisions the receiver may hold
/// of it (readable ones with their ancestors, or the receiver's own leaves). Names no revision
/// the receiver may not read: revision IDs hash bodies, so one would confirm a guessed body.
///
/// The receiver cannot verify the claim (it may not be sent the newer revision), so it takes
/// it only where the sender's right covers a purge anyway (`AccessRemovalApplier`).
///
/// Sent only for a document whose kept history holds a revision the receiver could read, or
/// that the receiver named itself: a reader is never told of a document it could never have held.
public struct RemovalNotice: Sendable, Equatable {
    public let id: String
    public let revisions: [String]
    /// The sender's leaves, in the form older senders used (new senders never send them: they
    /// would name revisions the receiver may not read); nil otherwise.
    public let senderLeaves: [String]?

    public init(id: String, revisions: [String], senderLeaves: [String]? = nil) {
        self.id = id
        self.revisions = revisions
        self.senderLeaves = senderLeaves
    }

    var json: JSON {
        var a: [JSON] = [.string(id), .array(revisions.map(JSON.string))]
        if let senderLeaves { a.append(.array(senderLeaves.map(JSON.string))) }
        return .array(a)
    }

    init?(_ v: JSON) {
        guard case .array(let a) = v, a.count == 2 || a.count == 3, let id = a[0].stringValue, case .array(let revs) = a[1] else { return nil }
        var leaves: [String]?
        if a.count == 3 {
            guard case .array(let l) = a[2] else { return nil }
            leaves = l.compactMap(\.stringValue).filter { (try? RevisionID($0)) != nil }
            guard leaves?.isEmpty == false else { return nil }
        }
        self.init(id: id, revisions: revs.compactMap(\.stringValue).filter { (try? RevisionID($0)) != nil }, senderLeaves: leaves)
    }

    static func encode(_ notices: [RemovalNotice], into o: inout [String: JSON]) {
        if !notices.isEmpty { o["removed"] = .array(notices.map(\.json)) }
    }

    static func decode(_ o: JSON) -> [RemovalNotice] {
        guard case .array(let a)? = o["removed"] else { return [] }
        return a.prefix(maxPerMessage).compactMap(RemovalNotice.init)
    }

    /// The most notices one message carries (more are dropped: the notice is advisory).
    static let maxPerMessage = 10_000
}

extension DocumentAccess {
    /// The notice to send a reader that may not read the document now, or nil when it never
    /// could have read a revision this node keeps a body of (or may read it now).
    public func removalNotice(_ id: DocumentID, tree: RevisionTree) -> RemovalNotice? {
        let rule = policy.read
        guard !rule.admitsEverything, rule.needsBodies, !mayRead(id, tree: tree) else { return nil }
        var known = Set<Int>()
        for (i, r) in tree.revisions.enumerated() where r.body != nil && !known.contains(i) {
            guard rule.admits(id: id, body: Self.judgedBody(at: i, in: tree)) else { continue }
            var cursor: Int? = i
            while let c = cursor, known.insert(c).inserted { cursor = tree.revisions[c].parent }
        }
        guard !known.isEmpty else { return nil }
        return RemovalNotice(id: id.rawValue, revisions: known.sorted().map { tree.revisions[$0].id.description })
    }
}

/// Applies removal notices from one peer. A notice is a purge on another node's word, so it
/// counts only where the receiver's own checks leave the sender nothing to gain:
/// - this node's own roles do not let it read everything (a node that may hold every
///   document has nothing a peer could rightly tell it to drop);
/// - the peer may delete documents here, and its write policy admits the document as held
///   (it could replace this copy by a tombstone that every node would keep; a purge is less);
/// - every leaf held here is among the notice's revisions (an edit the sender never saw is
///   never lost to a notice);
/// - for a notice in the older form that lists the sender's leaves, one of them is unknown here.
/// What the sender claims beyond that (a newer revision this node may not read) is taken on
/// that right alone: the receiver cannot verify a revision it may not be sent.
enum AccessRemovalApplier {
    static func apply(_ notices: [RemovalNotice], writer: PeerPolicy, own: AccessRule, store: DocumentStore) throws -> [AccessRemoval] {
        guard !own.admitsEverything, writer.mayDelete else { return [] }
        var revisions: [DocumentID: Set<String>] = [:]
        var senderLeaves: [DocumentID: [String]] = [:]
        for n in notices {
            guard let id = try? DocumentID(n.id), !n.revisions.isEmpty else { continue }
            revisions[id, default: []].formUnion(n.revisions)
            if let leaves = n.senderLeaves { senderLeaves[id, default: []] += leaves }
        }
        guard !revisions.isEmpty else { return [] }
        let rule = writer.write
        let reason = "no longer readable by this node (told by its peer)"
        return try store.purgeForAccess(Array(revisions.keys), reason: reason, refusingReturn: true) { id, tree in
            guard let known = revisions[id], !tree.isEmpty else { return false }
            guard tree.leaves.allSatisfy({ known.contains($0.id.description) }) else { return false }
            if let leaves = senderLeaves[id] {
                // A peer all of whose leaves this node knows is behind it here: no judge.
                let newer = leaves.contains { text in (try? RevisionID(text)).map { tree.revision($0) == nil } ?? false }
                guard newer else { return false }
            }
            return DocumentAccess.admitsDocument(rule, id, tree: tree)
        }
    }

    /// Whether a peer with this policy could have a notice of this node's count at all: what
    /// an access check or a refused copy's notice is asked of, or told to.
    static func mayTell(writer: PeerPolicy, own: AccessRule) -> Bool { !own.admitsEverything && writer.mayDelete }
}

/// Tells the responder that documents it may have are no longer readable by it (sent by a
/// pusher whose hello and reply both list `accessRemoval`); the reply is an empty object.
struct AccessRemovedRequest: SyncRequestBody {
    typealias Reply = Acknowledgement
    static let profile = SyncProtocol.Profile.accessRemoved
    var removed: [RemovalNotice]
    var json: JSON {
        var o: [String: JSON] = [:]
        RemovalNotice.encode(removed, into: &o)
        return .object(o)
    }
    init(removed: [RemovalNotice]) { self.removed = removed }
    init(_ o: JSON) throws(SyncError) {
        guard o.objectValue != nil else { throw .protocolViolation("accessRemoved is not an object") }
        removed = RemovalNotice.decode(o)
    }
}

/// Asks the responder which of the documents this side holds it may no longer read (sent by
/// a restricted puller once per session, before its changes feed, when both hellos list
/// `accessRemoval`): notices in the changes feed reach a reader only while the sender keeps
/// a revision body it could read; this finds what changed beyond that while it was away.
struct AccessCheckRequest: SyncRequestBody {
    typealias Reply = AccessCheckReply
    static let profile = SyncProtocol.Profile.accessCheck
    /// Documents held, with their leaves and each leaf's kept ancestors.
    var held: [HeldDocument]
    var json: JSON {
        .object([
            "held": .array(
                held.map { h in
                    var e: [JSON] = [.string(h.id), .array(h.leaves.map(JSON.string))]
                    if !h.histories.isEmpty { e.append(.array(h.histories.map { .array($0.map(JSON.string)) })) }
                    return .array(e)
                })
        ])
    }
    init(held: [HeldDocument]) { self.held = held }
    init(_ o: JSON) throws(SyncError) {
        guard case .array(let a)? = o["held"] else { throw .protocolViolation("accessCheck lacks held") }
        guard a.count <= Self.maxHeld else { throw .protocolViolation("accessCheck lists more than \(Self.maxHeld) documents") }
        held = a.compactMap { v in
            guard case .array(let e) = v, e.count == 2 || e.count == 3, let id = e[0].stringValue, case .array(let leaves) = e[1] else { return nil }
            var histories: [[String]] = []
            if e.count == 3 {
                guard case .array(let listed) = e[2], listed.count <= leaves.count else { return nil }
                for h in listed {
                    guard case .array(let chain) = h else { return nil }
                    histories.append(chain.prefix(Self.maxHistory).compactMap(\.stringValue))
                }
            }
            return HeldDocument(id: id, leaves: leaves.prefix(Self.maxLeaves).compactMap(\.stringValue), histories: histories)
        }
    }
    static let maxHeld = 1000
    static let maxLeaves = 100
    /// Ancestors listed per leaf (a tree is pruned to far fewer by default).
    static let maxHistory = 1000

    struct HeldDocument {
        var id: String
        var leaves: [String]
        /// Each leaf's kept ancestors, newest first (parallel to `leaves`; may be shorter, or
        /// empty when not told), so the responder can tell whether it holds a revision the
        /// requester lacks.
        var histories: [[String]] = []

        /// Every leaf of the document as `tree` holds it, with its ancestors.
        init(id: DocumentID, tree: RevisionTree) {
            self.id = id.rawValue
            let leafIndices = tree.revisions.indices.filter { tree.revisions[$0].isLeaf }
            leaves = leafIndices.prefix(AccessCheckRequest.maxLeaves).map { tree.revisions[$0].id.description }
            histories = leafIndices.prefix(AccessCheckRequest.maxLeaves).map { i in
                var chain: [String] = []
                var cursor = tree.revisions[i].parent
                while let c = cursor, chain.count < AccessCheckRequest.maxHistory {
                    chain.append(tree.revisions[c].id.description)
                    cursor = tree.revisions[c].parent
                }
                return chain
            }
        }

        init(id: String, leaves: [String], histories: [[String]] = []) {
            self.id = id
            self.leaves = leaves
            self.histories = histories
        }
    }
}

/// The documents of an access check that the requester may no longer read.
struct AccessCheckReply: SyncJSONReply {
    var removed: [RemovalNotice]
    var json: JSON {
        var o: [String: JSON] = [:]
        RemovalNotice.encode(removed, into: &o)
        return .object(o)
    }
    init(removed: [RemovalNotice]) { self.removed = removed }
    init(_ o: JSON) throws(SyncError) { removed = RemovalNotice.decode(o) }
}

extension DocumentAccess {
    /// The notice for a document the reader holds, or nil: when this node holds a revision of
    /// it the reader lacks (`holdsRevisionBeyond`) and the reader may not read the document as
    /// it stands here. The notice names the reader's own leaves, so its copy goes whole, with
    /// any edit of its own: such an edit is one every node holding the document refuses (the
    /// reader may write nothing it may not read), and the refusal already told it the
    /// document exists. It names none of this node's revisions.
    func removalNotice(_ id: DocumentID, held: AccessCheckRequest.HeldDocument, tree: RevisionTree) -> RemovalNotice? {
        guard !held.leaves.isEmpty, !policy.read.admitsEverything, !tree.isEmpty, !mayRead(id, tree: tree) else { return nil }
        let leaves = held.leaves.compactMap { try? RevisionID($0) }
        guard leaves.count == held.leaves.count else { return nil }
        let histories = held.histories.map { $0.compactMap { try? RevisionID($0) } }
        guard Self.holdsRevisionBeyond(leaves, histories: histories, in: tree) else { return nil }
        return RemovalNotice(id: id.rawValue, revisions: held.leaves)
    }

    /// Whether `tree` holds a revision that a node whose leaves are `theirs` surely lacks: a
    /// leaf here that is none of theirs nor an ancestor of one. `histories[i]` lists the
    /// kept ancestors of `theirs[i]`, newest first (missing: none told). Of a leaf of theirs
    /// whose history touches nothing held here, the ancestors below what was listed are
    /// unknown (pruned, or not told), so a leaf here lower in generation than all of that
    /// leaf's listed history might be one of them, and does not count. A node this one is
    /// behind (it has not yet got a move back into the reader's ward, say) is so no judge.
    static func holdsRevisionBeyond(_ theirs: [RevisionID], histories: [[RevisionID]] = [], in tree: RevisionTree) -> Bool {
        var known = Set<Int>()
        var listed = Set<RevisionID>()
        var floor = 0
        for (n, leaf) in theirs.enumerated() {
            let chain = [leaf] + (n < histories.count ? histories[n] : [])
            listed.formUnion(chain)
            var touches = false
            for r in chain {
                guard var cursor = tree.index(of: r) else { continue }
                touches = true
                while known.insert(cursor).inserted, let p = tree.revisions[cursor].parent { cursor = p }
            }
            if !touches { floor = max(floor, chain.map(\.generation).min() ?? 0) }
        }
        return tree.revisions.indices.contains { i in
            let r = tree.revisions[i]
            return r.isLeaf && !known.contains(i) && !listed.contains(r.id) && r.id.generation >= floor
        }
    }
}
