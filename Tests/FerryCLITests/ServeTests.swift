import FerryCore
import Foundation
import Testing

/// A `ferry serve` child process with its own data directory.
final class ServeProcess: @unchecked Sendable {
    let cli: FerryCLI
    var process: Process?
    let log: String

    init(cli: FerryCLI = FerryCLI()) {
        self.cli = cli
        log = cli.dataDirectory + ".log"
    }

    var id: String { (try? cli.run(["id"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? "" }
    var pid: Int32? { process?.processIdentifier }

    /// Starts `ferry serve --port 0 …` and waits until node.json appears (not a fixed sleep).
    func start(_ extra: [String] = [], environment: [String: String] = [:]) throws -> JSON {
        try? FileManager.default.removeItem(atPath: cli.dataDirectory + "/node.json")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: FerryCLI.binary)
        // Ephemeral ports, and no DNS-SD unless a test asks for it (--discovery).
        let discovery = extra.contains("--discovery") ? [] : ["--no-discovery"]
        p.arguments = ["serve", "--port", "0", "--admin-port", "0", "--interface", "127.0.0.1", "--data", cli.dataDirectory] + discovery + extra
        if !environment.isEmpty {
            p.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        }
        if !FileManager.default.fileExists(atPath: log) { FileManager.default.createFile(atPath: log, contents: nil) }
        let handle = FileHandle(forWritingAtPath: log)!
        handle.seekToEndOfFile()
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        process = p
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let data = FileManager.default.contents(atPath: cli.dataDirectory + "/node.json"),
                let info = try? JSON.parse(Array(data)), info["pid"]?.intValue == Int64(p.processIdentifier)
            {
                return info
            }
            if !p.isRunning { throw CLIFailure("ferry serve exited early: \(logText)") }
            usleep(50_000)
        }
        throw CLIFailure("ferry serve did not become ready: \(logText)")
    }

    var logText: String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }

    func stop(signal sig: Int32 = SIGTERM) -> Int32 {
        guard let p = process else { return -1 }
        kill(p.processIdentifier, sig)
        p.waitUntilExit()
        process = nil
        return p.terminationStatus
    }

    deinit {
        if let p = process, p.isRunning { kill(p.processIdentifier, SIGKILL) }
        cli.cleanUp()
        try? FileManager.default.removeItem(atPath: log)
    }
}

struct CLIFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// Polls `condition` until it holds or the deadline passes: waiting on state, never a fixed sleep.
func eventually(_ seconds: Double = 30, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return true }
        usleep(50_000)
    }
    return try condition()
}

