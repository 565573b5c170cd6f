import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The listener password of `serve` and `sync` comes from a private file or the environment,
/// never from the command line, where every local user can read it.
@Suite(.serialized, .timeLimit(.minutes(10))) struct ListenerPasswordCLITests {
    static func passwordFile(_ text: String, mode: Int) throws -> String {
        let path = NSTemporaryDirectory() + "ferry-password-\(UUID().uuidString)"
        try Data((text + "\n").utf8).write(to: URL(fileURLWithPath: path))
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
        return path
    }

    @Test func aPasswordInTheCommandLineIsRefusedWithWhereToPutIt() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        for args in [
            ["serve", "--no-discovery", "--password", "peer:s3cret"],
            ["sync", "wss://127.0.0.1:1/ferry/sync", "--pin", String(repeating: "ab", count: 32), "--password", "peer:s3cret"],
        ] {
            let r = try await cli.run(args)
            #expect(r.status == 64, "\(args): \(r.stderr)")
            #expect(r.stderr.contains("--password-file") && r.stderr.contains("FERRY_PASSWORD"), "\(args): \(r.stderr)")
            #expect(!r.stderr.contains("s3cret"), "\(args): \(r.stderr)")
        }
    }

    @Test func aPasswordFileOthersMayReadIsRefusedAsSSHRefusesAKey() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        for mode in [0o644, 0o640, 0o604] {
            let file = try Self.passwordFile("peer:s3cret", mode: mode)
            defer { try? FileManager.default.removeItem(atPath: file) }
            let r = try await cli.run(["serve", "--no-discovery", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--password-file", file])
            #expect(r.status == 64, "mode \(String(mode, radix: 8)): \(r.stderr)")
            #expect(r.stderr.contains("readable by others") && r.stderr.contains("chmod 600 \(file)"), "\(r.stderr)")
        }
        let malformed = try Self.passwordFile("no-colon-here", mode: 0o600)
        defer { try? FileManager.default.removeItem(atPath: malformed) }
        let r = try await cli.run(["serve", "--no-discovery", "--password-file", malformed])
        #expect(r.status == 64 && r.stderr.contains("USER:PASSWORD") && !r.stderr.contains("no-colon-here"), "\(r.stderr)")
    }

    @Test func theEnvironmentAndAPrivateFileCarryThePasswordOnBothSides() async throws {
        let server = ServeProcess()
        let client = FerryCLI()
        defer { client.cleanUp() }
        let info = try await server.start([], environment: ["FERRY_PASSWORD": "peer:s3cret-env"])
        let url = try #require(info["url"]?.stringValue)
        try await server.cli.run(["put", "remote-doc", #"{"v":1}"#])
        let pin = await server.id
        let ok = try await client.run(["sync", url, "--pin", pin, "--json"], environment: ["FERRY_PASSWORD": "peer:s3cret-env"])
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(try ok.json()["pulled"] == 1)
        let file = try Self.passwordFile("peer:s3cret-env", mode: 0o600)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let fromFile = try await client.run(["sync", url, "--pin", pin, "--password-file", file])
        #expect(fromFile.status == 0, "\(fromFile.stderr)")
        let wrong = try await client.run(["sync", url, "--pin", pin], environment: ["FERRY_PASSWORD": "peer:wrong"])
        #expect(wrong.status == 1, "\(wrong.stderr)")
        let none = try await client.run(["sync", url, "--pin", pin], environment: ["FERRY_PASSWORD": ""])
        #expect(none.status == 1, "\(none.stderr)")
        _ = await server.stop()
    }
}
