import FerryCore
import Foundation
import Testing

@Suite struct SyncCLITests {
    @Test func syncBetweenDataDirectoriesConvergesAndASecondRunTransfersNothing() throws {
        let a = FerryCLI()
        let b = FerryCLI()
        defer {
            a.cleanUp()
            b.cleanUp()
        }
        try a.run(["put", "from-a", #"{"v":1}"#])
        try b.run(["put", "from-b", #"{"v":2}"#])
        let first = try a.run(["sync", b.dataDirectory, "--json"])
        #expect(first.status == 0, "\(first.stderr)")
        let summary = try first.json()
        #expect(summary["pushed"] == 1)
        #expect(summary["pulled"] == 1)
        for key in ["rejected", "conflicts", "bytesSent", "bytesReceived", "deltasSent"] {
            #expect(summary[key]?.intValue != nil, "\(key)")
        }
        let second = try a.run(["sync", b.dataDirectory, "--json"]).json()
        #expect(second["pushed"] == 0)
        #expect(second["pulled"] == 0)
        #expect(try a.run(["ls", "--json"]).json() == b.run(["ls", "--json"]).json())
    }

    @Test func pushOnlyAndResolverFlagsWork() throws {
        let a = FerryCLI()
        let b = FerryCLI()
        defer {
            a.cleanUp()
            b.cleanUp()
        }
        let base = try #require(try a.run(["put", "doc", #"{"v":0}"#, "--json"]).json()["rev"]?.stringValue)
        #expect(try b.run(["info"]).status == 0)  // creates b's data directory
        #expect(try a.run(["sync", b.dataDirectory]).status == 0)
        #expect(try a.run(["put", "doc", #"{"v":1}"#, "--rev", base]).status == 0)
        #expect(try b.run(["put", "doc", #"{"v":2}"#, "--rev", base]).status == 0)
        let pushed = try a.run(["sync", b.dataDirectory, "--push", "--json"]).json()
        #expect(pushed["pushed"] == 1)
        #expect(pushed["pulled"] == 0)
        let conflicts = try b.run(["conflicts", "--json"]).json()
        #expect(conflicts.canonicalString.contains("\"doc\""))
        let resolved = try a.run(["sync", b.dataDirectory, "--resolve", "deletesWin", "--json"])
        #expect(resolved.status == 0, "\(resolved.stderr)")
        #expect(try resolved.json()["resolved"]?.intValue ?? 0 > 0)
        #expect(try a.run(["conflicts", "--json"]).json() == .array([]))
        #expect(try a.run(["get", "doc", "--json"]).json() == b.run(["get", "doc", "--json"]).json())
    }

    @Test func badSyncArgumentsAreClearErrors() throws {
        let a = FerryCLI()
        defer { a.cleanUp() }
        let missing = try a.run(["sync", "/nonexistent/ferry"])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("no directory"))
        let both = try a.run(["sync", "/tmp", "--push", "--pull"])
        #expect(both.status == 64)
        let resolver = try a.run(["sync", "/tmp", "--resolve", "coinflip"])
        #expect(resolver.status == 64)
        #expect(resolver.stderr.contains("coinflip"))
    }
}
