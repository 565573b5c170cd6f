import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// A trust or user change made while a node is starting (its lock held, no node.json yet)
/// waits for the node instead of writing a file the node has already read.
@Suite struct StartingNodeTests {
    @Test func aTrustChangeWaitsWhileANodeHoldsTheLockWithoutBeingReady() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        #expect(try await cli.run(["id"]).status == 0)
        // A node that has taken the lock and not yet written node.json.
        let lock = open(cli.dataDirectory + "/serve.lock", O_RDWR | O_CREAT, 0o644)
        #expect(lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) == 0)
        let id = String(repeating: "ab", count: 32)
        let add = Task { try await cli.run(["trust", "add", id]) }
        // Long enough for a CLI that does not wait to have written the file.
        try await Task.sleep(for: .seconds(2))
        #expect(!FileManager.default.fileExists(atPath: cli.dataDirectory + "/trust.json"), "written behind a starting node's back")
        // The "node" gives up before becoming ready: the CLI then writes the file itself.
        flock(lock, LOCK_UN)
        close(lock)
        let result = try await add.value
        #expect(result.status == 0, "\(result.stderr)")
        #expect(((try? String(contentsOfFile: cli.dataDirectory + "/trust.json", encoding: .utf8)) ?? "").contains(id))
    }
}
