import FerryCore
import FerryStore

/// A sender's word that a document is no longer readable by the receiver: the revisions the
/// receiver may have been sent of it (readable ones, with their ancestors). The receiver
/// purges its copy only when every leaf it holds is among them, so an edit of its own the
/// sender never saw is never lost to a notice.
///
/// Sent only for a document whose kept history holds a revision the receiver could read: a
/// reader is never told of a document it could never have held.
///
/// A notice naming revisions the sender may not hold (the receiver's own leaves, in an access
/// check's answer or for a refused revision) carries the sender's leaves too: the receiver
/// then purges only when it lacks one of them. A sender whose every leaf the receiver knows
/// is behind it (say, it has not yet got an admin's move back into the receiver's ward) and
/// is no judge of what the receiver holds.
public struct RemovalNotice: Sendable, Equatable {
    public let id: String
    public let revisions: [String]
    /// The sender's leaves of the document; nil when the notice names only revisions the sender holds.
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

/// Applies removal notices from one peer: a document is purged (and journaled) when every
/// leaf held here is among the notice's revisions, the peer knows a revision of it this node
/// lacks (when the notice lists the peer's leaves), and the peer's write policy admits the
/// document as held, so a notice gives the peer no power it lacks already: a peer that may
/// write a document could as well replace its content.
enum AccessRemovalApplier {
    static func apply(_ notices: [RemovalNotice], writer: PeerPolicy, store: DocumentStore) throws -> [AccessRemoval] {
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
    /// Documents held, with their leaves.
    var held: [HeldDocument]
    var json: JSON { .object(["held": .array(held.map { .array([.string($0.id), .array($0.leaves.map(JSON.string))]) })]) }
    init(held: [HeldDocument]) { self.held = held }
    init(_ o: JSON) throws(SyncError) {
        guard case .array(let a)? = o["held"] else { throw .protocolViolation("accessCheck lacks held") }
        guard a.count <= Self.maxHeld else { throw .protocolViolation("accessCheck lists more than \(Self.maxHeld) documents") }
        held = a.compactMap { v in
            guard case .array(let e) = v, e.count == 2, let id = e[0].stringValue, case .array(let leaves) = e[1] else { return nil }
            return HeldDocument(id: id, leaves: leaves.prefix(Self.maxLeaves).compactMap(\.stringValue))
        }
    }
    static let maxHeld = 1000
    static let maxLeaves = 100

    struct HeldDocument {
        var id: String
        var leaves: [String]
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
    /// The notice for a document the reader holds, or nil: when this node holds the document
    /// and the reader may not read it as it stands here. The notice names the reader's own
    /// leaves, so its copy goes whole, with any edit of its own: such an edit is one every
    /// node holding the document refuses (the reader may write nothing it may not read), and
    /// the refusal already told it the document exists.
    func removalNotice(_ id: DocumentID, held: AccessCheckRequest.HeldDocument, tree: RevisionTree) -> RemovalNotice? {
        guard !held.leaves.isEmpty, !policy.read.admitsEverything, !tree.isEmpty, !mayRead(id, tree: tree) else { return nil }
        return RemovalNotice(id: id.rawValue, revisions: held.leaves, senderLeaves: tree.leaves.map(\.id.description))
    }
}
