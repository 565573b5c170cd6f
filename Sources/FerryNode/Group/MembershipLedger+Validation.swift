import FerryCore
import FerryStore

// The store validator's part for the group's reserved documents: member entries and address records.
extension MembershipLedger {
    /// The store validator's part for `_ferry/members/`: an entry must be valid for this
    /// node's group, signed by the founder or an active admin, and not below the version of
    /// the entry that counts for its node here; deletions are refused. Other documents pass (nil).
    public func validate(_ proposed: ProposedRevision) -> String? {
        if let node = MemberAddresses.node(inDocument: proposed.id) { return validateAddresses(proposed, node: node) }
        if proposed.id.rawValue.hasPrefix(GroupAccess.documentPrefix) { return validateAccess(proposed) }
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
            // A verified statement by an admin: later entries it enables may count on it. It is
            // remembered even when its revision is refused below (a signer's removal may make
            // it the one that counts), and before the revision commits (DATA/signed-entries.json).
            let selected = view.selected[node]
            let changed = s.remember(entry)
            if changed { s.view = MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true) }
            if let failure = persist(s, changed: changed) { return failure }
            // A replay (an old body pushed back as a new revision) is refused: the entry that
            // counts has a higher version, so storing it could only hide the newer body in the
            // tree. An equal version (another admin's concurrent entry) goes in: the tie is
            // broken by selection alone, so every node holds the same branches.
            if let selected, selected.version > entry.version {
                return "a superseded entry: node \(node.prefix(12)) is at version \(selected.version) (\(selected.state.rawValue)) here, not \(entry.version)"
            }
            return nil
        }
    }

    /// The validator's part for `_ferry/addresses/`: a record signed by the member it names,
    /// for this node's group, of an active member, not older than its newest record here;
    /// deletions are refused.
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
            // The newest record counts whatever the tree says; an older one pushed back is refused.
            let newest = s.addressRecords[node]
            let changed = s.remember(record)
            if let failure = persist(s, changed: changed) { return failure }
            if let newest, newest.version > record.version {
                return "a superseded address record: node \(node.prefix(12)) is at version \(newest.version) here, not \(record.version)"
            }
            return nil
        }
    }

    /// The validator's part for `_ferry/access/`: a rule or role assignment for this node's
    /// group, well formed (selectors included), signed by an admin active now; deletions are
    /// refused (a removed rule is an entry with state removed, a withdrawn assignment one
    /// with no roles), and so is an entry below the version of the one that counts here (a
    /// replay of an old entry, which is still remembered).
    func validateAccess(_ proposed: ProposedRevision) -> String? {
        if proposed.deleted { return "access entries are never deleted (an admin writes a removed rule, or an assignment with no roles)" }
        var rule: AccessRuleEntry?
        var assignment: RoleAssignment?
        do {
            if let name = AccessRuleEntry.name(inDocument: proposed.id) {
                let r = try AccessRuleEntry(parsing: proposed.body)
                guard r.name == name else { return "the rule is named \(r.name), not its document's \(name)" }
                try r.verifySignature()
                rule = r
            } else if let p = RoleAssignment.principal(inDocument: proposed.id) {
                let a = try RoleAssignment(parsing: proposed.body)
                guard a.principal == p else { return "the assignment names \(a.principal), not its document's \(p)" }
                try a.verifySignature()
                assignment = a
            } else {
                return "\(proposed.id) is neither a rule (\(AccessRuleEntry.documentPrefix)NAME) nor a role assignment (\(RoleAssignment.documentPrefix)PRINCIPAL)"
            }
        } catch { return error.description }
        let (group, signer) = rule.map { ($0.group, $0.signer) } ?? (assignment!.group, assignment!.signer)
        return state.withLock { s -> String? in
            guard let mine = s.group else { return "this node belongs to no group, so it takes no access entries" }
            guard group == mine else { return "the entry is for group \(group.prefix(12)), not this node's \(mine.prefix(12))" }
            let admins = (s.view ?? MembershipView(group: mine, entries: s.ledger.values.joined(), signaturesChecked: true)).activeAdmins
            guard admins.contains(signer) else {
                return "signer \(signer.prefix(12)) is neither the founder nor an active admin of the group"
            }
            // The entry that counts here (the best signed by an admin active now), before this one.
            if let rule {
                let counting = bestEntry((s.rules[rule.name] ?? []).filter { admins.contains($0.signer) }) { $0.supersedes($1) }
                let changed = s.remember(rule)
                if let failure = persist(s, changed: changed) { return failure }
                if let counting, counting.version > rule.version {
                    return "a superseded entry: rule \(rule.name) is at version \(counting.version) (\(counting.state.rawValue)) here, not \(rule.version)"
                }
            } else if let assignment {
                let counting = bestEntry((s.roles[assignment.principal] ?? []).filter { admins.contains($0.signer) }) { $0.supersedes($1) }
                let changed = s.remember(assignment)
                if let failure = persist(s, changed: changed) { return failure }
                if let counting, counting.version > assignment.version {
                    return "a superseded entry: the roles of \(assignment.principal.prefix(17)) are at version \(counting.version) here, not \(assignment.version)"
                }
            }
            return nil
        }
    }
}
