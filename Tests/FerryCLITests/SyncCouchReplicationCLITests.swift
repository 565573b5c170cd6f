import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// `ferry sync http(s)://…` and CouchDB replications of `ferry serve`, between real processes.
@Suite(.serialized, .timeLimit(.minutes(10))) struct SyncCouchReplicationCLITests {
    /// A file holding `admin:KEY` for a serve's CouchDB API.
    static func adminCredentials(_ info: JSON) throws -> String {
        let keyFile = try #require(info["adminKeyFile"]?.stringValue)
        let key = try String(contentsOfFile: keyFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let file = NSTemporaryDirectory() + "ferry-cred-\(UUID().uuidString)"
        try Data("admin:\(key)\n".utf8).write(to: URL(fileURLWithPath: file))
        return file
    }

    @Test func badCouchSyncArgumentsAreClearErrors() async throws {
        let a = FerryCLI()
        defer { a.cleanUp() }
        let pin = String(repeating: "ab", count: 32)
        let cases: [([String], String)] = [
            (["http://127.0.0.1:1/db", "--pin", pin], "https"),
            (["https://127.0.0.1:1/db", "--pin", "abc"], "64 hex"),
            (["http://u:p@127.0.0.1:1/db", "--credentials-file", "/x"], "already holds credentials"),
            (["http://127.0.0.1:1/db", "--credentials-file", "/x", "--credentials-env", "X"], "not both"),
            (["http://127.0.0.1:1/db", "--selector", #"{"$bogus":1}"#], "Mango"),
            (["http://127.0.0.1:1/db", "--selector", "type=note"], "JSON object"),
            (["http://127.0.0.1:1/db", "--pull", "--create-target"], "push"),
            (["http://127.0.0.1:1/db", "--doc-ids", ","], "--doc-ids"),
            (["http://127.0.0.1:1/", "--pull"], "names no database"),
            (["http://127.0.0.1:1/db", "--password", "u:p"], "--credentials-file"),
            (["/tmp", "--create-target"], "CouchDB targets"),
            (["/tmp", "--credentials-env", "X"], "CouchDB targets"),
        ]
        for (args, reason) in cases {
            let r = try await a.run(["sync"] + args)
            #expect(r.status == 64, "\(args): \(r.stderr)")
            #expect(r.stderr.contains(reason), "\(args): \(r.stderr)")
        }
        let missing = try await a.run(["sync", "http://127.0.0.1:1/db", "--credentials-file", "/nonexistent/cred"])
        #expect(missing.status == 1 && missing.stderr.contains("cannot read the credentials file /nonexistent/cred"), "\(missing.stderr)")
    }

    @Test func aFailedCouchSyncNeverShowsThePassword() async throws {
        let a = FerryCLI()
        defer { a.cleanUp() }
        // Nothing listens on port 1: the sync fails, and says so without the password.
        let r = try await a.run(["sync", "http://alice:Zq9-secret@127.0.0.1:1/db", "--pull"], environment: ["FERRY_LOG_LEVEL": "debug"])
        #expect(r.status == 1)
        #expect(r.stderr.contains("replication failed"), "\(r.stderr)")
        #expect(!r.stderr.contains("Zq9-secret") && !r.stdout.contains("Zq9-secret"))
    }

    @Test func ferryStatusListsACouchReplicationWithoutItsPasswordAndKeepsItAcrossARestart() async throws {
        let node = ServeProcess()
        let info = try await node.start()
        let api = AdminClient(nodeFile: info)
        let body = #"{"id":"hub","url":"http://alice:Zq9-secret@127.0.0.1:1/db","direction":"push"}"#
        let created = try await api.call("POST", "/replications", body: body)
        #expect(created.status == 201, "\(created.text)")
        try await waitUntil("the replication shows an error") {
            try await api.get("/replications")["replications"]?.first?["status"]?["error"]?.stringValue != nil
        }
        let status = try await node.cli.run(["status"])
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("hub  push http://alice:***@127.0.0.1:1/db (CouchDB)"), "\(status.stdout)")
        #expect(status.stdout.contains("error ("), "\(status.stdout)")
        let json = try await node.cli.run(["status", "--json"])
        #expect(try json.json()["replications"]?.first?["kind"] == "couchdb")
        for text in [status.stdout, json.stdout, node.logText] { #expect(!text.contains("Zq9-secret")) }
        #expect(await node.stop() == 0)
        let again = try await node.start()
        let listed = try await AdminClient(nodeFile: again).get("/replications")
        #expect(listed["replications"]?.first?["id"] == "hub" && listed["replications"]?.first?["source"] == "api")
        #expect(!node.logText.contains("Zq9-secret"))
        #expect(await node.stop() == 0)
    }

    /// Needs the CouchDB client (FerryCouch/Client) to replicate.
    @Test func syncWithAServesCouchDBAPIConvergesAndASecondRunTransfersNothing() async throws {
        let a = FerryCLI()
        defer { a.cleanUp() }
        let b = ServeProcess()
        let info = try await b.start()
        let credentials = try Self.adminCredentials(info)
        defer { try? FileManager.default.removeItem(atPath: credentials) }
        let url = try #require(info["couchURL"]?.stringValue) + "ferry"
        let apiB = AdminClient(nodeFile: info)
        try await a.run(["put", "from-a", #"{"v":1}"#])
        #expect(try await apiB.call("PUT", "/docs/from-b", body: #"{"v":2}"#).status < 300)
        let first = try await a.run(["sync", url, "--credentials-file", credentials, "--json"])
        #expect(first.status == 0, "\(first.stderr)")
        let firstSummary = try first.json()
        #expect(firstSummary["pushed"] == 1 && firstSummary["pulled"] == 1, "\(first.stdout)")
        let second = try await a.run(["sync", url, "--credentials-file", credentials, "--json"])
        #expect(second.status == 0, "\(second.stderr)")
        let secondSummary = try second.json()
        #expect(secondSummary["pushed"] == 0 && secondSummary["pulled"] == 0, "\(second.stdout)")
        let revB = try await apiB.get("/docs/from-a")["_rev"]
        let revA = try await a.run(["get", "from-a", "--json"]).json()["_rev"]
        #expect(revB != nil && revA == revB)
        // Only the selected documents move with --selector and --doc-ids.
        try await a.run(["put", "note-1", #"{"type":"note"}"#])
        try await a.run(["put", "task-1", #"{"type":"task"}"#])
        let selected = try await a.run(["sync", url, "--credentials-file", credentials, "--push", "--selector", #"{"type":"note"}"#, "--json"])
        #expect(selected.status == 0, "\(selected.stderr)")
        #expect(try selected.json()["pushed"] == 1)
        #expect(try await apiB.call("GET", "/docs/task-1").status == 404)
        let byID = try await a.run(["sync", url, "--credentials-file", credentials, "--push", "--doc-ids", "task-1", "--json"])
        #expect(byID.status == 0, "\(byID.stderr)")
        #expect(try byID.json()["pushed"] == 1)
        #expect(try await apiB.call("GET", "/docs/task-1").status == 200)
        #expect(await b.stop() == 0)
    }

    /// Needs the CouchDB client (FerryCouch/Client) to replicate.
    @Test func aWrongPasswordOrAMissingDatabaseSaysWhatToFix() async throws {
        let a = FerryCLI()
        defer { a.cleanUp() }
        let b = ServeProcess()
        let info = try await b.start()
        let base = try #require(info["couchURL"]?.stringValue).replacingOccurrences(of: "http://", with: "http://admin:Zq9-wrong@")
        let unauthorized = try await a.run(["sync", base + "ferry", "--pull"])
        #expect(unauthorized.status == 1)
        #expect(unauthorized.stderr.contains("check the user and password"), "\(unauthorized.stderr)")
        #expect(!unauthorized.stderr.contains("Zq9-wrong"))
        let credentials = try Self.adminCredentials(info)
        defer { try? FileManager.default.removeItem(atPath: credentials) }
        let missing = try await a.run(["sync", try #require(info["couchURL"]?.stringValue) + "nosuchdb", "--pull", "--credentials-file", credentials])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("--create-target"), "\(missing.stderr)")
        #expect(await b.stop() == 0)
    }
}
