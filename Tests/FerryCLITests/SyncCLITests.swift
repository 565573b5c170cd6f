import FerryCore
import Foundation
import Testing

@Suite(.timeLimit(.minutes(10))) struct SyncCLITests {
    @Test func syncBetweenDataDirectoriesConvergesAndASecondRunTransfersNothing() async throws {
        let a = FerryCLI()
        let b = FerryCLI()
        defer {
            a.cleanUp()
            b.cleanUp()
        }
        try await a.run(["put", "from-a", #"{"v":1}"#])
        try await b.run(["put", "from-b", #"{"v":2}"#])
        let first = try await a.run(["sync", b.dataDirectory, "--json"])
        #expect(first.status == 0, "\(first.stderr)")
        let summary = try first.json()
        #expect(summary["pushed"] == 1)
        #expect(summary["pulled"] == 1)
        for key in ["rejected", "conflicts", "bytesSent", "bytesReceived", "deltasSent"] {
            #expect(summary[key]?.intValue != nil, "\(key)")
        }
        let second = try await a.run(["sync", b.dataDirectory, "--json"]).json()
        #expect(second["pushed"] == 0)
        #expect(second["pulled"] == 0)
        #expect(try await a.run(["ls", "--json"]).json() == b.run(["ls", "--json"]).json())
    }

    @Test func pushOnlyAndResolverFlagsWork() async throws {
        let a = FerryCLI()
        let b = FerryCLI()
        defer {
            a.cleanUp()
            b.cleanUp()
        }
        let base = try #require(try await a.run(["put", "doc", #"{"v":0}"#, "--json"]).json()["rev"]?.stringValue)
        #expect(try await b.run(["id"]).status == 0)  // creates b's data directory
        #expect(try await a.run(["sync", b.dataDirectory]).status == 0)
        #expect(try await a.run(["put", "doc", #"{"v":1}"#, "--rev", base]).status == 0)
        #expect(try await b.run(["put", "doc", #"{"v":2}"#, "--rev", base]).status == 0)
        let pushed = try await a.run(["sync", b.dataDirectory, "--push", "--json"]).json()
        #expect(pushed["pushed"] == 1)
        #expect(pushed["pulled"] == 0)
        let conflicts = try await b.run(["conflicts", "--json"]).json()
        #expect(conflicts.canonicalString.contains("\"doc\""))
        let resolved = try await a.run(["sync", b.dataDirectory, "--resolve", "deletesWin", "--json"])
        #expect(resolved.status == 0, "\(resolved.stderr)")
        #expect(try resolved.json()["resolved"]?.intValue ?? 0 > 0)
        #expect(try await a.run(["conflicts", "--json"]).json() == .array([]))
        #expect(try await a.run(["get", "doc", "--json"]).json() == b.run(["get", "doc", "--json"]).json())
    }

    @Test func aSyncIntoAnEmptyDirectorySaysItStartedADatabaseThere() async throws {
        let a = FerryCLI()
        defer { a.cleanUp() }
        try await a.run(["put", "doc", #"{"v":1}"#])
        let empty = NSTemporaryDirectory() + "ferry-empty-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: empty) }
        let first = try await a.run(["sync", empty])
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stderr.contains("\(empty) held no Ferry database: started a new one there"), "\(first.stderr)")
        let second = try await a.run(["sync", empty])
        #expect(second.status == 0, "\(second.stderr)")
        #expect(!second.stderr.contains("held no Ferry database"), "\(second.stderr)")
    }

    @Test func badSyncArgumentsAreClearErrors() async throws {
        let a = FerryCLI()
        defer { a.cleanUp() }
        let missing = try await a.run(["sync", "/nonexistent/ferry"])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("no directory"))
        let both = try await a.run(["sync", "/tmp", "--push", "--pull"])
        #expect(both.status == 64)
        let resolver = try await a.run(["sync", "/tmp", "--resolve", "coinflip"])
        #expect(resolver.status == 64)
        #expect(resolver.stderr.contains("coinflip"))
    }
}
