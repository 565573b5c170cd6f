import FerryCore
import FerryStore
import FerrySync
import Foundation
import IntegrationHarness
import Testing

@testable import FerryNode

/// CouchDB replications of a running node: the admin API, their status, and two nodes
/// replicating through one's CouchDB API.
@Suite(.serialized, .timeLimit(.minutes(10))) struct CouchReplicationNodeTests {
    static func list(_ n: InProcessNode) async throws -> [JSON] {
        if case .array(let list)? = try await n.get("/replications")["replications"] { return list }
        return []
    }

    @Test func aCouchReplicationAddedThroughTheAPIIsListedWithoutItsPasswordIsKeptForTheNextStartAndStopsOnDelete() async throws {
        let n = try await InProcessNode.start({ $0.discovery = false })
        let dir = n.directory
        let body = #"{"id":"hub","url":"http://alice:s3cret-pw@127.0.0.1:1/db","selector":{"type":"note"}}"#
        let created = try await n.request("POST", "/replications", body: body)
        #expect(created.status == 201, "\(created.text)")
        #expect(!created.text.contains("s3cret-pw"))
        // The entry is kept from the listing that showed the error: a retry may clear it again at any time.
        var failing: JSON?
        try await waitUntil("the replication shows an error") {
            let first = try await Self.list(n).first
            if first?["status"]?["errorCode"]?.stringValue != nil { failing = first }
            return failing != nil
        }
        let listed = try await n.request("GET", "/replications")
        #expect(!listed.text.contains("s3cret-pw"))
        let entry = try #require(failing)
        #expect(entry["url"] == "http://alice:***@127.0.0.1:1/db" && entry["kind"] == "couchdb" && entry["source"] == "api")
        #expect(entry["direction"] == "pushAndPull" && entry["selector"] == ["type": "note"] && entry["peer"] == nil)
        #expect(entry["status"]?["errorTransient"]?.boolValue != nil)
        // Kept (with its credentials, in an owner-only file) for the next start.
        let saved = try ReplicationRegistry(dataDirectory: dir).specs
        #expect(saved.map(\.url) == ["http://alice:s3cret-pw@127.0.0.1:1/db"] && saved.first?.couch?.selector == ["type": "note"])
        let mode = try FileManager.default.attributesOfItem(atPath: dir + "/replications.json")[.posixPermissions] as? Int
        #expect(mode == 0o600)
        #expect(try await n.request("DELETE", "/replications/hub").status == 200)
        #expect(try await Self.list(n).isEmpty)
        #expect(try ReplicationRegistry(dataDirectory: dir).specs.isEmpty)
        await n.stop()
    }

    @Test func badCouchReplicationsAreRefusedByTheAPINamingTheField() async throws {
        let n = try await InProcessNode.start({ $0.discovery = false })
        let peer = String(repeating: "a", count: 64)
        let cases: [(String, String)] = [
            (#"{"url":"http://127.0.0.1:1/db","peer":"\#(peer)"}"#, "peer"),
            (#"{"url":"http://127.0.0.1:1/db","pin":"\#(peer)"}"#, "pin"),
            (#"{"url":"http://127.0.0.1:1/db","credentialsFile":"/a","credentialsEnv":"B"}"#, "credentialsEnv"),
            (#"{"url":"http://u:p@127.0.0.1:1/db","credentialsEnv":"B"}"#, "credentialsEnv"),
            (#"{"url":"http://127.0.0.1:1/db","selector":{"$bogus":1}}"#, "selector"),
            (#"{"url":"http://127.0.0.1:1/"}"#, "url"),
        ]
        for (body, field) in cases {
            let reply = try await n.request("POST", "/replications", body: body)
            #expect(reply.status == 400, "\(body)")
            #expect(reply.json["reason"]?.stringValue?.hasPrefix(field) == true, "\(body): \(reply.text)")
            #expect(!reply.text.contains(":p@"))
        }
        #expect(try await Self.list(n).isEmpty)
        await n.stop()
    }

    @Test func aMissingCredentialsVariableIsAPermanentErrorInTheStatusNotACrash() async throws {
        let variable = "FERRY_TEST_UNSET_\(UUID().uuidString.prefix(8).uppercased())"
        var spec = ReplicationSpec(id: "hub", couchURL: "http://127.0.0.1:1/db")
        spec.couch?.credentialsEnv = variable
        let n = try await InProcessNode.start({
            $0.discovery = false
            $0.replications = [spec]
        })
        try await waitUntil("the replication shows why it cannot start") {
            try await Self.list(n).first?["status"]?["errorCode"] == "bad_endpoint"
        }
        let status = try #require(try await Self.list(n).first?["status"])
        #expect(status["errorTransient"] == false)
        #expect(status["error"]?.stringValue?.contains(variable) == true)
        #expect(try await Self.list(n).first?["source"] == "config")
        // A config replication is removed in the file, not through the API.
        #expect(try await n.request("DELETE", "/replications/hub").status == 409)
        await n.stop()
    }

    /// Needs the CouchDB client (FerryCouch/Client) to replicate.
    @Test func aWriteOnEitherNodeReachesTheOtherThroughTheCouchDBAPIWithTheSameRevisions() async throws {
        let b = try await InProcessNode.start({ $0.discovery = false })
        let credentials = b.directory + ".cred"
        defer { try? FileManager.default.removeItem(atPath: credentials) }
        try Data("admin:\(b.node.adminKey.value)\n".utf8).write(to: URL(fileURLWithPath: credentials))
        var spec = ReplicationSpec(id: "to-b", couchURL: b.ready.couchURL + "ferry")
        spec.couch?.credentialsFile = credentials
        let a = try await InProcessNode.start({
            $0.discovery = false
            $0.replications = [spec]
        })
        let fromA = try DocumentID("from-a"), fromB = try DocumentID("from-b")
        let revA = try a.node.store.put(fromA, body: ["v": 1])
        try await waitUntil("B has A's write") { try b.node.store.document(fromA)?.revision == revA }
        let revB = try b.node.store.put(fromB, body: ["v": 2])
        try await waitUntil("A has B's write") { try a.node.store.document(fromB)?.revision == revB }
        // An edit and a delete made on B come back to A unchanged.
        let edited = try b.node.store.put(fromA, body: ["v": 3], parent: revA)
        try await waitUntil("A has B's edit") { try a.node.store.document(fromA)?.revision == edited }
        _ = try b.node.store.delete(fromB, revision: revB)
        try await waitUntil("A has B's delete") { try a.node.store.document(fromB)?.deleted == true }
        // The same revisions on both sides: leaves, deleted flags and the winner's history (a
        // CouchDB hop carries no hybrid logical clock, so the trees' timestamps may differ).
        func shape(_ n: InProcessNode, _ id: DocumentID) throws -> [String] {
            guard let tree = try n.node.store.revisionTree(id), let winner = tree.winner else { return [] }
            return tree.leaves.map { "\($0.id) \($0.deleted)" }.sorted() + tree.history(of: winner.id).map(\.description)
        }
        #expect(try shape(a, fromA) == shape(b, fromA) && !shape(a, fromA).isEmpty)
        #expect(try shape(a, fromB) == shape(b, fromB) && !shape(a, fromB).isEmpty)
        let status = try #require(try await Self.list(a).first?["status"])
        #expect(status["pushed"]?.intValue ?? 0 >= 1 && status["pulled"]?.intValue ?? 0 >= 2)
        #expect(status["error"] == .null)
        await a.stop()
        await b.stop()
    }
}
