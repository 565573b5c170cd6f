import FerryCore
import FerryCouch
import FerrySync
import Foundation
import Testing

@testable import FerryNode

/// The `couch` section of the config file: what it sets and what it refuses.
@Suite struct CouchConfigTests {
    static let hash: String = { (try? CouchPasswordHash(password: "pw", iterations: 10_000).description) ?? "" }()

    func parse(_ couch: JSON) throws(ConfigError) -> NodeConfiguration.Couch {
        try NodeConfiguration.parse(["couch": couch], file: "test.json").couch
    }

    @Test func defaultsAreLoopbackPort4987AndNoUsersOriginsOrLANListener() throws {
        let c = NodeConfiguration().couch
        #expect(c.port == 4987 && c.users.isEmpty && c.corsOrigins.isEmpty && c.lan == nil && c.sessionSeconds == 600)
        var limits = NodeConfiguration.Limits()
        #expect(c.effectiveMaxRequestBytes(limits) == 64 << 20)
        limits.maxDocumentBytes = 100 << 20
        #expect(c.effectiveMaxRequestBytes(limits) == (101 << 20))
    }

    @Test func everyKeyIsRead() throws {
        let c = try parse([
            "port": 5999, "maxRequestBytes": 2048, "sessionSeconds": 120,
            "users": [["name": "tablet", "password": .string(Self.hash), "policy": ["write": ["prefixes": ["notes/"]], "mayDelete": false]]],
            "cors": ["origins": ["https://app.example:8443", "*"]],
            "lan": ["interface": "0.0.0.0", "port": 6985],
        ])
        #expect(c.port == 5999 && c.maxRequestBytes == 2048 && c.sessionSeconds == 120)
        #expect(c.users.map(\.name) == ["tablet"])
        #expect(c.users[0].policy == PeerPolicy(read: .all, write: AccessRule(idPrefixes: ["notes/"]), mayDelete: false))
        #expect(c.users[0].password.verify("pw"))
        #expect(c.corsOrigins == ["https://app.example:8443", "*"])
        #expect(c.lan?.port == 6985 && c.lan?.interface == "0.0.0.0")
        #expect(try parse(["lan": [:]]).lan == NodeConfiguration.Couch.LAN())
    }

    @Test func badUserEntriesAreRefusedNamingTheKey() {
        let cases: [(JSON, String, String)] = [
            (["users": [["name": "a", "password": "plain"]]], "couch.users[0].password", "pbkdf2-sha256"),
            (["users": [["name": "a", "password": .string(Self.hash.replacingOccurrences(of: "$10000$", with: "$9999$"))]]], "couch.users[0].password", "iterations"),
            (["users": [["name": "a", "password": .string(Self.hash)], ["name": "a", "password": .string(Self.hash)]]], "couch.users[1].name", "duplicate"),
            (["users": [["name": "admin", "password": .string(Self.hash)]]], "couch.users[0].name", "reserved"),
            (["users": [["name": "a:b", "password": .string(Self.hash)]]], "couch.users[0].name", "':'"),
            (["users": [["name": "a"]]], "couch.users[0].password", "required"),
            (["users": [["name": "a", "password": .string(Self.hash), "roles": []]]], "couch.users[0].roles", "unknown key"),
            (["users": [["name": "a", "password": .string(Self.hash), "policy": ["write": "some"]]]], "couch.users[0].policy.write", "all"),
            (["cors": ["origins": ["app.example"]]], "couch.cors.origins[0]", "origin"),
            (["lan": ["port": 70000]], "couch.lan.port", "0...65535"),
            (["port": -1], "couch.port", "0...65535"),
            (["bind": "0.0.0.0"], "couch.bind", "unknown key"),
        ]
        for (json, key, reason) in cases {
            #expect {
                _ = try parse(json)
            } throws: { error in
                guard let e = error as? ConfigError else { return false }
                return e.key == key && e.reason.contains(reason)
            }
        }
    }

    @Test func aUserEntryForTheConfigHashesThePasswordWithASaltAndItsPolicy() throws {
        let entry = try NodeConfiguration.Couch.userEntry(name: "tablet", password: "s3cret", iterations: 10_000, readOnly: true)
        let user = try NodeConfiguration.parse(["couch": ["users": [entry]]], file: "test.json").couch.users[0]
        #expect(user.name == "tablet" && user.password.verify("s3cret") && !user.password.verify("s3cre"))
        #expect(user.policy.write == .none && user.policy.read == .all && !user.policy.mayDelete)
        #expect(!entry.canonicalString.contains("s3cret"))
        #expect(throws: NodeError.self) { try NodeConfiguration.Couch.userEntry(name: "admin", password: "x", iterations: 10_000, readOnly: false) }
        #expect(throws: (any Error).self) { try NodeConfiguration.Couch.userEntry(name: "a", password: "x", iterations: 10, readOnly: false) }
    }
}