@Suite(.serialized) struct ServeTests {
    @Test func twoServeProcessesConvergeAndRecoverFromSIGKILL() throws {
        let a = ServeProcess()
        let b = ServeProcess()
        let idA = a.id
        let idB = b.id
        let infoA = try a.start(["--trust", idB])
        let urlA = try #require(infoA["url"]?.stringValue)
        #expect(infoA["id"]?.stringValue == idA)
        _ = try b.start(["--peer", "\(urlA)#\(idA)"])
        try a.cli.run(["put", "from-a", #"{"v":1}"#])
        try b.cli.run(["put", "from-b", #"{"v":2}"#])
        #expect(try eventually { try a.cli.run(["get", "from-b"]).status == 0 && b.cli.run(["get", "from-a"]).status == 0 })
        // Kill A hard, edit B, restart A on the same port (B keeps dialling A's URL).
        _ = a.stop(signal: SIGKILL)
        try b.cli.run(["put", "while-a-was-down", #"{"v":3}"#])
        let port = try #require(infoA["port"]?.intValue)
        let restarted = ServeProcess(cli: a.cli)
        _ = try restarted.startOnPort(Int(port), ["--trust", idB])
        #expect(try eventually { try a.cli.run(["get", "while-a-was-down"]).status == 0 })
        #expect(try a.cli.run(["check", "--json"]).json()["ok"] == true)
        #expect(restarted.stop() == 0)
        #expect(b.stop() == 0)
        #expect(!FileManager.default.fileExists(atPath: b.cli.dataDirectory + "/node.json"))
    }

    @Test func aSecondServeOnTheSameDataDirectoryFailsAtOnce() throws {
        let a = ServeProcess()
        _ = try a.start()
        let second = try a.cli.run(["serve", "--port", "0"])
        #expect(second.status == 1)
        #expect(second.stderr.contains("already running"))
        #expect(a.stop() == 0)
    }

    @Test func syncOverWSSWithAPinAndRefusalOfAWrongPin() throws {
        let server = ServeProcess()
        let client = FerryCLI()
        defer { client.cleanUp() }
        let clientID = try client.run(["id"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let info = try server.start(["--trust", clientID])
        let url = try #require(info["url"]?.stringValue)
        try server.cli.run(["put", "remote-doc", #"{"v":1}"#])
        let ok = try client.run(["sync", url, "--pin", server.id, "--json"])
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(try ok.json()["pulled"] == 1)
        let wrong = try client.run(["sync", url, "--pin", String(repeating: "ab", count: 32)])
        #expect(wrong.status == 1)
        #expect(wrong.stderr.contains("not the pinned one"))
        _ = server.stop()
    }

    @Test func unixSocketAndStdioEndpointsReplicateBetweenProcesses() throws {
        let server = ServeProcess()
        let socket = NSTemporaryDirectory() + "ferry-\(UUID().uuidString.prefix(8)).sock"
        _ = try server.start(["--unix", socket])
        try server.cli.run(["put", "via-unix", #"{"v":1}"#])
        let client = FerryCLI()
        defer { client.cleanUp() }
        try client.run(["put", "from-client", "{}"])
        let r = try client.run(["sync", "unix:\(socket)", "--json"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(try client.run(["get", "via-unix"]).status == 0)
        #expect(try server.cli.run(["get", "from-client"]).status == 0)
        _ = server.stop()
        // stdio: the other side is a child `ferry serve --stdio` on its own data directory.
        let other = FerryCLI()
        defer { other.cleanUp() }
        try other.run(["put", "via-stdio", "{}"])
        let command = "\(FerryCLI.binary) --data \(other.dataDirectory) serve --stdio"
        let s = try client.run(["sync", "--exec", command, "--json"])
        #expect(s.status == 0, "\(s.stderr)")
        #expect(try client.run(["get", "via-stdio"]).status == 0)
        #expect(try other.run(["get", "via-unix"]).status == 0)
    }

    @Test func opensslSeesTLS13AndTheCertificateOfFerryID() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl") else {
            Issue.record("openssl is not installed (make test installs it)")
            return
        }
        let server = ServeProcess()
        let client = FerryCLI()
        defer { client.cleanUp() }
        let clientID = try client.run(["id"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let info = try server.start(["--trust", clientID])
        let port = try #require(info["port"]?.intValue)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/sh")
        p.arguments = ["-c", """
            echo | openssl s_client -connect 127.0.0.1:\(port) -cert \(client.dataDirectory)/identity/cert.pem \
              -key \(client.dataDirectory)/identity/key.pem 2>/dev/null > \(client.dataDirectory)/s_client.txt; \
            openssl x509 -in \(client.dataDirectory)/s_client.txt -outform DER | sha256sum
            """]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        let fingerprint = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        let transcript = (try? String(contentsOfFile: client.dataDirectory + "/s_client.txt", encoding: .utf8)) ?? ""
        #expect(transcript.contains("TLSv1.3"))
        #expect(fingerprint.hasPrefix(server.id))
        _ = server.stop()
    }
}

extension ServeProcess {
    /// Starts on a fixed port (a restart keeps the address peers dial).
    func startOnPort(_ port: Int, _ extra: [String]) throws -> JSON {
        try start(["--port", String(port)] + extra)
    }
}
