import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle

/// The admin API's group routes (`/group`): the group and its members, invitations, joins
/// and removals.
extension AdminAPI {
    /// `GET /group`: the group, this node's role, and every node with a counting entry.
    func groupInfo() -> Response { json(groupInfoJSON()) }

    func groupInfoJSON() -> JSON {
        let m = node.membership
        let me = node.identity.nodeID
        guard let group = m.group, let view = m.view else {
            return ["group": .null, "self": .string(me), "admin": false, "members": []]
        }
        return .object([
            "group": .string(group), "self": .string(me), "admin": .bool(view.isAdmin(me)),
            "members": .array(view.selected.values.sorted { $0.node < $1.node }.map { e in
                [
                    "id": .string(e.node), "name": e.name.map(JSON.string) ?? .null, "admin": .bool(e.admin && e.state == .member),
                    "state": .string(e.state.rawValue), "version": .int(e.version), "signer": .string(e.signer),
                    "founder": .bool(e.node == group), "addresses": .array(e.addresses.map(JSON.string)),
                ]
            }),
        ])
    }

    /// `POST /group/invitations` `{"admin"?, "expiresSeconds"?, "addresses"?}` → the code.
    func invite(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        guard body.objectValue != nil else { throw APIError(.badRequest, "bad_request", "the body must be a JSON object") }
        if let key = body.objectValue?.keys.first(where: { !["admin", "expiresSeconds", "addresses"].contains($0) }) {
            throw APIError(.badRequest, "bad_request", "unknown member \"\(key)\"")
        }
        let admin = body["admin"]?.boolValue ?? false
        let seconds = body["expiresSeconds"].map { $0.doubleValue ?? -1 } ?? 600
        guard seconds > 0, seconds <= 7 * 86_400 else {
            throw APIError(.badRequest, "bad_request", "expiresSeconds must be a number in (0, 604800]")
        }
        var addresses: [String]?
        if let list = body["addresses"] {
            guard case .array(let items) = list, !items.isEmpty, items.allSatisfy({ $0.stringValue != nil }) else {
                throw APIError(.badRequest, "bad_request", "addresses must be a non-empty array of \"host:port\" strings")
            }
            addresses = items.compactMap(\.stringValue)
        }
        let invitation = try node.membership.invite(admin: admin, lifetime: seconds, addresses: addresses)
        return json(
            [
                "code": .string(invitation.code.text), "group": .string(invitation.group), "admin": .bool(invitation.admin),
                "expires": .string(ISO8601DateFormatter().string(from: invitation.expires)),
                "addresses": .array(invitation.code.addresses.map(JSON.string)),
            ], status: .created)
    }

    /// `POST /group/join` `{"code"}`: joins through the code's inviter.
    func join(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        guard let code = body["code"]?.stringValue else { throw APIError(.badRequest, "bad_request", "the body needs {\"code\": \"ferry1-…\"}") }
        let joined: GroupMembership.Joined
        joined = try await node.membership.join(code: code, name: node.configuration.name)
        return json(["group": .string(joined.group), "inviter": .string(joined.inviter), "members": .int(Int64(joined.members))])
    }

    /// `DELETE /group/members/{id-or-name}`: signs a removed entry.
    func removeMember(_ who: String) throws -> Response {
        let entry = try node.membership.remove(who.removingPercentEncoding ?? who)
        return json(["id": .string(entry.node), "state": .string(entry.state.rawValue), "version": .int(entry.version)])
    }
}
