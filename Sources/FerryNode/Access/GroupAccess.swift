import Crypto
import FerryCore
import FerryStore
import FerrySync
import Logging

/// The group's access rules and role assignments as they stand: what each principal (a
/// member node by ID, a CouchDB user as `user:NAME`) may read, write and delete. Only rules
/// and assignments signed by an admin who is active now count, so every node that holds the
/// same documents reaches the same verdicts. No active rule: everyone keeps today's access.
public struct AccessSnapshot: Sendable, Equatable {
    /// Active rules by name.
    public var rules: [String: AccessRuleEntry] = [:]
    /// Roles by principal.
    public var roles: [String: [String]] = [:]

    public static let empty = AccessSnapshot()

    public var hasRules: Bool { !rules.isEmpty }

    /// Names the rules and roles in force (a digest's first 16 hex digits); "none" without rules.
    public var version: String {
        guard hasRules else { return "none" }
        var o: [String: JSON] = [:]
        for (name, r) in rules {
            var b = r.unsignedBody
            for k in ["signer", "signerCertificate", "version"] { b[k] = nil }
            o["rule/" + name] = .object(b)
        }
        for (p, r) in roles where !r.isEmpty { o["roles/" + p] = .array(r.sorted().map(JSON.string)) }
        return String(Hex.encode(SHA256.hash(data: JSON.object(o).canonicalBytes)).prefix(16))
    }

    /// Every role some active rule names.
    public var knownRoles: Set<String> { Set(rules.values.flatMap(\.roles)) }

    /// What the group grants `principal`, or nil when the group has no rules.
    public func grants(for principal: String) -> PrincipalGrants? {
        guard hasRules else { return nil }
        let mine = Set(roles[principal] ?? [])
        var g = PrincipalGrants(
            roles: (roles[principal] ?? []).sorted(), read: .nothing, write: .nothing, mayDelete: false, rules: [], version: version)
        for (name, rule) in rules.sorted(by: { $0.key < $1.key }) where !mine.isDisjoint(with: rule.roles) {
            g.rules.append(name)
            if let c = try? rule.read?.clause() { g.read.clauses.append(c) }
            if let c = try? rule.write?.clause() {
                g.write.clauses.append(c)
                if rule.delete { g.mayDelete = true }
            }
        }
        return g
    }

    /// Which rule admits the document for the principal, side by side, or why none does.
    public func explain(id: DocumentID, body: JSON?, principal: String) -> AccessExplanation {
        guard hasRules, let g = grants(for: principal) else {
            return AccessExplanation(principal: principal, roles: [], version: version, read: .init(allowed: true, by: nil, reason: "the group has no rules"),
                write: .init(allowed: true, by: nil, reason: "the group has no rules"), delete: true)
        }
        func verdict(_ pick: (AccessRuleEntry) -> AccessMatch?) -> AccessExplanation.Verdict {
            let mine = Set(g.roles)
            for (name, rule) in rules.sorted(by: { $0.key < $1.key }) where !mine.isDisjoint(with: rule.roles) {
                if let m = pick(rule), let c = try? m.clause(), c.admits(id: id, body: body) {
                    return .init(allowed: true, by: name, reason: "rule \"\(name)\" admits it for role(s) \(rule.roles.filter(mine.contains).sorted().joined(separator: ", "))")
                }
            }
            if g.roles.isEmpty { return .init(allowed: false, by: nil, reason: "\(principal) has no roles") }
            if g.rules.isEmpty { return .init(allowed: false, by: nil, reason: "no rule names any of the roles \(g.roles.joined(separator: ", "))") }
            return .init(allowed: false, by: nil, reason: "no rule of the roles \(g.roles.joined(separator: ", ")) (\(g.rules.joined(separator: ", "))) admits it")
        }
        let write = verdict(\.write)
        return AccessExplanation(principal: principal, roles: g.roles, version: version, read: verdict(\.read), write: write, delete: write.allowed && g.mayDelete)
    }

    /// Why this snapshot would leave no active admin able to read every document, or nil.
    func lockout(admins: Set<String>) -> String? {
        guard hasRules else { return nil }
        for admin in admins.sorted() {
            if let g = grants(for: admin), g.read.admitsEverything { return nil }
        }
        return "this change would leave no active admin able to read every document: give an admin a role whose rule reads everything (a rule with no ids and no selector) first"
    }
}

