import FerryCore
import FerryStore
import Foundation
import Testing

@Suite(.timeLimit(.minutes(10))) struct CLITests {
    @Test func putGetUpdateDeleteRoundTripWithJSONOutput() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let put = try await cli.run(["put", "order-1", #"{"item":"tea","qty":2}"#, "--json"])
        #expect(put.status == 0, "\(put.stderr)")
        let created = try put.json()
        #expect(created["id"] == "order-1")
        let rev1 = try #require(created["rev"]?.stringValue)
        #expect(rev1.hasPrefix("1-"))

        let got = try await cli.run(["get", "order-1", "--json"]).json()
        #expect(got == ["_id": "order-1", "_rev": .string(rev1), "item": "tea", "qty": 2])

        let update = try await cli.run(["put", "order-1", "-", "--rev", rev1, "--json"], stdin: #"{"item":"tea","qty":3}"#)
        #expect(update.status == 0, "\(update.stderr)")
        let rev2 = try #require(try update.json()["rev"]?.stringValue)
        #expect(rev2.hasPrefix("2-"))

        let withConflicts = try await cli.run(["get", "order-1", "--conflicts", "--json"]).json()
        #expect(withConflicts["_conflicts"] == .array([]))

        let old = try await cli.run(["get", "order-1", "--rev", rev1, "--json"]).json()
        #expect(old["qty"] == 2)

        let rm = try await cli.run(["rm", "order-1", "--rev", rev2, "--json"])
        #expect(rm.status == 0, "\(rm.stderr)")
        let tomb = try await cli.run(["get", "order-1", "--json"]).json()
        #expect(tomb["_deleted"] == true)
        #expect(try await cli.run(["ls", "--json"]).json() == .array([]))
    }

    @Test func compactRunsAndRemovesUnreferencedBlobs() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await cli.run(["put", "doc", #"{"v":1}"#])
        let file = NSTemporaryDirectory() + "ferry-orphan-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: file) }
        try Data("an orphan blob".utf8).write(to: URL(fileURLWithPath: file))
        try await cli.run(["blob", "put", file])
        let r = try await cli.run(["compact", "--blob-min-age", "0", "--json"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(try r.json()["blobsRemoved"] == 1)
        #expect(try await cli.run(["check"]).status == 0)
    }

    @Test func humanOutputPrintsTheRevision() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let put = try await cli.run(["put", "a", "{}"])
        #expect(put.status == 0)
        #expect(try RevisionID(put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)).generation == 1)
        let info = try await cli.run(["info"])
        #expect(info.stdout.contains("1 live"))
    }

    @Test func aStaleRevisionIsAConflictAndWritesNothing() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let rev1 = try #require(try await cli.run(["put", "d", #"{"v":1}"#, "--json"]).json()["rev"]?.stringValue)
        try await cli.run(["put", "d", #"{"v":2}"#, "--rev", rev1])
        let stale = try await cli.run(["put", "d", #"{"v":3}"#, "--rev", rev1])
        #expect(stale.status == 4)
        #expect(stale.stderr.contains("conflict"))
        #expect(stale.stderr.split(separator: "\n").count == 1)
        let missing = try await cli.run(["put", "d", #"{"v":3}"#])
        #expect(missing.status == 4)
        #expect(try await cli.run(["info", "--json"]).json()["lastSequence"] == 2)
    }

    @Test func invalidJSONSaysWhereAndWritesNothing() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let bad = try await cli.run(["put", "d", "{\"a\": [1, 2,, 3]}"])
        #expect(bad.status == 1)
        #expect(bad.stderr.contains("invalid JSON at line 1, column 13"), "\(bad.stderr)")
        #expect(bad.stdout.isEmpty)
        for args in [["put", "_hidden", "{}"], ["put", "x", "[1]"], ["put", "x", #"{"_x":1}"#], ["rm", "x", "--rev", "nope"]] {
            let r = try await cli.run(args)
            #expect(r.status != 0, "\(args)")
            #expect(r.stderr.hasPrefix("ferry: "), "\(args): \(r.stderr)")
        }
        #expect(try await cli.run(["info", "--json"]).json()["docCount"] == 0)
        #expect(try await cli.run(["get", "nothing"]).status == 3)
    }

    @Test func changesFeedAndInfoReportSequences() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let r = try #require(try await cli.run(["put", "a", "{}", "--json"]).json()["rev"]?.stringValue)
        try await cli.run(["put", "b", "{}"])
        try await cli.run(["put", "a", #"{"x":1}"#, "--rev", r])
        let changes = try await cli.run(["changes", "--json"]).json()
        let ids = changes["results"].flatMap { if case .array(let a) = $0 { a.map { $0["id"] } } else { nil } }
        #expect(ids == ["b", "a"])
        #expect(changes["last_seq"] == 3)
        let since = try await cli.run(["changes", "--since", "2", "--json"]).json()
        #expect(since["results"].map { if case .array(let a) = $0 { a.count } else { -1 } } == 1)
        let info = try await cli.run(["info", "--json"]).json()
        #expect(info["docCount"] == 2)
        #expect(info["lastSequence"] == 3)
        #expect(info["uuid"]?.stringValue?.count == 36)
    }

    @Test func dataDirectoryComesFromFlagThenEnvironment() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let env = try await cli.run(["put", "x", "{}"], environment: ["FERRY_DATA": cli.dataDirectory], useDataFlag: false)
        #expect(env.status == 0, "\(env.stderr)")
        #expect(try await cli.run(["info", "--json"]).json()["docCount"] == 1)
        #expect(FileManager.default.fileExists(atPath: cli.dataDirectory + "/ferry.sqlite"))
    }

    @Test func blobsRoundTripThroughTheCLI() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let file = NSTemporaryDirectory() + "ferry-blob-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: file) }
        FileManager.default.createFile(atPath: file, contents: Data("photo bytes".utf8))
        let ref = try await cli.run(["blob", "put", file, "--content-type", "image/jpeg"]).json()
        let digest = try #require(ref["digest"]?.stringValue)
        #expect(ref["length"] == 11)
        let doc = JSON.object(["photo": ref]).canonicalString
        #expect(try await cli.run(["put", "with-photo", doc]).status == 0)
        let out = try await cli.run(["blob", "get", digest])
        #expect(out.stdout == "photo bytes")
        let missing = try await cli.run(["blob", "get", "sha256-" + String(repeating: "0", count: 64)])
        #expect(missing.status == 3)
        let dangling = JSON.object(["photo": BlobReference(digest: try BlobDigest("sha256-" + String(repeating: "1", count: 64)), length: 1).json])
        let r = try await cli.run(["put", "dangling", dangling.canonicalString])
        #expect(r.status == 1)
        #expect(r.stderr.contains("missing blob"))
    }

    @Test func importIsAllOrNothingByDefault() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let ok = try await cli.run(["import", "--json"], stdin: "{\"_id\":\"a\",\"v\":1}\n\n{\"_id\":\"b\",\"v\":2}\n")
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(try ok.json()["imported"] == 2)
        let bad = try await cli.run(["import"], stdin: "{\"_id\":\"c\"}\n{\"_id\":\"d\",}\n")
        #expect(bad.status == 1)
        #expect(bad.stderr.contains("line 2"))
        #expect(try await cli.run(["info", "--json"]).json()["docCount"] == 2)
    }

    @Test func conflictsAndPurgeAreListedAndApplied() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        // Make a conflict the way replication would: insert a sibling revision with history.
        do {
            let store = try DocumentStore.open(directory: cli.dataDirectory)
            let base = try store.put(try DocumentID("c"), body: ["v": 0])
            _ = try store.put(try DocumentID("c"), body: ["v": 1], parent: base)
            let sibling = RevisionID.compute(parent: base, deleted: false, canonicalBody: JSON.object(["v": 2]).canonicalBytes)
            let outcome = try store.insertRevisions([
                IncomingRevision(id: try DocumentID("c"), revision: sibling, history: [base], deleted: false, body: ["v": 2])
            ])
            #expect(outcome.count == 1)
        }
        let conflicts = try await cli.run(["conflicts", "--json"]).json()
        guard case .array(let entries) = conflicts, entries.count == 1 else {
            Issue.record("expected one conflicted document, got \(conflicts)")
            return
        }
        #expect(entries[0]["id"] == "c")
        let purge = try await cli.run(["purge", "c", "--json"])
        #expect(try purge.json() == ["id": "c", "purged": true])
        #expect(try await cli.run(["get", "c"]).status == 3)
        #expect(try await cli.run(["purge", "c"]).status == 3)
        #expect(try await cli.run(["check", "--json"]).json()["ok"] == true)
    }
}
