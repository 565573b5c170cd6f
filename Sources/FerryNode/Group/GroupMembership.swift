import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging

/// This node's group: which group it belongs to (DATA/group.json), the signed member
/// entries it holds (its `MembershipLedger`, which also validates them for the store), the
/// invitations it issued, and both sides of the join exchange. Every change of the valid
/// members goes to the trust store and then to `events()`, which the peer manager follows.
public final class GroupMembership: Sendable {
    // Its roles are extensions beside it: the validator (+Validation), entry writes (+Entries),
    // invitations (+Invitations), the join exchange (+Join) and addresses (+Addresses).

    /// What the membership works with: the node's store, identity and trust store, and where its listener listens.
    struct Context: Sendable {
        let store: DocumentStore
        let identity: NodeIdentity
        let trust: TrustStore
        /// The database name replication URLs use (`/<name>/sync`).
        let databaseName: String
        /// This node's name, written into its own entry.
        let name: String
        let insecure: Bool
        /// Where this node's listener can be reached, as `host:port` (empty before it is bound).
        let listenAddresses: @Sendable () -> [String]
    }

    /// The group and the signature-checked entries, shared with the store's validator.
    let ledger: MembershipLedger
    var state: Locked<MembershipLedger.State> { ledger.state }
    var file: String { ledger.file }
    let context: Context
    let logger: Logger
    let clock: any Clock<Duration>
    public let invitations: InvitationBook
    let attempts: JoinAttempts
    let refusals = RepeatedRefusals()
    private let changes = Broadcaster<MembershipEvent>()
    /// Tells followers this node wrote a new address record (its document, every member's dial URL).
    func addressAnnounced(_ id: DocumentID, _ urls: [String: String]) { changes.send(.addressAnnounced(id, urls)) }
    private let applying = Locked(())

    /// The membership of a node whose store, identity and trust store exist; `ledger` is the
    /// one the store validates with. Reads nothing yet (`loadFromStore`).
    init(
        ledger: MembershipLedger, context: Context, clock: any Clock<Duration> = ContinuousClock(),
        now: @escaping @Sendable () -> Date = { Date() }, logger: Logger
    ) {
        self.ledger = ledger
        self.context = context
        self.logger = logger
        self.clock = clock
        invitations = InvitationBook(file: "\(ledger.directory)/invitations.json", now: now)
        attempts = JoinAttempts(clock: clock)
    }

    public var group: String? { state.withLock { $0.group } }
    public var view: MembershipView? { state.withLock { $0.view } }

    /// Every change from now on: the active members' dial URLs after any change of the
    /// members, and each new address record of this node.
    public func events() -> AsyncStream<MembershipEvent> { changes.subscribe() }

    // MARK: reading the store

    /// Re-reads every member document (all leaves) and address record, and applies the result.
    func loadFromStore() throws {
        try reread(try documentIDs(under: MemberEntry.documentPrefix))
        try rereadAddresses(try documentIDs(under: MemberAddresses.documentPrefix))
        apply()
    }

    /// The IDs of every document under `prefix` (one of the reserved group prefixes).
    func documentIDs(under prefix: String) throws -> [DocumentID] {
        let c = context
        var ids: [DocumentID] = []
        // Just before the prefix in ID order: the prefix without its trailing slash.
        var after: DocumentID? = try DocumentID(String(prefix.dropLast()), allowReserved: true)
        while true {
            let page = try c.store.allDocuments(after: after, limit: 500)
            let mine = page.prefix { $0.id.rawValue.hasPrefix(prefix) }
            ids += mine.map(\.id)
            guard mine.count == page.count, let last = page.last else { break }
            after = last.id
        }
        return ids
    }

    /// Reads the leaves of these member documents into the ledger (which keeps what it knew:
    /// an entry a tree no longer holds still counts when it is the highest).
    func reread(_ ids: [DocumentID]) throws {
        let c = context
        var found: [String: [MemberEntry]] = [:]
        for id in ids {
            guard let node = MemberEntry.node(inDocument: id), let tree = try c.store.revisionTree(id) else { continue }
            for leaf in tree.leaves where !leaf.deleted {
                guard let doc = try? c.store.document(id, revision: leaf.id), let e = try? MemberEntry(parsing: doc.body),
                    e.node == node, (try? e.verifySignature()) != nil
                else { continue }
                found[node, default: []].append(e)
            }
        }
        state.withLock { s in
            guard let group = s.group else { return }
            var changed = false
            for e in found.values.joined() where e.group == group { changed = s.remember(e) || changed }
            _ = ledger.persist(s, changed: changed)
        }
    }

    /// Recomputes the view, hands the active members to the trust store and the dial URLs to
    /// `events()`. Serialized, so a view computed earlier never lands after a later one.
    func apply() {
        applying.withLock { _ in applyNow() }
    }

    private func applyNow() {
        let c = context
        let (view, overrides, records) = state.withLock { s -> (MembershipView?, [String: String], [String: MemberAddresses]) in
            guard let group = s.group else { return (nil, [:], [:]) }
            s.view = MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true)
            return (s.view, s.urlOverrides, s.addressRecords)
        }
        guard let view else { return }
        let me = c.identity.nodeID
        var members: [String: String?] = [:]
        for e in view.activeMembers where e.node != me { members[e.node] = e.name }
        let urls = Self.memberURLs(view, context: c, overrides: overrides, records: records)
        let before = Set(c.trust.groupMembers.withLock { $0.keys })
        c.trust.setGroupMembers(members)
        let after = Set(members.keys)
        if before != after {
            logger.notice(
                "group members changed",
                metadata: [
                    "group": "\(view.group)", "members": "\(view.activeMembers.count)",
                    "added": "\(after.subtracting(before).sorted().map { $0.prefix(12) })",
                    "removed": "\(before.subtracting(after).sorted().map { $0.prefix(12) })",
                ])
        }
        changes.send(.membersChanged(urls))
    }
}

/// A change of the group that the peer manager acts on.
public enum MembershipEvent: Sendable {
    /// The active members' dial URLs (by node ID), after any change of the members.
    case membersChanged([String: String])
    /// This node wrote a new address record: its document, and every member's dial URL.
    case addressAnnounced(DocumentID, [String: String])
}
