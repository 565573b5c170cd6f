import FerryCore
import FerryStore
import Foundation
import Logging

// Writing signed member entries: founding the group, removing a member, entry versions, DATA/group.json.
extension GroupMembership {
    /// Writes an entry this node signed, as a new revision of its document, and applies it.
    func write(_ entry: MemberEntry) throws {
        let c = context
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
        let c = context
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

    /// Removes a member by ID, unique ID prefix (8+ digits) or unique name: signs a removed
    /// entry one version up. Only admins remove; the founder cannot be removed.
    public func remove(_ who: String) throws -> MemberEntry {
        let c = context
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
}
