import FerryCore
import FerryStore
import FerrySync
import FerryTransport

// An admin's changes to the group's rules and roles, each checked (group, admin, names,
// selectors, lockout) before it is signed and stored, and the explain answer.
extension GroupAccess {
    /// Signs and stores rule `name` (added, or replacing the one by that name).
    public func setRule(
        _ name: String, roles: [String], read: AccessMatch?, write: AccessMatch?, delete: Bool, membership: GroupMembership
    ) throws -> AccessRuleEntry {
        let (group, identity) = try adminContext(membership)
        guard !roles.isEmpty else { throw AccessError.malformed("a rule needs at least one role (--role)") }
        if read == nil && write == nil { throw AccessError.malformed("a rule grants nothing without read or write (--read-all, --read-ids, --read-selector, or the --write ones)") }
        if delete && write == nil { throw AccessError.malformed("delete rights need write rights in the same rule") }
        let entry = try AccessRuleEntry.signed(
            group: group, name: name, roles: roles, read: read, write: write, delete: delete, state: .active,
            version: try nextVersion(ledger.highestAccessVersion(rule: name)), by: identity)
        try checkLockout(proposed(rule: entry))
        try store(entry.body, at: AccessRuleEntry.documentID(name), membership)
        return entry
    }

    /// Signs and stores rule `name` as removed.
    public func removeRule(_ name: String, membership: GroupMembership) throws -> AccessRuleEntry {
        let (group, identity) = try adminContext(membership)
        try AccessNames.checkRule(name)
        // The rule as listed (in force, or signed by an admin removed since, who may return).
        guard let previous = storedEntries.rules.first(where: { $0.name == name }), previous.state == .active else {
            throw AccessError.unknownRule(name)
        }
        let entry = try AccessRuleEntry.signed(
            group: group, name: name, roles: previous.roles, read: previous.read, write: previous.write, delete: previous.delete,
            state: .removed, version: try nextVersion(ledger.highestAccessVersion(rule: name)), by: identity)
        try checkLockout(proposed(rule: entry))
        try store(entry.body, at: AccessRuleEntry.documentID(name), membership)
        return entry
    }

    /// Signs and stores the roles of a principal: `user:NAME`, or a member by ID, unique ID
    /// prefix or unique name. No roles withdraws every role.
    public func setRoles(_ who: String, roles: [String], membership: GroupMembership) throws -> RoleAssignment {
        let (group, identity) = try adminContext(membership)
        let principal = try resolvePrincipal(who, membership: membership)
        // Before the first rule nothing is enforced, so roles may be handed out ahead of the
        // rules that name them (an admin needs its role before a rule could lock it out).
        let current = snapshot
        for r in roles {
            try AccessNames.checkRole(r)
            if current.hasRules && !current.knownRoles.contains(r) { throw AccessError.unknownRole(r) }
        }
        let assignment = try RoleAssignment.signed(
            group: group, principal: principal, roles: roles, version: try nextVersion(ledger.highestAccessVersion(principal: principal)),
            by: identity)
        try checkLockout(proposed(roles: assignment))
        try store(assignment.body, at: RoleAssignment.documentID(principal), membership)
        return assignment
    }

    /// Which rule admits document `id` (as held here, or `body` when given) for `who`.
    public func explain(_ id: DocumentID, body: JSON?, who: String, membership: GroupMembership, store: DocumentStore) throws -> AccessExplanation {
        let principal = try resolvePrincipal(who, membership: membership)
        var judged = body
        if judged == nil {
            guard let doc = try store.document(id) else {
                throw StoreError.notFound(id)
            }
            judged = doc.body
        }
        return snapshot.explain(id: id, body: judged, principal: principal)
    }

    /// A member reference, a whole node ID (a peer trusted by hand need not be a member), or
    /// `user:NAME`, as the principal ID rules name.
    func resolvePrincipal(_ who: String, membership: GroupMembership) throws -> String {
        if who.hasPrefix("user:") {
            try AccessNames.checkPrincipal(who)
            return who
        }
        guard let view = membership.view else { throw AccessError.noGroup }
        do { return try membership.resolve(who, in: view) } catch {
            if who.utf8.count == 64, NodeIDFormat.normalized(who) == who.lowercased() { return who.lowercased() }
            throw error
        }
    }

    func adminContext(_ membership: GroupMembership) throws -> (String, NodeIdentity) {
        guard let group = membership.group, let view = membership.view else { throw AccessError.noGroup }
        let me = membership.context.identity
        guard view.isAdmin(me.nodeID) else {
            throw AccessError.notAdmin("only a group admin may change access rules or roles; this node is not one (an admin invites with `ferry invite --admin`)")
        }
        return (group, me)
    }

    /// One above `highest`, the highest version this node ever accepted for the name (not
    /// only the entry a tree shows now): every node then takes the new entry over all it knew.
    func nextVersion(_ highest: Int64) throws(AccessError) -> Int64 {
        guard highest < Int64.max else { throw .malformed("the entry's version cannot go higher") }
        return highest + 1
    }

    func checkLockout(_ next: AccessSnapshot) throws(AccessError) {
        if let reason = next.lockout(admins: ledger.activeAdmins()) { throw .locksOutAdmins(reason) }
    }

    func store(_ body: JSON, at id: DocumentID, _ membership: GroupMembership) throws {
        let s = membership.context.store
        let parent = try s.document(id)?.revision
        try s.put(id, body: body, parent: parent)
        try reread([id], from: s)
        recompute()
    }
}
