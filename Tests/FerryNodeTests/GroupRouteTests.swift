import FerryCore
import Foundation
import Testing

@testable import FerryNode

/// The admin API's group routes, routed in-process.
@Suite(.timeLimit(.minutes(2))) struct GroupRouteTests {
    @Test func aNodeInNoGroupFoundsOneWithItsFirstInvitation() async throws {
        let routed = try RoutedNode()
        let id = routed.node.identity.nodeID
        try await routed.test { client in
            let before = try await client.call(.get, "/group")
            #expect(before.status == 200 && before["group"] == .null)
            #expect(try await client.call(.delete, "/group/members/someone").code == "no_group")
            let made = try await client.call(.post, "/group/invitations", body: #"{"admin":true,"expiresSeconds":60,"addresses":["10.0.0.1:4985"]}"#)
            #expect(made.status == 201, "\(made.text)")
            let code = try InvitationCode(parsing: made["code"]?.stringValue ?? "")
            #expect(code.inviter == id && code.addresses == ["10.0.0.1:4985"])
            #expect(made["admin"] == true)
            let after = try await client.call(.get, "/group")
            #expect(after["group"]?.stringValue == id && after["admin"] == true)
            #expect(after["members"]?.arrayItems.first?["founder"] == true)
            #expect(try await client.call(.delete, "/group/members/\(id)").code == "cannot_remove_founder")
        }
    }

    @Test func badInvitationAndJoinRequestsAreRefusedClearly() async throws {
        let routed = try RoutedNode()
        try await routed.test { client in
            let zero = try await client.call(.post, "/group/invitations", body: #"{"expiresSeconds":0}"#)
            #expect(zero.status == 400 && zero.text.contains("expiresSeconds"))
            let unknown = try await client.call(.post, "/group/invitations", body: #"{"ttl":5}"#)
            #expect(unknown.status == 400 && unknown.text.contains("ttl"))
            let address = try await client.call(.post, "/group/invitations", body: #"{"addresses":["nohost"]}"#)
            #expect(address.code == "bad_invitation_code" && address.text.contains("host:port"))
            #expect(try await client.call(.get, "/group")["group"] == .null, "a refused invitation founds no group")
            let join = try await client.call(.post, "/group/join", body: #"{"code":"ferry1-%%%"}"#)
            #expect(join.status == 400 && join.code == "bad_invitation_code")
            #expect(try await client.call(.post, "/group/join", body: "{}").status == 400)
        }
    }

    @Test func aGroupMemberIsNotRemovedThroughTheTrustRoutes() async throws {
        let routed = try RoutedNode()
        let member = String(repeating: "5", count: 64)
        try await routed.test { client in
            _ = try await client.call(.post, "/group/invitations", body: #"{"addresses":["10.0.0.1:4985"]}"#)
            try routed.node.membership.write(
                try MemberEntry.signed(
                    group: routed.node.identity.nodeID, node: member, name: "m", state: .member, admin: false, version: 1, addresses: [],
                    by: routed.node.identity))
            let listed = try await client.call(.get, "/trust")
            #expect(listed["trusted"]?.arrayItems.contains { $0["id"]?.stringValue == member && $0["source"]?.stringValue == "group" } == true)
            let rm = try await client.call(.delete, "/trust/\(member)")
            #expect(rm.status == 404 && rm.text.contains("ferry group remove"))
            let removed = try await client.call(.delete, "/group/members/m")
            #expect(removed.status == 200 && removed["state"]?.stringValue == "removed")
            #expect(!routed.node.trust.isTrusted(member))
        }
    }
}
