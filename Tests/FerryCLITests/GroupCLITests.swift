import FerryCore
import Foundation
import Testing

/// The group commands' own checks, before any node is asked.
@Suite struct GroupCLITests {
    @Test func groupCommandsNeedARunningNodeAndSayHowToStartOne() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        for args in [["invite"], ["join", "ferry1-AAAA"], ["group"], ["group", "remove", "b"]] {
            let r = try await cli.run(args)
            #expect(r.status == 1 && r.stderr.contains("no ferry serve is running"), "\(args): \(r.stderr)")
        }
    }

    @Test func aBadExpiryIsAUsageError() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        for bad in ["0s", "ten", "5x", "-1m"] {
            let r = try await cli.run(["invite", "--expires", bad])
            #expect(r.status == 64 && r.stderr.contains("--expires"), "\(bad): \(r.stderr)")
        }
        // Past the limit: named as the user types it, before any node is asked.
        for long in ["8d", "169h", "604801"] {
            let r = try await cli.run(["invite", "--expires", long])
            #expect(r.status == 64 && r.stderr.contains("at most 7d") && r.stderr.contains("--expires \(long)"), "\(long): \(r.stderr)")
        }
        #expect(try await cli.run(["invite", "--expires", "7d"]).stderr.contains("no ferry serve is running"))
    }

    /// A founder's member entry is a `_ferry/` document: `ls` hides it as `_all_docs` does,
    /// and shows it with `--internal`; `--limit` counts only what is shown.
    @Test func lsHidesTheGroupsOwnDocumentsUnlessAskedForThem() async throws {
        let node = ServeProcess()
        _ = try await node.start()
        for id in ["a", "b", "zz"] { #expect(try await node.cli.run(["put", id, "{}"]).status == 0) }
        #expect(try await node.cli.run(["invite"]).status == 0)
        #expect(await node.stop() == 0)
        let ids = { (r: FerryCLI.Result) in r.stdout.split(separator: "\n").map { String($0.split(separator: "\t")[0]) } }
        let plain = try await node.cli.run(["ls"])
        #expect(ids(plain) == ["a", "b", "zz"], "\(plain.stdout)")
        let all = try await node.cli.run(["ls", "--internal"])
        #expect(ids(all).contains { $0.hasPrefix("_ferry/members/") } && ids(all).count == 4, "\(all.stdout)")
        #expect(ids(try await node.cli.run(["ls", "--limit", "3"])) == ["a", "b", "zz"])
    }

    /// A short or mistyped ID is a usage error naming it, before any node is asked.
    @Test func trustAddOfSomethingThatIsNoNodeIDSaysWhatAnIDIs() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let r = try await cli.run(["trust", "add", "abcd"])
        #expect(r.status == 64, "\(r.stderr)")
        #expect(r.stderr.hasPrefix("ferry: abcd: a node ID is 64 hex digits (see `ferry id`)"), "\(r.stderr)")
    }
}