/// What the group's rules grant one principal.
public struct PrincipalGrants: Sendable, Equatable {
    public var roles: [String]
    public var read: AccessGrant
    public var write: AccessGrant
    public var mayDelete: Bool
    /// The names of the rules that apply.
    public var rules: [String]
    /// The version of the rules and roles these grants were made from (`AccessSnapshot.version`).
    public var version: String
}

/// An answer to "may this principal read, write, delete this document, and by which rule".
public struct AccessExplanation: Sendable, Equatable {
    public struct Verdict: Sendable, Equatable {
        public var allowed: Bool
        public var by: String?
        public var reason: String
    }
    public var principal: String
    public var roles: [String]
    public var version: String
    public var read: Verdict
    public var write: Verdict
    public var delete: Bool

    public var json: JSON {
        func v(_ x: Verdict) -> JSON {
            var o: [String: JSON] = ["allowed": .bool(x.allowed), "reason": .string(x.reason)]
            if let by = x.by { o["rule"] = .string(by) }
            return .object(o)
        }
        return .object([
            "principal": .string(principal), "roles": .array(roles.map(JSON.string)), "version": .string(version),
            "read": v(read), "write": v(write), "delete": .bool(delete),
        ])
    }
}

/// The node's copy of the group's access documents: rebuilt from the store's
/// `_ferry/access/` documents and the ledger's active admins, and asked by every door.
public final class GroupAccess: Sendable {
    /// Each access document's winning revision, when it is a well-formed signed entry: kept
    /// only to list entries that do not count (signed by someone who is no admin).
    struct Entries {
        var rules: [String: AccessRuleEntry] = [:]
        var roles: [String: RoleAssignment] = [:]
    }

    /// Remembered entries by name (rules) and principal (assignments), each signer's best.
    struct Known {
        var rules: [String: [AccessRuleEntry]] = [:]
        var roles: [String: [RoleAssignment]] = [:]
    }

    public static let documentPrefix = "_ferry/access/"

    let ledger: MembershipLedger
    public let nodeID: String
    let entries = Locked(Entries())
    let current = Locked(AccessSnapshot.empty)
    /// Each principal's grants under the current snapshot, made once (selectors parsed once):
    /// every request of every peer asks.
    private let grantCache = Locked<[String: PrincipalGrants]>([:])
    private let changes = Broadcaster<AccessSnapshot>()

    public init(ledger: MembershipLedger, nodeID: String) {
        self.ledger = ledger
        self.nodeID = nodeID
    }

    public var snapshot: AccessSnapshot { current.withLock { $0 } }
    public var version: String { snapshot.version }

    /// Each new snapshot, after it replaced the one before.
    public func snapshots() -> AsyncStream<AccessSnapshot> { changes.subscribe() }

    /// `policy` narrowed by the group's rules for `principal`.
    public func restrict(_ policy: PeerPolicy, principal: String) -> PeerPolicy {
        guard let g = grants(for: principal) else { return policy }
        return PeerPolicy(
            read: policy.read.restricted(by: g.read), write: policy.write.restricted(by: g.write), mayDelete: policy.mayDelete && g.mayDelete,
            groupRules: GroupRulesApplied(version: g.version, unnarrowed: policy.admitsEverything))
    }

    /// What the rules in force grant `principal` (nil without rules), cached per snapshot.
    public func grants(for principal: String) -> PrincipalGrants? {
        let (snapshot, cached) = current.withLock { c in (c, grantCache.withLock { $0[principal] }) }
        guard snapshot.hasRules else { return nil }
        if let cached { return cached }
        guard let made = snapshot.grants(for: principal) else { return nil }
        current.withLock { c in
            // Kept only while the snapshot it was made from is still the current one.
            if c == snapshot { grantCache.withLock { $0[principal] = made } }
        }
        return made
    }

    /// What this node itself may hold (read) and write; nil without rules.
    public var own: PrincipalGrants? { grants(for: nodeID) }

