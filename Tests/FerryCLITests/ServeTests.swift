import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// A `ferry serve` child process with its own data directory.
final class ServeProcess: @unchecked Sendable {
    // @unchecked: driven by one test at a time.
    let cli: FerryCLI
    var process: ChildProcess?
    let log: String

    init(cli: FerryCLI = FerryCLI()) {
        self.cli = cli
        log = cli.dataDirectory + ".log"
    }

    var id: String {
        get async { (try? await cli.run(["id"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? "" }
    }
    var pid: Int32? { process?.pid }

    /// Starts `ferry serve --port 0 …` and waits until node.json names it (not a fixed sleep).
    func start(_ extra: [String] = [], environment: [String: String] = [:], portFlags: Bool = true) async throws -> JSON {
        try? FileManager.default.removeItem(atPath: cli.dataDirectory + "/node.json")
        // Ephemeral ports (unless the test passes its own), and no DNS-SD unless a test asks for it (--discovery).
        let discovery = extra.contains("--discovery") ? [] : ["--no-discovery"]
        let ports = portFlags ? ["--port", "0", "--admin-port", "0", "--couch-port", "0"] : []
        let args = ["serve"] + ports + ["--interface", "127.0.0.1", "--data", cli.dataDirectory] + discovery + extra
        let env = ProcessInfo.processInfo.environment.filter { $0.key != "FERRY_DATA" }.merging(environment) { _, new in new }
        let p = try ChildProcess.spawn(FerryCLI.binary, args, environment: env, stdoutPath: log, stderrPath: log)
        process = p
        var info: JSON?
        let ready = try await eventually(60) {
            if let data = FileManager.default.contents(atPath: cli.dataDirectory + "/node.json"),
                let json = try? JSON.parse(Array(data)), json["pid"]?.intValue == Int64(p.pid)
            {
                info = json
                return true
            }
            if !p.isRunning { throw CLIFailure("ferry serve exited early: \(logText)") }
            return false
        }
        guard ready, let info else { throw CLIFailure("ferry serve did not become ready: \(logText)") }
        return info
    }

    var logText: String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }

    /// Signals the node and waits for its exit status (SIGKILLed, 137, if it hangs 60 s).
    func stop(signal sig: Int32 = SIGTERM) async -> Int32 {
        guard let p = process else { return -1 }
        let status = await p.stop(sig, grace: 60).status
        process = nil
        return status
    }

    deinit {
        process?.signal(SIGKILL)
        cli.cleanUp()
        try? FileManager.default.removeItem(atPath: log)
    }
}

struct CLIFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct ServeTests {
    @Test func twoServeProcessesConvergeAndRecoverFromSIGKILL() async throws {
        let a = ServeProcess()
        let b = ServeProcess()
        let idA = await a.id
        let idB = await b.id
        let infoA = try await a.start(["--trust", idB])
        let urlA = try #require(infoA["url"]?.stringValue)
        #expect(infoA["id"]?.stringValue == idA)
        _ = try await b.start(["--peer", "\(urlA)#\(idA)"])
        try await a.cli.run(["put", "from-a", #"{"v":1}"#])
        try await b.cli.run(["put", "from-b", #"{"v":2}"#])
        #expect(try await eventually {
            let aHasB = try await a.cli.run(["get", "from-b"]).status == 0
            let bHasA = try await b.cli.run(["get", "from-a"]).status == 0
            return aHasB && bHasA
        })
        // Kill A hard, edit B, restart A on the same port (B keeps dialling A's URL).
        _ = await a.stop(signal: SIGKILL)
        try await b.cli.run(["put", "while-a-was-down", #"{"v":3}"#])
        let port = try #require(infoA["port"]?.intValue)
        let restarted = ServeProcess(cli: a.cli)
        _ = try await restarted.startOnPort(Int(port), ["--trust", idB])
        #expect(try await eventually { try await a.cli.run(["get", "while-a-was-down"]).status == 0 })
        #expect(try await a.cli.run(["check", "--json"]).json()["ok"] == true)
        #expect(await restarted.stop() == 0)
        #expect(await b.stop() == 0)
        #expect(!FileManager.default.fileExists(atPath: b.cli.dataDirectory + "/node.json"))
    }

    @Test func aSecondServeOnTheSameDataDirectoryFailsAtOnce() async throws {
        let a = ServeProcess()
        _ = try await a.start()
        let second = try await a.cli.run(["serve", "--port", "0"])
        #expect(second.status == 1)
        #expect(second.stderr.contains("already running"))
        #expect(await a.stop() == 0)
    }

    @Test func theBannerSaysDiscoveryIsUnavailableWithoutAvahi() async throws {
        // No D-Bus system bus at this address: the compat library cannot reach avahi-daemon.
        let node = ServeProcess()
        _ = try await node.start(["--discovery"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"])
        try await waitUntil("the banner is printed") { node.logText.contains("Ctrl-C stops.") }
        let line = node.logText.split(separator: "\n").first { $0.hasPrefix("discovery:") }.map(String.init)
        #expect(line?.hasPrefix("discovery: DNS-SD unavailable (") == true, "\(node.logText)")
        #expect(line?.hasSuffix("); static peers (--peer) and group members are dialled at their known addresses, retrying in the background") == true, "\(node.logText)")
        // `ferry peers` says why it lists no one, and what to do.
        let peers = try await node.cli.run(["peers"])
        #expect(peers.stdout.contains("peers: none seen yet\ndiscovery: DNS-SD unavailable ("), "\(peers.stdout)")
        #expect(peers.stdout.contains("start avahi-daemon"), "\(peers.stdout)")
        #expect(peers.stdout.contains("`ferry join CODE`"), "\(peers.stdout)")
        #expect(await node.stop() == 0)
    }

    @Test func peersSayDiscoveryIsOffWhenItIsAndNoOneIsKnown() async throws {
        let node = ServeProcess()
        _ = try await node.start()
        let peers = try await node.cli.run(["peers"])
        #expect(peers.stdout.contains("peers: none seen yet\ndiscovery: off (--no-discovery); add a peer with `ferry serve --peer"), "\(peers.stdout)")
        #expect(await node.stop() == 0)
    }

    @Test func syncOverWSSWithAPinAndRefusalOfAWrongPin() async throws {
        let server = ServeProcess()
        let client = FerryCLI()
        defer { client.cleanUp() }
        let clientID = try await client.run(["id"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let info = try await server.start(["--trust", clientID])
        let url = try #require(info["url"]?.stringValue)
        try await server.cli.run(["put", "remote-doc", #"{"v":1}"#])
        let ok = try await client.run(["sync", url, "--pin", await server.id, "--json"])
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(try ok.json()["pulled"] == 1)
        let wrong = try await client.run(["sync", url, "--pin", String(repeating: "ab", count: 32)])
        #expect(wrong.status == 1)
        #expect(wrong.stderr.contains("not the pinned one"))
        _ = await server.stop()
    }

    @Test func unixSocketAndStdioEndpointsReplicateBetweenProcesses() async throws {
        let server = ServeProcess()
        let socket = NSTemporaryDirectory() + "ferry-\(UUID().uuidString.prefix(8)).sock"
        _ = try await server.start(["--unix", socket])
        try await server.cli.run(["put", "via-unix", #"{"v":1}"#])
        let client = FerryCLI()
        defer { client.cleanUp() }
        try await client.run(["put", "from-client", "{}"])
        let r = try await client.run(["sync", "unix:\(socket)", "--json"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(try await client.run(["get", "via-unix"]).status == 0)
        #expect(try await server.cli.run(["get", "from-client"]).status == 0)
        _ = await server.stop()
        // stdio: the other side is a child `ferry serve --stdio` on its own data directory.
        let other = FerryCLI()
        defer { other.cleanUp() }
        try await other.run(["put", "via-stdio", "{}"])
        let command = "\(FerryCLI.binary) --data \(other.dataDirectory) serve --stdio"
        let s = try await client.run(["sync", "--exec", command, "--json"])
        #expect(s.status == 0, "\(s.stderr)")
        #expect(try await client.run(["get", "via-stdio"]).status == 0)
        #expect(try await other.run(["get", "via-unix"]).status == 0)
    }

    @Test func aClientThatKeepsFailingTheHandshakeIsWarnedAboutOnceWithItsAddress() async throws {
        let server = ServeProcess()
        let info = try await server.start()
        let port = try #require(info["port"]?.intValue)
        // Five clients without a certificate, as a scanner or a misconfigured peer would.
        for _ in 0..<5 {
            _ = await shell("echo | timeout 10 openssl s_client -connect 127.0.0.1:\(port) >/dev/null 2>&1")
        }
        _ = await server.stop()
        let warnings = server.logText.split(separator: "\n").filter { $0.contains("warning") && $0.contains("connection refused during handshake") }
        #expect(warnings.count == 1, "\(server.logText)")
        #expect(warnings.first?.contains("remote=127.0.0.1") == true, "\(server.logText)")
        #expect(warnings.first?.contains("no certificate") == true, "\(server.logText)")
    }

    @Test func opensslSeesTLS13AndTheCertificateOfFerryID() async throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl") else {
            Issue.record("openssl is not installed (make test installs it)")
            return
        }
        let server = ServeProcess()
        let client = FerryCLI()
        defer { client.cleanUp() }
        let clientID = try await client.run(["id"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let info = try await server.start(["--trust", clientID])
        let port = try #require(info["port"]?.intValue)
        let probe = await shell("""
            echo | openssl s_client -connect 127.0.0.1:\(port) -cert \(client.dataDirectory)/identity/cert.pem \\
              -key \(client.dataDirectory)/identity/key.pem 2>/dev/null > \(client.dataDirectory)/s_client.txt; \\
            openssl x509 -in \(client.dataDirectory)/s_client.txt -outform DER | sha256sum
            """)
        let fingerprint = probe.output
        let transcript = (try? String(contentsOfFile: client.dataDirectory + "/s_client.txt", encoding: .utf8)) ?? ""
        #expect(transcript.contains("TLSv1.3"))
        #expect(fingerprint.hasPrefix(await server.id))
        _ = await server.stop()
    }
}

extension ServeProcess {
    /// Starts on a fixed port (a restart keeps the address peers dial).
    func startOnPort(_ port: Int, _ extra: [String]) async throws -> JSON {
        try await start(["--port", String(port)] + extra)
    }
}
