import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// `ferry find` and `ferry index` through the real binary: on the database directly, and
/// through a running `ferry serve`'s CouchDB API.
@Suite struct FindCLITests {
    static let noIndex = "No matching index found"

    /// Three documents with mixed `n` values.
    func seed(_ cli: FerryCLI) async throws {
        for (id, body) in [("a", #"{"n":1,"s":"x"}"#), ("b", #"{"n":2,"s":"y"}"#), ("c", #"{"n":"3"}"#), ("d", #"{"other":1}"#)] {
            let r = try await cli.run(["put", id, body])
            #expect(r.status == 0, "\(r.stderr)")
        }
    }

    func lines(_ text: String) -> [String] { text.split(separator: "\n").map(String.init) }

    @Test func findOnTheDatabaseDirectlyPrintsOneDocumentPerLineAndTheWarning() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await seed(cli)
        let r = try await cli.run(["find", #"{"n":{"$gt":1}}"#, "--fields", "_id,n"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(lines(r.stdout) == [#"{"_id":"b","n":2}"#, #"{"_id":"c","n":"3"}"#])
        #expect(r.stderr.contains(Self.noIndex))

        let json = try await cli.run(["find", #"{"n":{"$gte":1}}"#, "--limit", "1", "--skip", "1", "--json", "--stats"])
        #expect(json.status == 0, "\(json.stderr)")
        let answer = try json.json()
        if case .array(let docs)? = answer["docs"] { #expect(docs.map { $0["_id"] } == ["b"]) } else { Issue.record("no docs") }
        #expect(answer["execution_stats"]?["results_returned"] == 1)
        let bookmark = answer["bookmark"]?.stringValue ?? ""
        let next = try await cli.run(["find", #"{"n":{"$gte":1}}"#, "--bookmark", bookmark, "--fields", "_id"])
        #expect(lines(next.stdout) == [#"{"_id":"c"}"#])
    }

    @Test func badSelectorsExitOneWithTheReason() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await seed(cli)
        let op = try await cli.run(["find", #"{"n":{"$foo":1}}"#])
        #expect(op.status == 1)
        #expect(op.stderr.contains("invalid_operator"))
        #expect(op.stdout.isEmpty)
        let notJSON = try await cli.run(["find", #"{"n":"#])
        #expect(notJSON.status == 1)
        let sort = try await cli.run(["find", #"{"n":1}"#, "--sort", "n:desc"])
        #expect(sort.status == 1)
        #expect(sort.stderr.contains("no_usable_index"))
    }

    @Test func indexAddListAndRemoveOnTheDatabaseDirectly() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await seed(cli)
        let add = try await cli.run(["index", "add", "n", "--name", "by-n", "--ddoc", "q", "--json"])
        #expect(add.status == 0, "\(add.stderr)")
        #expect(try add.json() == ["result": "created", "id": "_design/q", "name": "by-n"])
        let ls = try await cli.run(["index", "ls"])
        #expect(lines(ls.stdout) == ["-\t_all_docs\t_id\tready", "_design/q\tby-n\tn\tready"])
        let sorted = try await cli.run(["find", #"{"n":{"$gt":0}}"#, "--sort", "n:desc", "--fields", "_id"])
        #expect(sorted.status == 0, "\(sorted.stderr)")
        #expect(lines(sorted.stdout) == [#"{"_id":"c"}"#, #"{"_id":"b"}"#, #"{"_id":"a"}"#])
        #expect(!sorted.stderr.contains(Self.noIndex))
        let rm = try await cli.run(["index", "rm", "q", "by-n"])
        #expect(rm.status == 0, "\(rm.stderr)")
        #expect(lines(try await cli.run(["index", "ls"]).stdout) == ["-\t_all_docs\t_id\tready"])
        let again = try await cli.run(["index", "rm", "q", "by-n"])
        #expect(again.status == 3)
    }

    @Test func findAndIndexGoThroughARunningNode() async throws {
        let server = ServeProcess()
        _ = try await server.start()
        try await seed(server.cli)
        let add = try await server.cli.run(["index", "add", "s", "--name", "by-s", "--ddoc", "q"])
        #expect(add.status == 0, "\(add.stderr)")
        #expect(add.stdout.hasPrefix("created\t_design/q\tby-s"))
        let ls = try await server.cli.run(["index", "ls", "--json"])
        #expect(ls.status == 0, "\(ls.stderr)")
        #expect(try ls.json()["total_rows"] == 2)
        let r = try await server.cli.run(["find", #"{"s":{"$gte":"x"}}"#, "--sort", "s", "--fields", "_id,s"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(lines(r.stdout) == [#"{"_id":"a","s":"x"}"#, #"{"_id":"b","s":"y"}"#])
        let scan = try await server.cli.run(["find", #"{"n":2}"#, "--fields", "_id"])
        #expect(lines(scan.stdout) == [#"{"_id":"b"}"#])
        #expect(scan.stderr.contains(Self.noIndex))
        let bad = try await server.cli.run(["find", #"{"n":{"$foo":1}}"#])
        #expect(bad.status == 1)
        #expect(bad.stderr.contains("invalid_operator"))
        #expect(try await server.cli.run(["index", "rm", "_design/q", "by-s"]).status == 0)
        #expect(try await server.cli.run(["index", "rm", "q", "by-s"]).status == 3)
        _ = await server.stop()
    }
}
