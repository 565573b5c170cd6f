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

    /// A node that holds its lock but whose admin API does not answer (a port nothing
    /// listens on): the CLI says so in words, exits 1, and writes nothing behind its back.
    @Test func aNodeWhoseAdminAPIDoesNotAnswerIsNamedWithTheSystemsReason() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        #expect(try await cli.run(["put", "--create", "a", #"{"n":1}"#]).status == 0)
        try "k".write(toFile: cli.dataDirectory + "/admin.key", atomically: true, encoding: .utf8)
        let lock = open(cli.dataDirectory + "/serve.lock", O_RDWR | O_CREAT | O_TRUNC, 0o644)
        defer { close(lock) }
        #expect(lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) == 0)
        let pid = "\(getpid())"
        _ = pid.withCString { write(lock, $0, strlen($0)) }
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        try #"{"adminURL":"http://127.0.0.1:1","pid":\#(pid)}"#.write(toFile: cli.dataDirectory + "/node.json", atomically: true, encoding: .utf8)
        for command in [["peers"], ["put", "b", #"{"n":2}"#]] {
            // Killed after 30 s: a client that retried the refused connection would still wait.
            let r = try await cli.run(command, timeout: 30)
            #expect(r.status == 1, "\(command): \(r.stderr)")
            #expect(r.stderr == "ferry: the node's admin API at http://127.0.0.1:1 did not answer: Connection refused\n", "\(command): \(r.stderr)")
        }
        flock(lock, LOCK_UN)
        let listed = try await cli.run(["ls"])
        #expect(listed.stdout.contains("a\t") && !listed.stdout.contains("b\t"), "\(listed.stdout)")
    }
}
