import FerryCore
import Foundation
import Logging

// Issuing invitations: the single-use code a new node joins with.
extension GroupMembership {
    /// What a join or an invitation tells the caller.
    public struct Invitation: Sendable {
        public let code: InvitationCode
        public let expires: Date
        public let admin: Bool
        public let group: String
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
        let c = context
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
}