    /// Re-reads every access document from the store.
    public func load(from store: DocumentStore) throws {
        let ids = try Self.documentIDs(in: store)
        entries.withLock { $0 = Entries() }
        try reread(ids, from: store)
    }

    /// Re-reads these access documents: every live leaf signed by an admin active now goes
    /// into the ledger's memory (which keeps what it knew, so a tree that went back to an old
    /// body changes nothing), and each document's winning revision is kept for listing (a
    /// signature that does not verify, or a deleted document, leaves it out).
    public func reread(_ ids: [DocumentID], from store: DocumentStore) throws {
        for id in ids {
            guard let tree = try store.revisionTree(id) else {
                entries.withLock { e in
                    if let name = AccessRuleEntry.name(inDocument: id) { e.rules[name] = nil }
                    if let p = RoleAssignment.principal(inDocument: id) { e.roles[p] = nil }
                }
                continue
            }
            let winner = tree.revisions[tree.winnerIndex!].id
            for leaf in tree.leaves where !leaf.deleted {
                guard let doc = try? store.document(id, revision: leaf.id) else { continue }
                if let name = AccessRuleEntry.name(inDocument: id) {
                    let r = try? AccessRuleEntry(parsing: doc.body)
                    let valid = r.flatMap { r in r.name == name && (try? r.verifySignature()) != nil ? r : nil }
                    if let valid { ledger.rememberStored(rule: valid) }
                    if leaf.id == winner { entries.withLock { $0.rules[name] = valid } }
                } else if let p = RoleAssignment.principal(inDocument: id) {
                    let a = try? RoleAssignment(parsing: doc.body)
                    let valid = a.flatMap { a in a.principal == p && (try? a.verifySignature()) != nil ? a : nil }
                    if let valid { ledger.rememberStored(roles: valid) }
                    if leaf.id == winner { entries.withLock { $0.roles[p] = valid } }
                }
            }
            if tree.revisions[tree.winnerIndex!].deleted {
                entries.withLock { e in
                    if let name = AccessRuleEntry.name(inDocument: id) { e.rules[name] = nil }
                    if let p = RoleAssignment.principal(inDocument: id) { e.roles[p] = nil }
                }
            }
        }
    }

    /// Recomputes the snapshot from the entries and the admins active now; returns it when it
    /// changed (and tells `snapshots()`), nil otherwise.
    @discardableResult
    public func recompute() -> AccessSnapshot? {
        let group = ledger.group
        let admins = ledger.activeAdmins()
        let removed = ledger.removedMembers()
        let next = Self.snapshot(known, group: group, admins: admins, removed: removed)
        let changed = current.withLock { c -> Bool in
            guard c != next else { return false }
            c = next
            grantCache.withLock { $0.removeAll() }
            return true
        }
        guard changed else { return nil }
        changes.send(next)
        return next
    }

    /// Every access entry the ledger remembers (each signer's best per name).
    var known: Known {
        let (rules, roles) = ledger.knownAccess()
        return Known(rules: rules, roles: roles)
    }

    /// The rules and roles in force: for each name, of the entries signed by an admin active
    /// now for this group, the one with the highest version (a removal, then the greater
    /// signature, at equal versions), whatever any revision tree says; an active rule counts,
    /// and so do the roles of an assignment that grants some, but a node removed from the
    /// group keeps no role.
    static func snapshot(_ k: Known, group: String?, admins: Set<String>, removed: Set<String> = []) -> AccessSnapshot {
        guard let group else { return .empty }
        var s = AccessSnapshot()
        for (name, list) in k.rules {
            let counting = bestEntry(list.filter { $0.group == group && admins.contains($0.signer) }) { $0.supersedes($1) }
            if let r = counting, r.state == .active { s.rules[name] = r }
        }
        for (p, list) in k.roles where !removed.contains(p) {
            let counting = bestEntry(list.filter { $0.group == group && admins.contains($0.signer) }) { $0.supersedes($1) }
            if let a = counting, !a.roles.isEmpty { s.roles[p] = a.roles }
        }
        return s
    }

