import FerryCore
import Foundation

// What this node knows of the group's signed entries, whatever its revision trees say now.
//
// Signed entries (member entries, address records, access rules, role assignments) carry
// versions, and the highest valid version of each name counts. A revision tree cannot be
// trusted to keep the highest one: a member may push an old, validly signed body back as a
// child of the current revision, and the store then prunes the newer body as an ancestor.
// So the node remembers, for each name and signer, the best entry it ever accepted, in
// DATA/signed-entries.json, and selects from that memory (plus every body its store holds).
//
// Why a file beside group.json rather than a store table: the store's validator is where
// entries are accepted, and it has no handle on the store transaction; writing the file
// there, before the revision commits, means an entry whose body the store might later lose
// is always already remembered. A transaction rolled back after that leaves a remembered
// entry that is still a valid admin-signed statement the node received, which changes
// nothing that the same entry arriving again would not. The memory is bounded by names x
// signers (one best entry per signer suffices: a view picks the best entry among signers
// that count, so lower entries of a signer never matter), and every entry in it is checked
// again when it is read back.
extension MembershipLedger {
    static let knownFileName = "signed-entries.json"

    var knownFile: String { "\(directory)/\(Self.knownFileName)" }

    /// Reads DATA/signed-entries.json into `s` (absent: nothing known yet); entries of
    /// another group, and any whose signature does not check, are dropped.
    static func loadKnown(_ file: String, into s: inout State) throws(NodeError) {
        guard let data = FileManager.default.contents(atPath: file) else { return }
        guard let json = try? JSON.parse(Array(data)), json.objectValue != nil else {
            throw .badConfiguration("\(file) is corrupt: it must hold the group's signed entries as a JSON object")
        }
        guard let group = s.group else { return }
        for body in json["members"]?.arrayItems ?? [] {
            guard let e = try? MemberEntry(parsing: body), e.group == group, (try? e.verifySignature()) != nil else { continue }
            _ = s.remember(e)
        }
        for body in json["addresses"]?.arrayItems ?? [] {
            guard let r = try? MemberAddresses(parsing: body), r.group == group, (try? r.verifySignature()) != nil else { continue }
            _ = s.remember(r)
        }
        for body in json["rules"]?.arrayItems ?? [] {
            guard let r = try? AccessRuleEntry(parsing: body), r.group == group, (try? r.verifySignature()) != nil else { continue }
            _ = s.remember(r)
        }
        for body in json["roles"]?.arrayItems ?? [] {
            guard let a = try? RoleAssignment(parsing: body), a.group == group, (try? a.verifySignature()) != nil else { continue }
            _ = s.remember(a)
        }
    }

    /// Writes what `s` knows to DATA/signed-entries.json (atomically, synced).
    func saveKnown(_ s: State) throws(NodeError) {
        let members = s.ledger.keys.sorted().flatMap { s.ledger[$0]! }.map(\.body)
        let addresses = s.addressRecords.keys.sorted().map { s.addressRecords[$0]!.body }
        let rules = s.rules.keys.sorted().flatMap { s.rules[$0]! }.map(\.body)
        let roles = s.roles.keys.sorted().flatMap { s.roles[$0]! }.map(\.body)
        try writeAtomically(
            .object(["members": .array(members), "addresses": .array(addresses), "rules": .array(rules), "roles": .array(roles)]),
            to: knownFile)
    }

    /// Saves `s` (already changed) when `changed`; a failure to save is a failure to accept
    /// (the caller refuses).
    func persist(_ s: State, changed: Bool) -> String? {
        guard changed else { return nil }
        do { try saveKnown(s) } catch { return "cannot remember a signed entry: \(error.description)" }
        return nil
    }

    /// Remembers an access rule or assignment signed by an admin active now (read from the
    /// store), and saves; false when nothing new.
    @discardableResult
    func rememberStored(rule: AccessRuleEntry? = nil, roles: RoleAssignment? = nil) -> Bool {
        state.withLock { s -> Bool in
            guard let group = s.group else { return false }
            let admins = (s.view ?? MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true)).activeAdmins
            var changed = false
            if let rule, rule.group == group, admins.contains(rule.signer) { changed = s.remember(rule) || changed }
            if let roles, roles.group == group, admins.contains(roles.signer) { changed = s.remember(roles) || changed }
            _ = persist(s, changed: changed)
            return changed
        }
    }

    /// Every remembered access rule (by name) and role assignment (by principal).
    func knownAccess() -> (rules: [String: [AccessRuleEntry]], roles: [String: [RoleAssignment]]) {
        state.withLock { ($0.rules, $0.roles) }
    }

    /// The highest version remembered for rule `name` or the assignment of `principal`,
    /// whoever signed it and whether it counts now: an admin's next entry goes above it.
    func highestAccessVersion(rule name: String? = nil, principal: String? = nil) -> Int64 {
        state.withLock { s in
            if let name { return (s.rules[name] ?? []).map(\.version).max() ?? 0 }
            if let principal { return (s.roles[principal] ?? []).map(\.version).max() ?? 0 }
            return 0
        }
    }
}

extension MembershipLedger.State {
    /// Keeps `entry` unless its signer already has an entry for that node that supersedes it
    /// (or is it); drops the signer's entries it supersedes. True when something changed.
    mutating func remember(_ entry: MemberEntry) -> Bool {
        // The founder cannot be removed: such an entry never counts, so it is not kept.
        if entry.node == entry.group && entry.state == .removed { return false }
        var list = ledger[entry.node] ?? []
        guard Self.keep(entry, in: &list, sameSigner: { $0.signer == entry.signer }, supersedes: { $0.supersedes($1) }) else { return false }
        ledger[entry.node] = list
        return true
    }

    /// Keeps the node's best address record (records are signed by the node itself).
    mutating func remember(_ record: MemberAddresses) -> Bool {
        if let best = addressRecords[record.node], best == record || best.supersedes(record) { return false }
        addressRecords[record.node] = record
        return true
    }

    mutating func remember(_ rule: AccessRuleEntry) -> Bool {
        var list = rules[rule.name] ?? []
        guard Self.keep(rule, in: &list, sameSigner: { $0.signer == rule.signer }, supersedes: { $0.supersedes($1) }) else { return false }
        rules[rule.name] = list
        return true
    }

    mutating func remember(_ assignment: RoleAssignment) -> Bool {
        var list = roles[assignment.principal] ?? []
        guard Self.keep(assignment, in: &list, sameSigner: { $0.signer == assignment.signer }, supersedes: { $0.supersedes($1) })
        else { return false }
        roles[assignment.principal] = list
        return true
    }

    /// The one best entry per signer: adds `e` unless a same-signer entry is `e` or supersedes it.
    static func keep<E: Equatable>(_ e: E, in list: inout [E], sameSigner: (E) -> Bool, supersedes: (E, E) -> Bool) -> Bool {
        if list.contains(where: { sameSigner($0) && ($0 == e || supersedes($0, e)) }) { return false }
        list.removeAll { sameSigner($0) }
        list.append(e)
        return true
    }
}

/// The best of several signed entries of one name, by their `supersedes` order.
func bestEntry<E>(_ entries: some Sequence<E>, _ supersedes: (E, E) -> Bool) -> E? {
    var out: E?
    for e in entries where out == nil || supersedes(e, out!) { out = e }
    return out
}
