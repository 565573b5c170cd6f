import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging

/// This node's group: which group it belongs to (DATA/group.json), the signed member
/// entries it holds, the store validator that keeps unsigned or foreign entries out, the
/// invitations it issued, and both sides of the join exchange. Every change of the valid
/// members goes to the trust store and then to `onChange`.
public final class GroupMembership: Sendable {
    // Its roles are extensions beside it: the validator (+Validation), entry writes (+Entries),
    // invitations (+Invitations), the join exchange (+Join) and addresses (+Addresses).

    /// What the node gives the membership once its store, identity and trust store exist.
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
        var listenAddresses: @Sendable () -> [String] = { [] }
    }

    struct State {
        var group: String?
        /// Every signature-checked entry seen, by node: read from the store or accepted by the validator.
        var ledger: [String: [MemberEntry]] = [:]
        var view: MembershipView?
        /// Dial URLs learned from a code (the inviter's reachable address), preferred over entries'.
        var urlOverrides: [String: String] = [:]
        /// Each node's newest signature-checked record of where it listens now.
        var addressRecords: [String: MemberAddresses] = [:]
    }

    let file: String
    let logger: Logger
    let clock: any Clock<Duration>
    public let invitations: InvitationBook
    let attempts: JoinAttempts
    let refusals = RepeatedRefusals()
    let state: Locked<State>
    let context = Locked<Context?>(nil)
    let onChange = CallbackSlot<[String: String], Void>()
    /// Told when this node wrote a new address record (its document, every member's dial URL).
    let onAddressAnnounced = CallbackSlot<(DocumentID, [String: String]), Void>()
    func addressAnnounced(_ id: DocumentID, _ urls: [String: String]) { onAddressAnnounced((id, urls)) }
    func setOnAddressAnnounced(_ handler: @escaping @Sendable ((DocumentID, [String: String])) -> Void) { onAddressAnnounced.set(handler) }
    private let applying = Locked(())

    /// Reads DATA/group.json (absent: no group yet).
    public init(
        dataDirectory: String, clock: any Clock<Duration> = ContinuousClock(), now: @escaping @Sendable () -> Date = { Date() },
        logger: Logger
    ) throws(NodeError) {
        file = "\(dataDirectory)/group.json"
        self.logger = logger
        self.clock = clock
        invitations = InvitationBook(file: "\(dataDirectory)/invitations.json", now: now)
        attempts = JoinAttempts(clock: clock)
        var group: String?
        if let data = FileManager.default.contents(atPath: file) {
            guard let json = try? JSON.parse(Array(data)), let g = json["group"]?.stringValue, let id = NodeIDFormat.normalized(g) else {
                throw .badConfiguration("\(file) is corrupt: it must hold {\"group\": <founder node ID>}")
            }
            group = id
        }
        state = Locked(State(group: group))
    }

    public var group: String? { state.withLock { $0.group } }
    public var view: MembershipView? { state.withLock { $0.view } }

    func attach(_ context: Context) { self.context.withLock { $0 = context } }

    func setListenAddresses(_ addresses: @escaping @Sendable () -> [String]) { context.withLock { $0?.listenAddresses = addresses } }

    /// Called with the dial URLs of the active members after every change of the members.
    func setOnChange(_ handler: @escaping @Sendable ([String: String]) -> Void) { onChange.set(handler) }

    func requireContext() throws(MembershipError) -> Context {
        guard let c = context.withLock({ $0 }) else { throw .storage("the node is not started") }
        return c
    }

    // MARK: reading the store

    /// Re-reads every member document (all leaves) and address record, and applies the result.
    func loadFromStore() throws {
        try reread(try documentIDs(under: MemberEntry.documentPrefix))
        try rereadAddresses(try documentIDs(under: MemberAddresses.documentPrefix))
        apply()
    }

    /// The IDs of every document under `prefix` (one of the reserved group prefixes).
    func documentIDs(under prefix: String) throws -> [DocumentID] {
        let c = try requireContext()
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

    /// Reads the leaves of these member documents into the ledger.
    func reread(_ ids: [DocumentID]) throws {
        let c = try requireContext()
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
            for (node, list) in found {
                for e in list where !(s.ledger[node] ?? []).contains(e) { s.ledger[node, default: []].append(e) }
            }
        }
    }

    /// Recomputes the view, hands the active members to the trust store and the dial URLs to
    /// `onChange`. Serialized, so a view computed earlier never lands after a later one.
    func apply() {
        applying.withLock { _ in applyNow() }
    }

    private func applyNow() {
        guard let c = context.withLock({ $0 }) else { return }
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
        onChange(urls)
    }
}