    /// What the snapshot would be with these entries changed (for checks before signing).
    func proposed(rule: AccessRuleEntry? = nil, roles: RoleAssignment? = nil) -> AccessSnapshot {
        var k = known
        if let rule { k.rules[rule.name, default: []].append(rule) }
        if let roles { k.roles[roles.principal, default: []].append(roles) }
        return Self.snapshot(k, group: ledger.group, admins: ledger.activeAdmins(), removed: ledger.removedMembers())
    }

    /// For each name, the entry that counts (else the best remembered, else the stored winner,
    /// which an admin active now did not sign): for listing, active or not.
    public var storedEntries: (rules: [AccessRuleEntry], roles: [RoleAssignment]) {
        let admins = ledger.activeAdmins()
        let k = known
        let winners = entries.withLock { $0 }
        var rules = winners.rules
        for (name, list) in k.rules {
            rules[name] = bestEntry(list.filter { admins.contains($0.signer) }) { $0.supersedes($1) } ?? bestEntry(list) { $0.supersedes($1) }
        }
        var roles = winners.roles
        for (p, list) in k.roles {
            roles[p] = bestEntry(list.filter { admins.contains($0.signer) }) { $0.supersedes($1) } ?? bestEntry(list) { $0.supersedes($1) }
        }
        return (rules.values.sorted { $0.name < $1.name }, roles.values.sorted { $0.principal < $1.principal })
    }

    static func documentIDs(in store: DocumentStore) throws -> [DocumentID] {
        var ids: [DocumentID] = []
        var after: DocumentID? = try DocumentID(String(documentPrefix.dropLast()), allowReserved: true)
        while true {
            let page = try store.allDocuments(after: after, limit: 500)
            let mine = page.prefix { $0.id.rawValue.hasPrefix(documentPrefix) }
            ids += mine.map(\.id)
            guard mine.count == page.count, let last = page.last else { break }
            after = last.id
        }
        return ids
    }
}

extension GroupAccess {
    /// The store validator's part for application documents under group rules: this node
    /// holds only what its roles let it read, and writes locally only what they let it write.
    /// A tombstone without fields reveals nothing, so it is judged by delete rights alone.
    public func validateHolding(_ proposed: ProposedRevision) -> String? {
        guard !proposed.id.rawValue.hasPrefix(ReservedNamespace.prefix), let own else { return nil }
        let bare = proposed.deleted && (proposed.body.objectValue?.isEmpty ?? true)
        if proposed.origin == .local {
            if proposed.deleted && !own.mayDelete { return "this node's roles may not delete documents (\(rolesText(own)))" }
            if !bare && !own.write.admits(id: proposed.id, body: proposed.body) {
                return "this node's roles may not write \"\(proposed.id)\" (\(rolesText(own)))"
            }
        }
        if !bare && !own.read.admits(id: proposed.id, body: proposed.body) {
            return "this node's roles do not let it hold \"\(proposed.id)\" (\(rolesText(own)))"
        }
        return nil
    }

    func rolesText(_ g: PrincipalGrants) -> String {
        g.roles.isEmpty ? "it has no roles" : "roles: \(g.roles.joined(separator: ", "))"
    }

    /// Purges every document this node may no longer read under the rules in force (after
    /// the rules or its roles changed); returns what went.
    @discardableResult
    public func purgeUnreadable(in store: DocumentStore, logger: Logger) throws -> [AccessRemoval] {
        guard let own else { return [] }
        let rule = AccessRule.all.restricted(by: own.read)
        guard !rule.admitsEverything else { return [] }
        var removed: [AccessRemoval] = []
        var after: DocumentID?
        while true {
            let page = try store.allDocuments(after: after, limit: 500)
            guard let last = page.last else { break }
            after = last.id
            let candidates = page.map(\.id).filter { !$0.rawValue.hasPrefix(ReservedNamespace.prefix) }
            let reason = "this node's roles no longer admit it (access \(version))"
            // The rules themselves refuse these revisions now; once they admit them again, they return.
            removed += try store.purgeForAccess(candidates, reason: reason, refusingReturn: false) { id, tree in
                !DocumentAccess(PeerPolicy(read: rule)).mayRead(id, tree: tree)
            }
        }
        for r in removed { logger.info("access removed", metadata: ["id": "\(LogText.escape(r.id))", "reason": "\(r.reason)"]) }
        return removed
    }
}
