import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import ServiceLifecycle

/// This node's group: which group it belongs to (DATA/group.json), the signed member
/// entries it holds, the store validator that keeps unsigned or foreign entries out, the
/// invitations it issued, and both sides of the join exchange. Every change of the valid
/// members goes to the trust store and then to `onChange`.
public final class GroupMembership: Sendable {
    /// What a join or an invitation tells the caller.
    public struct Invitation: Sendable {
        public let code: InvitationCode
        public let expires: Date
        public let admin: Bool
        public let group: String
    }

    /// What a completed join tells the caller.
    public struct Joined: Sendable {
        public let group: String
        public let inviter: String
        public let members: Int
    }

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

    // MARK: the trust boundary

    /// The store validator's part for `_ferry/members/`: an entry must be valid for this
    /// node's group, signed by the founder or an active admin; deletions are refused. Other
    /// documents pass (nil).
    public func validate(_ proposed: ProposedRevision) -> String? {
        if let node = MemberAddresses.node(inDocument: proposed.id) { return validateAddresses(proposed, node: node) }
        guard let node = MemberEntry.node(inDocument: proposed.id) else { return nil }
        if proposed.deleted { return "membership entries are never deleted (an admin writes a removed entry instead)" }
        let entry: MemberEntry
        do { entry = try MemberEntry(parsing: proposed.body) } catch { return error.description }
        guard entry.node == node else { return "the entry names node \(entry.node.prefix(12)), not its document's \(node.prefix(12))" }
        do { try entry.verifySignature() } catch { return error.description }
        return state.withLock { s -> String? in
            guard let group = s.group else { return "this node belongs to no group, so it takes no membership entries" }
            guard entry.group == group else { return "the entry is for group \(entry.group.prefix(12)), not this node's \(group.prefix(12))" }
            if entry.node == group && entry.state == .removed { return MembershipError.cannotRemoveFounder.description }
            let view = s.view ?? MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true)
            guard view.activeAdmins.contains(entry.signer) else {
                return "signer \(entry.signer.prefix(12)) is neither the founder nor an active admin of the group"
            }
            // A verified statement by an admin: later entries it enables may count on it.
            if !(s.ledger[node] ?? []).contains(entry) {
                s.ledger[node, default: []].append(entry)
                s.view = MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true)
            }
            return nil
        }
    }

    /// The validator's part for `_ferry/addresses/`: a record signed by the member it names,
    /// for this node's group, of an active member; deletions are refused.
    func validateAddresses(_ proposed: ProposedRevision, node: String) -> String? {
        if proposed.deleted { return "address records are never deleted" }
        let record: MemberAddresses
        do { record = try MemberAddresses(parsing: proposed.body) } catch { return error.description }
        guard record.node == node else { return "the record names node \(record.node.prefix(12)), not its document's \(node.prefix(12))" }
        do { try record.verifySignature() } catch { return error.description }
        return state.withLock { s -> String? in
            guard let group = s.group else { return "this node belongs to no group, so it takes no address records" }
            guard record.group == group else { return "the record is for group \(record.group.prefix(12)), not this node's \(group.prefix(12))" }
            let view = s.view ?? MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true)
            guard view.isActiveMember(node) || node == group else { return "node \(node.prefix(12)) is not a member of the group" }
            return nil
        }
    }

    /// Reads the winning revision of address record documents and keeps each node's newest.
    func rereadAddresses(_ ids: [DocumentID]) throws {
        let c = try requireContext()
        var found: [MemberAddresses] = []
        for id in ids {
            guard let node = MemberAddresses.node(inDocument: id), let doc = try c.store.document(id), !doc.deleted,
                let record = try? MemberAddresses(parsing: doc.body), record.node == node, (try? record.verifySignature()) != nil
            else { continue }
            found.append(record)
        }
        state.withLock { s in
            for r in found where (s.addressRecords[r.node]?.version ?? 0) < r.version { s.addressRecords[r.node] = r }
        }
    }

    /// Writes a record of where this node listens now when that differs from what its peers
    /// know (its newest record, else its entry): so a member restarted on another port is
    /// dialled there. Nothing for a node outside a group or not yet bound.
    func announceOwnAddresses() throws {
        let c = try requireContext()
        let me = c.identity.nodeID
        let current = c.listenAddresses()
        guard !current.isEmpty, let group = self.group, let view = self.view, view.isActiveMember(me) else { return }
        let (known, previous) = state.withLock { s in (s.addressRecords[me]?.addresses ?? view.selected[me]?.addresses, s.addressRecords[me]?.version ?? 0) }
        guard known != current else { return }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let record = try MemberAddresses.signed(group: group, addresses: current, version: max(now, previous + 1), by: c.identity)
        let id = MemberAddresses.documentID(me)
        try c.store.put(id, body: record.body, parent: try c.store.document(id)?.revision)
        try rereadAddresses([id])
        apply()
        logger.notice("this node listens somewhere new; telling the group", metadata: ["addresses": "\(current)"])
        let (overrides, records) = state.withLock { ($0.urlOverrides, $0.addressRecords) }
        addressAnnounced(id, Self.memberURLs(view, context: c, overrides: overrides, records: records))
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

    /// The dial URL of each active member but this node. A member that moved since its
    /// entry was signed says where it is now (its address record); else a code's address
    /// (known to have worked) beats the entry's.
    static func memberURLs(
        _ view: MembershipView, context c: Context, overrides: [String: String], records: [String: MemberAddresses]
    ) -> [String: String] {
        var urls: [String: String] = [:]
        let scheme = c.insecure ? "ws" : "wss"
        for e in view.activeMembers where e.node != c.identity.nodeID {
            if let record = records[e.node], record.addresses != e.addresses, let address = record.addresses.first {
                urls[e.node] = "\(scheme)://\(address)/\(c.databaseName)/sync"
            } else if let url = overrides[e.node] {
                urls[e.node] = url
            } else if let address = e.addresses.first {
                urls[e.node] = "\(scheme)://\(address)/\(c.databaseName)/sync"
            }
        }
        return urls
    }

    // MARK: writing entries

    /// Writes an entry this node signed, as a new revision of its document, and applies it.
    func write(_ entry: MemberEntry) throws {
        let c = try requireContext()
        let id = MemberEntry.documentID(entry.node)
        let parent = try c.store.document(id)?.revision
        try c.store.put(id, body: entry.body, parent: parent)
        try reread([id])
        apply()
    }

    /// The next version for a node's entry: one past every version seen for it.
    func nextVersion(_ node: String) -> Int64 {
        state.withLock { ($0.ledger[node] ?? []).map(\.version).max() ?? 0 } + 1
    }

    func saveGroupFile(_ group: String, inviter: String?) throws(MembershipError) {
        var o: [String: JSON] = ["group": .string(group)]
        if let inviter { o["joinedThrough"] = .string(inviter) }
        do { try writeAtomically(.object(o), to: file) } catch { throw .storage("cannot write \(file): \(error)") }
    }

    /// Founds a group with this node as founder and first admin, unless it has one.
    func foundGroupIfNeeded() throws {
        let c = try requireContext()
        let me = c.identity.nodeID
        let founded = try state.withLock { s throws(MembershipError) -> Bool in
            guard s.group == nil else { return false }
            try saveGroupFile(me, inviter: nil)
            s.group = me
            return true
        }
        guard founded else { return }
        try write(
            MemberEntry.signed(
                group: me, node: me, name: c.name, state: .member, admin: true, version: 1,
                addresses: c.listenAddresses(), by: c.identity))
        logger.notice("founded a group", metadata: ["group": "\(me)"])
    }

    /// Issues an invitation (founding a group first when this node has none). Only admins
    /// invite. This node's own entry is re-signed first when its addresses changed.
    public func invite(admin: Bool, lifetime: TimeInterval, addresses: [String]?) throws -> Invitation {
        guard lifetime > 0, lifetime <= 7 * 86_400 else {
            throw MembershipError.badInvitationCode("an invitation lasts more than 0 s and at most 7 days")
        }
        for a in addresses ?? [] where InvitationCode.split(address: a) == nil {
            throw MembershipError.badInvitationCode("\"\(LogText.escape(a))\" is not a host:port address")
        }
        try foundGroupIfNeeded()
        let c = try requireContext()
        let me = c.identity.nodeID
        guard let view = self.view, let group = self.group, view.isAdmin(me), view.isActiveMember(me) || me == group else {
            throw MembershipError.notAdmin
        }
        let current = c.listenAddresses()
        if let mine = view.selected[me], !current.isEmpty, mine.addresses != current {
            try write(
                MemberEntry.signed(
                    group: group, node: me, name: mine.name, state: .member, admin: mine.admin, version: nextVersion(me),
                    addresses: current, by: c.identity))
        }
        let list = addresses ?? current
        guard !list.isEmpty else { throw MembershipError.storage("the listener is not bound yet; try again") }
        let (secret, expires) = try invitations.issue(admin: admin, lifetime: lifetime)
        logger.notice("issued an invitation", metadata: ["admin": "\(admin)", "expires": "\(expires)"])
        return Invitation(code: InvitationCode(inviter: me, secret: secret, addresses: list), expires: expires, admin: admin, group: group)
    }

    /// Removes a member by ID, unique ID prefix (8+ digits) or unique name: signs a removed
    /// entry one version up. Only admins remove; the founder cannot be removed.
    public func remove(_ who: String) throws -> MemberEntry {
        let c = try requireContext()
        guard let view = self.view, let group = self.group else { throw MembershipError.noGroup }
        guard view.isAdmin(c.identity.nodeID) else { throw MembershipError.notAdmin }
        let target = try resolve(who, in: view)
        if target == group { throw MembershipError.cannotRemoveFounder }
        let current = view.selected[target]!
        if current.state == .removed { return current }
        let entry = try MemberEntry.signed(
            group: group, node: target, name: current.name, state: .removed, admin: false, version: nextVersion(target),
            addresses: current.addresses, by: c.identity)
        try write(entry)
        logger.notice("removed a member", metadata: ["node": "\(target)"])
        return entry
    }

    func resolve(_ who: String, in view: MembershipView) throws(MembershipError) -> String {
        let lower = who.lowercased()
        if view.selected[lower] != nil { return lower }
        let byName = view.selected.values.filter { $0.name == who }.map(\.node)
        if byName.count == 1 { return byName[0] }
        if byName.count > 1 { throw .unknownMember("\"\(LogText.escape(who))\" (several members have that name: give the ID)") }
        if lower.count >= 8 {
            let byPrefix = view.selected.keys.filter { $0.hasPrefix(lower) }
            if byPrefix.count == 1 { return byPrefix[0] }
        }
        throw .unknownMember("\"\(LogText.escape(who))\"")
    }

    // MARK: the join exchange, inviter side

    static let joinProfile = "join"
    static let joinTimeout: Duration = .seconds(15)

    /// Serves one join connection: reads the `join` request, checks the invitation, signs
    /// the new member's entry and answers with the group and its valid entries.
    /// The next message on `endpoint`, or nil when it ends or `joinTimeout` passes first.
    func firstMessage(from endpoint: any MessageEndpoint) async throws -> [UInt8]? {
        let clock = self.clock
        return try await Race.first(
            { () async throws -> [UInt8]? in
                var it = endpoint.incoming.makeAsyncIterator()
                return try await it.next()
            },
            { () async throws -> [UInt8]? in
                try await clock.sleep(for: Self.joinTimeout)
                return nil
            })
    }

    func serveJoin(_ endpoint: any MessageEndpoint, peer: String, remote: String?) async {
        let keys = [peer, remote ?? "?"]
        let number: UInt64
        let request: JSON
        do {
            let first = try await firstMessage(from: endpoint)
            guard let bytes = first else { return }
            let message = try Message(decoding: bytes)
            guard message.kind == .request, message.profile == Self.joinProfile else {
                try? await endpoint.send(
                    Message.errorReply(to: message.number, SyncError(.badRequest, message: "this path only takes a join request", isTransient: false))
                        .encoded())
                return
            }
            number = message.number
            request = try message.json()
        } catch {
            logger.info("join connection failed", metadata: ["peer": "\(peer)", "error": "\(LogText.escape(describing: error))"])
            return
        }
        let reply: Message
        do {
            if attempts.isLimited(keys) { throw MembershipError.rateLimited }
            let body = try acceptJoin(request, peer: peer)
            reply = Message(kind: .response, number: number, properties: [("Profile", Self.joinProfile)], body: body.canonicalBytes)
            logger.notice("a node joined the group", metadata: ["node": "\(peer)", "remote": "\(remote ?? "?")"])
        } catch {
            let e = error as? MembershipError ?? .storage("\(error)")
            switch e {
            case .invitationUnknown, .invitationUsed, .invitationExpired, .badInvitationCode: attempts.failed(keys)
            default: break
            }
            let level: Logger.Level = refusals.isNews("\(peer) \(e.code)") ? .warning : .debug
            logger.log(level: level, "refused a join", metadata: ["peer": "\(peer)", "remote": "\(remote ?? "?")", "reason": "\(e.code)"])
            reply = Message.errorReply(to: number, SyncError.from(e))
        }
        try? await endpoint.send(reply.encoded())
    }

    /// Checks a join request and admits the peer; returns the reply body.
    func acceptJoin(_ request: JSON, peer: String) throws -> JSON {
        let c = try requireContext()
        guard let secretText = request["secret"]?.stringValue, let secret = Base64URL.decode(secretText), secret.count == 16 else {
            throw MembershipError.badInvitationCode("the request carries no 16-byte secret")
        }
        guard let view = self.view, let group = self.group, view.isAdmin(c.identity.nodeID) else { throw MembershipError.notAdmin }
        if let database = request["database"]?.stringValue, database != c.databaseName {
            throw MembershipError.wrongGroup(
                "the joining node replicates database \"\(LogText.escape(database))\", this group \"\(c.databaseName)\" (use the same --group)")
        }
        var addresses: [String] = []
        if case .array(let list)? = request["addresses"] {
            addresses = list.compactMap(\.stringValue).filter { InvitationCode.split(address: $0) != nil }.prefix(16).map { $0 }
        }
        var name = request["name"]?.stringValue
        if let n = name, (try? NodeName.validate(n)) == nil || n.count > 64 { name = nil }
        let invitation = try invitations.redeem(secret)
        let entry = try MemberEntry.signed(
            group: group, node: peer, name: name, state: .member, admin: invitation.admin, version: nextVersion(peer),
            addresses: addresses, by: c.identity)
        try write(entry)
        return .object([
            "group": .string(group), "database": .string(c.databaseName), "revisions": .array(try validRevisions()),
        ])
    }

    /// Every leaf revision of a member document whose entry counts, with its history: what a
    /// new member stores before it first replicates.
    func validRevisions() throws -> [JSON] {
        let c = try requireContext()
        guard let view = self.view else { return [] }
        var out: [JSON] = []
        for node in view.selected.keys.sorted() {
            let id = MemberEntry.documentID(node)
            guard let tree = try c.store.revisionTree(id) else { continue }
            for leaf in tree.leaves where !leaf.deleted {
                guard let doc = try? c.store.document(id, revision: leaf.id), let e = try? MemberEntry(parsing: doc.body), view.counts(e)
                else { continue }
                out.append([
                    "id": .string(id.rawValue), "rev": .string(leaf.id.description),
                    "history": .array(tree.history(of: leaf.id).dropFirst().map { .string($0.description) }), "body": doc.body,
                ])
            }
        }
        return out
    }

    // MARK: the join exchange, new member side

    /// Joins the group of the code's inviter: dials it (pinned to the inviter's ID), sends
    /// the secret, checks the reply, then stores the group and its entries.
    public func join(code text: String, name: String?) async throws -> Joined {
        let code = try InvitationCode(parsing: text)
        let c = try requireContext()
        let me = c.identity.nodeID
        if code.inviter == me { throw MembershipError.badInvitationCode("this node issued it; run `ferry join` on the new node") }
        if let group = self.group, !(view?.isActiveMember(code.inviter) ?? false) { throw MembershipError.alreadyInGroup(group) }
        let request: JSON = [
            "secret": .string(Base64URL.encode(code.secret)), "database": .string(c.databaseName),
            "addresses": .array(c.listenAddresses().map(JSON.string)), "name": name.map(JSON.string) ?? .null,
        ]
        var failures: [String] = []
        for address in code.addresses {
            let reply: Message
            do {
                reply = try await exchange(request, at: address, inviter: code.inviter, identity: c.identity)
            } catch let e as MembershipError {
                throw e
            } catch {
                failures.append("\(address): \(error)")
                continue
            }
            if reply.kind == .error {
                let carried = reply.carriedError
                throw Self.joinError(code: carried.code, message: carried.message)
            }
            return try finishJoin(reply, inviter: code.inviter, address: address, context: c)
        }
        throw MembershipError.inviterUnreachable(failures.joined(separator: "; "))
    }

    /// One join request and its reply over a fresh pinned connection.
    func exchange(_ request: JSON, at address: String, inviter: String, identity: NodeIdentity) async throws -> Message {
        var connector = try WebSocketConnector(url: "wss://\(address)\(WebSocketListener.joinPath)", serverTrust: .pinned([inviter]), identity: identity)
        connector.logger = logger
        connector.pingInterval = nil
        connector.connectTimeout = .seconds(5)
        let endpoint: any MessageEndpoint
        do { endpoint = try await connector.connect() } catch let e as TransportError {
            switch e.kind {
            case .notTrustedByPeer:
                throw MembershipError.noOpenInvitation
            case .untrustedPeer:
                throw MembershipError.inviterUnreachable("\(address) is not the inviter (its certificate is not the code's node ID)")
            default:
                throw e
            }
        }
        do {
            try await endpoint.send(Message(kind: .request, number: 1, properties: [("Profile", Self.joinProfile)], body: request.canonicalBytes).encoded())
            let answer = try await firstMessage(from: endpoint)
            await endpoint.close(error: nil)
            guard let answer else { throw MembershipError.inviterUnreachable("\(address) did not answer the join request") }
            return try Message(decoding: answer)
        } catch {
            await endpoint.close(error: nil)
            throw error
        }
    }

    /// The membership error an inviter's error reply names (its code on the wire).
    static func joinError(code: String, message: String) -> MembershipError {
        let named: [MembershipError] = [.invitationExpired, .invitationUsed, .invitationUnknown, .rateLimited, .notAdmin, .wrongGroup(message)]
        switch named.first(where: { $0.code == code }) {
        case .notAdmin?: return .badReply("the inviter is no longer an admin of its group")
        case let error?: return error
        case nil: return .badReply("\(code): \(message)")
        }
    }

    /// Checks the inviter's reply, stores group.json and the entries, and applies them.
    func finishJoin(_ reply: Message, inviter: String, address: String, context c: Context) throws -> Joined {
        let me = c.identity.nodeID
        let body = try reply.json()
        guard let group = body["group"]?.stringValue.flatMap(NodeIDFormat.normalized) else { throw MembershipError.badReply("no group ID") }
        guard body["database"]?.stringValue == c.databaseName else {
            throw MembershipError.wrongGroup("the inviter replicates database \"\(LogText.escape(body["database"]?.stringValue ?? "?"))\", this node \"\(c.databaseName)\"")
        }
        if let mine = self.group, mine != group { throw MembershipError.alreadyInGroup(mine) }
        var revisions: [(IncomingRevision, MemberEntry)] = []
        for item in body["revisions"]?.arrayItems ?? [] {
            guard let idText = item["id"]?.stringValue, let id = try? DocumentID(idText, allowReserved: true),
                let rev = item["rev"]?.stringValue.flatMap({ try? RevisionID($0) }), let entryBody = item["body"],
                let entry = try? MemberEntry(parsing: entryBody), MemberEntry.node(inDocument: id) == entry.node
            else { throw MembershipError.badReply("a revision is malformed") }
            let history = (item["history"]?.arrayItems ?? []).compactMap { $0.stringValue.flatMap { try? RevisionID($0) } }
            revisions.append((IncomingRevision(id: id, revision: rev, history: history, deleted: false, body: entryBody), entry))
        }
        let view = MembershipView(group: group, entries: revisions.map(\.1))
        guard view.isAdmin(inviter) else { throw MembershipError.badReply("the entries do not make the inviter an admin of group \(group.prefix(12))") }
        guard view.isActiveMember(me) else { throw MembershipError.badReply("the entries do not make this node a member") }
        try saveGroupFile(group, inviter: inviter)
        let scheme = c.insecure ? "ws" : "wss"
        state.withLock { s in
            s.group = group
            s.urlOverrides[inviter] = "\(scheme)://\(address)/\(c.databaseName)/sync"
        }
        // Signers first: the store's validator admits an entry only once its signer is an admin.
        var pending = revisions.map(\.0)
        while !pending.isEmpty {
            let outcomes = try c.store.insertRevisions(pending)
            let rejected = zip(pending, outcomes).filter { if case .rejected = $0.1 { return true } else { return false } }.map(\.0)
            if rejected.count == pending.count { break }
            pending = rejected
        }
        try loadFromStore()
        logger.notice("joined a group", metadata: ["group": "\(group)", "inviter": "\(inviter)", "members": "\(view.activeMembers.count)"])
        return Joined(group: group, inviter: inviter, members: view.activeMembers.count)
    }

    // MARK: addresses

    /// The addresses this node can be reached at: the listener's interface when it is a
    /// specific one, else this host's non-loopback IPv4 addresses (loopback when it has none).
    static func listenAddresses(interface: String, port: Int) -> [String] {
        if interface != "0.0.0.0" && interface != "::" && !interface.isEmpty {
            return [interface.contains(":") ? "[\(interface)]:\(port)" : "\(interface):\(port)"]
        }
        var out: [String] = []
        var list: UnsafeMutablePointer<ifaddrs>?
        if getifaddrs(&list) == 0 {
            var cursor = list
            while let ifa = cursor {
                defer { cursor = ifa.pointee.ifa_next }
                guard let addr = ifa.pointee.ifa_addr, addr.pointee.sa_family == sa_family_t(AF_INET),
                    ifa.pointee.ifa_flags & UInt32(IFF_LOOPBACK) == 0, ifa.pointee.ifa_flags & UInt32(IFF_UP) != 0
                else { continue }
                var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
                if getnameinfo(addr, socklen_t(MemoryLayout<sockaddr_in>.size), &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0 {
                    let text = String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                    out.append("\(text):\(port)")
                }
            }
            freeifaddrs(list)
        }
        return out.isEmpty ? ["127.0.0.1:\(port)"] : out
    }
}

/// Follows the store's changes and re-applies the membership whenever a member document
/// changes (a replicated entry, a removal), so trust follows within the same second.
struct MembershipFollower: Service {
    let membership: GroupMembership
    let store: DocumentStore

    func run() async throws {
        let since = try store.lastSequence
        try? membership.loadFromStore()
        do {
            for try await change in store.liveChanges(since: since).cancelOnGracefulShutdown()
            where change.id.rawValue.hasPrefix(MemberEntry.documentPrefix) || change.id.rawValue.hasPrefix(MemberAddresses.documentPrefix) {
                do {
                    if MemberAddresses.node(inDocument: change.id) != nil {
                        try membership.rereadAddresses([change.id])
                    } else {
                        try membership.reread([change.id])
                    }
                    membership.apply()
                } catch {
                    membership.logger.error("cannot read a member entry", metadata: ["id": "\(change.id)", "error": "\(error)"])
                }
            }
        } catch is CancellationError {}
    }
}

extension JSON {
    /// The elements of an array; empty for anything else.
    var arrayItems: [JSON] {
        if case .array(let a) = self { return a }
        return []
    }
}
