import FerryCore
import FerryTransport
import Foundation
import Testing

@testable import FerryNode

/// The four signed documents of a group (member entries, address records, access rules,
/// role assignments) share one body form, one signature check and one reader (`SignedEntry`):
/// each round-trips, verifies, refuses a changed body with its own error, names its first
/// unknown member (sorted, escaped), and keeps the members it has always signed, so entries
/// signed by older nodes still verify.
@Suite struct SignedEntryTests {
    static let admin = try! MembershipFixture.identity()
    static let other = try! MembershipFixture.identity()

    static func member() throws -> MemberEntry {
        try MemberEntry.signed(
            group: admin.nodeID, node: other.nodeID, name: "ward-b", state: .member, admin: false, version: 3,
            addresses: ["10.0.0.2:4985"], by: admin)
    }
    static func record() throws -> MemberAddresses {
        try MemberAddresses.signed(group: admin.nodeID, addresses: ["10.0.0.2:4985"], version: 5, by: other)
    }
    static func rule() throws -> AccessRuleEntry {
        try AccessRuleEntry.signed(
            group: admin.nodeID, name: "ward-a", roles: ["ward-a"], read: AccessMatch(selector: ["ward": "a"]), write: nil,
            delete: false, state: .active, version: 2, by: admin)
    }
    static func roles() throws -> RoleAssignment {
        try RoleAssignment.signed(group: admin.nodeID, principal: other.nodeID, roles: ["ward-a"], version: 4, by: admin)
    }

    /// Parses `body`, checks it equals `entry`, verifies it, and returns the error a changed
    /// `version` gets, and the one a body with two unknown members gets.
    func check<E: SignedEntry & Equatable>(_ entry: E, _ parse: (JSON) throws -> E) throws -> (changed: String, unknown: String) {
        let parsed = try parse(entry.body)
        #expect(parsed == entry)
        try parsed.verifySignature()
        var changed = try #require(entry.body.objectValue)
        changed["version"] = .int(99)
        var changedError = ""
        do { try parse(.object(changed)).verifySignature() } catch { changedError = "\(type(of: error)): \(error)" }
        var extra = try #require(entry.body.objectValue)
        extra["zz"] = .int(1)
        extra["b\u{1b}[2J"] = .int(1)
        var unknownError = ""
        do { _ = try parse(.object(extra)) } catch { unknownError = "\(error)" }
        return (changedError, unknownError)
    }

    @Test func everySignedDocumentRoundTripsVerifiesAndRefusesAChangedBodyWithItsOwnError() throws {
        let results = [
            try check(try Self.member(), MemberEntry.init(parsing:)),
            try check(try Self.record(), MemberAddresses.init(parsing:)),
            try check(try Self.rule(), AccessRuleEntry.init(parsing:)),
            try check(try Self.roles(), RoleAssignment.init(parsing:)),
        ]
        #expect(results[0].changed == "MembershipError: bad member entry signature: the signature does not verify")
        #expect(results[1].changed == "MembershipError: bad member entry signature: the signature does not verify")
        #expect(results[2].changed == "AccessError: bad signature: the signature does not verify")
        #expect(results[3].changed == "AccessError: bad signature: the signature does not verify")
        #expect(try Self.member().body.objectValue?["version"] == .int(3))
    }

    @Test func everySignedDocumentNamesItsFirstUnknownMemberSortedAndEscaped() throws {
        let unknown = [
            try check(try Self.member(), MemberEntry.init(parsing:)).unknown,
            try check(try Self.record(), MemberAddresses.init(parsing:)).unknown,
            try check(try Self.rule(), AccessRuleEntry.init(parsing:)).unknown,
            try check(try Self.roles(), RoleAssignment.init(parsing:)).unknown,
        ]
        for message in unknown {
            #expect(message.contains(#"unknown member \"b\u{1B}[2J\""#) || message.contains(#"unknown member "b\u{1B}[2J""#), "\(message)")
            #expect(!message.contains("\u{1b}"), "\(message)")
        }
    }

    /// The members each document signs: changing them would make every entry already signed
    /// fail to verify on nodes that read it with the new set.
    @Test func theSignedMembersOfEachDocumentStayAsTheyWere() throws {
        func keys(_ e: some SignedEntry) -> [String] { e.unsignedBody.keys.sorted() }
        #expect(keys(try Self.member()) == ["addresses", "admin", "group", "name", "node", "signer", "signerCertificate", "state", "type", "version"])
        #expect(keys(try Self.record()) == ["addresses", "certificate", "group", "node", "type", "version"])
        #expect(keys(try Self.rule()) == ["delete", "group", "name", "read", "roles", "signer", "signerCertificate", "state", "type", "version"])
        #expect(keys(try Self.roles()) == ["group", "principal", "roles", "signer", "signerCertificate", "type", "version"])
        #expect(MemberEntry.type == "ferry.member" && MemberAddresses.type == "ferry.addresses")
        #expect(AccessRuleEntry.type == "ferry.access.rule" && RoleAssignment.type == "ferry.access.roles")
    }
}
