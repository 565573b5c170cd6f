import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The `ferry:` lines a failed command wrote on stderr.
private func errorLines(_ r: FerryCLI.Result) -> [String] {
    r.stderr.split(separator: "\n").map(String.init).filter { $0.hasPrefix("ferry:") }
}

/// Everything a command wrote on stderr, line by line.
private func stderrLines(_ r: FerryCLI.Result) -> [String] {
    r.stderr.split(separator: "\n").map(String.init)
}

/// `ferry serve` stops on its own, with one line saying what failed, when a service
/// cannot start. Each run is bounded at 10 s so a hang fails instead of waiting for ever.
@Suite(.serialized, .timeLimit(.minutes(10))) struct ServeStartupFailureTests {
    @Test func aTakenAdminPortStopsServeWithOneLineSayingHowToFixIt() async throws {
        let holder = ServeProcess()
        let info = try await holder.start()
        let adminPort = try #require(info["adminPort"]?.intValue)
        let second = FerryCLI()
        defer { second.cleanUp() }
        let r = try await second.run(
            ["serve", "--port", "0", "--admin-port", String(adminPort), "--couch-port", "0", "--interface", "127.0.0.1", "--no-discovery"], timeout: 10)
        #expect(r.status == 1, "\(r.stderr)")
        #expect(stderrLines(r) == ["ferry: admin port \(adminPort) is in use (another ferry serve? pass --ports auto for free ports, or --admin-port 0)"], "\(r.stderr)")
        #expect(!r.stderr.contains("errno"), "\(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: second.dataDirectory + "/node.json"))
        #expect(await holder.stop() == 0)
    }

    @Test func aTakenListenerPortStopsServeWithOneLineSayingHowToFixIt() async throws {
        let holder = ServeProcess()
        let info = try await holder.start()
        let port = try #require(info["port"]?.intValue)
        let second = FerryCLI()
        defer { second.cleanUp() }
        let r = try await second.run(
            ["serve", "--port", String(port), "--admin-port", "0", "--couch-port", "0", "--interface", "127.0.0.1", "--no-discovery"], timeout: 10)
        #expect(r.status == 1, "\(r.stderr)")
        #expect(stderrLines(r) == ["ferry: port \(port) is in use (another ferry serve? pass --ports auto for free ports, or --port 0)"], "\(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: second.dataDirectory + "/node.json"))
        #expect(await holder.stop() == 0)
    }

    /// A second node started like the first (every port fixed and taken): one line names
    /// every clash and the one flag that avoids them, and `--ports auto` then starts it.
    @Test func everyTakenPortIsNamedInOneLineAndPortsAutoStartsASecondNode() async throws {
        let holder = ServeProcess()
        let info = try await holder.start()
        let (port, adminPort, couchPort) = (
            try #require(info["port"]?.intValue), try #require(info["adminPort"]?.intValue), try #require(info["couchPort"]?.intValue)
        )
        let second = FerryCLI()
        defer { second.cleanUp() }
        let fixed = ["--port", String(port), "--admin-port", String(adminPort), "--couch-port", String(couchPort)]
        let r = try await second.run(["serve"] + fixed + ["--interface", "127.0.0.1", "--no-discovery"], timeout: 10)
        #expect(r.status == 1, "\(r.stderr)")
        #expect(
            stderrLines(r) == [
                "ferry: port \(port), admin port \(adminPort), CouchDB API port \(couchPort) are in use "
                    + "(another ferry serve? pass --ports auto for free ports, or --port 0 --admin-port 0 --couch-port 0)"
            ], "\(r.stderr)")
        let auto = ServeProcess(cli: second)
        let started = try await auto.start(["--ports", "auto"], portFlags: false)
        for key in ["port", "adminPort", "couchPort"] {
            let chosen = started[key]?.intValue ?? 0
            #expect(chosen > 0 && ![4985, 4986, 4987, port, adminPort, couchPort].contains(chosen), "\(key): \(chosen)")
        }
        #expect(await auto.stop() == 0)
        let wrong = try await second.run(["serve", "--ports", "any"], timeout: 10)
        #expect(wrong.status == 64, "\(wrong.stderr)")
        // A usage error starts `ferry:` like every other error, with the usage after it.
        #expect(wrong.stderr.hasPrefix("ferry: --ports takes auto"), "\(wrong.stderr)")
        #expect(wrong.stderr.contains("Usage: ferry serve"), "\(wrong.stderr)")
        let unknown = try await second.run(["bogus"], timeout: 10)
        #expect(unknown.status == 64 && unknown.stderr.hasPrefix("ferry: unknown command 'bogus'"), "\(unknown.stderr)")
        #expect(await holder.stop() == 0)
    }

    @Test func aUnixSocketThatCannotBeBoundStopsServe() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let socket = "/nonexistent-\(UUID().uuidString.prefix(8))/ferry.sock"
        let r = try await cli.run(
            ["serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--interface", "127.0.0.1", "--no-discovery", "--unix", socket], timeout: 10)
        #expect(r.status == 1, "\(r.stderr)")
        let lines = stderrLines(r)
        #expect(lines.count == 1, "\(r.stderr)")
        #expect(lines.first?.hasPrefix("ferry: cannot listen on Unix socket \(socket)") == true, "\(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: cli.dataDirectory + "/node.json"))
    }

    @Test func aUnixSocketServedByAnotherNodeIsNotTakenOver() async throws {
        let socket = NSTemporaryDirectory() + "ferry-\(UUID().uuidString.prefix(8)).sock"
        let holder = ServeProcess()
        _ = try await holder.start(["--unix", socket])
        let second = FerryCLI()
        defer { second.cleanUp() }
        let r = try await second.run(
            ["serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--interface", "127.0.0.1", "--no-discovery", "--unix", socket], timeout: 10)
        #expect(r.status == 1, "\(r.stderr)")
        #expect(stderrLines(r) == ["ferry: Unix socket \(socket) is in use (another ferry serve? pass another --unix path)"], "\(r.stderr)")
        // The first node still serves it.
        let client = FerryCLI()
        defer { client.cleanUp() }
        try await client.run(["put", "x", "{}"])
        #expect(try await client.run(["sync", "unix:\(socket)"]).status == 0)
        #expect(await holder.stop() == 0)
    }

    @Test func anInterfaceThatIsNotOnThisMachineStopsServe() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        // 192.0.2.1 is TEST-NET-1: never an address of this machine.
        let r = try await cli.run(["serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--interface", "192.0.2.1", "--no-discovery"], timeout: 10)
        #expect(r.status == 1, "\(r.stderr)")
        #expect(
            stderrLines(r) == ["ferry: cannot listen on 192.0.2.1: not an address of this machine (pass --interface 0.0.0.0)"],
            "\(r.stderr)")
    }

    @Test func aSignalAtAnyPointOfStartUpEndsServeCleanlyAndPromptly() async throws {
        for run in 0..<30 {
            let cli = FerryCLI()
            defer { cli.cleanUp() }
            let log = cli.dataDirectory + ".log"
            defer { try? FileManager.default.removeItem(atPath: log) }
            let p = try ChildProcess.spawn(
                FerryCLI.binary,
                ["serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--interface", "127.0.0.1", "--no-discovery", "--data", cli.dataDirectory],
                stdoutPath: log, stderrPath: log)
            // Serve has begun once it holds the data directory's lock; the signal then comes a
            // little later on each run, so the runs cover start-up from there to ready.
            _ = await eventually(30, every: .milliseconds(1)) {
                FileManager.default.fileExists(atPath: cli.dataDirectory + "/serve.lock") || !p.isRunning
            }
            try await Task.sleep(for: .milliseconds(run * 4))
            let sig = run.isMultiple(of: 2) ? SIGTERM : SIGINT
            p.signal(sig)
            let status = await p.wait(timeout: 10)
            if status == nil {
                p.signal(SIGKILL)
                _ = await p.wait(timeout: 30)
            }
            let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            #expect(status == 0, "run \(run): signal \(sig) \(run * 4) ms into start-up gave \(status.map(String.init) ?? "no exit in 10 s"): \(output)")
            #expect(!FileManager.default.fileExists(atPath: cli.dataDirectory + "/node.json"), "run \(run)")
        }
    }

    @Test func sigtermDuringGracefulShutdownStillEndsTheNode() async throws {
        let node = ServeProcess()
        _ = try await node.start()
        let pid = try #require(node.pid)
        // Two signals back to back: the second arrives while the first one's shutdown runs.
        kill(pid, SIGTERM)
        kill(pid, SIGTERM)
        let status = await node.stop(signal: SIGTERM)
        #expect(status == 0 || status == 1, "\(node.logText)")
    }
}

/// `ferry sync` reports an interruption as one, and a failure once.
@Suite(.serialized, .timeLimit(.minutes(10))) struct SyncInterruptionTests {
    /// A sync whose peer never answers (`--exec sleep`), interrupted by `sig`.
    func interruptedSync(_ sig: Int32, json: Bool) async throws -> (status: Int32, stdout: String, stderr: String) {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await cli.run(["put", "local", "{}"])
        let out = cli.dataDirectory + ".out", err = cli.dataDirectory + ".err"
        defer {
            try? FileManager.default.removeItem(atPath: out)
            try? FileManager.default.removeItem(atPath: err)
        }
        let started = cli.dataDirectory + ".started"
        defer { try? FileManager.default.removeItem(atPath: started) }
        let p = try ChildProcess.spawn(
            FerryCLI.binary,
            ["sync", "--exec", "touch \(started); exec sleep 600", "--data", cli.dataDirectory] + (json ? ["--json"] : []),
            stdoutPath: out, stderrPath: err)
        // The peer command runs: the sync is under way.
        #expect(try await eventually(30) { FileManager.default.fileExists(atPath: started) })
        let status = await p.stop(sig, grace: 10).status
        return (
            status, (try? String(contentsOfFile: out, encoding: .utf8)) ?? "", (try? String(contentsOfFile: err, encoding: .utf8)) ?? ""
        )
    }

    @Test func sigtermMidSyncExits143AndReportsInterrupted() async throws {
        let r = try await interruptedSync(SIGTERM, json: true)
        #expect(r.status == 143, "\(r.stderr)")
        let summary = try JSON.parse(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(summary["ok"] == false)
        #expect(summary["interrupted"] == true)
    }

    @Test func sigintMidSyncExits130AndSaysSoOnStderrOnly() async throws {
        let r = try await interruptedSync(SIGINT, json: false)
        #expect(r.status == 130, "\(r.stderr)")
        #expect(r.stdout.isEmpty, "\(r.stdout)")
        #expect(r.stderr.split(separator: "\n").filter { $0.hasPrefix("ferry:") }.count == 1, "\(r.stderr)")
        #expect(r.stderr.contains("interrupted by SIGINT"), "\(r.stderr)")
    }

    @Test func anInterruptedPullKeepsItsCheckpointAndTheNextSyncResumes() async throws {
        let source = FerryCLI()
        let cli = FerryCLI()
        defer {
            source.cleanUp()
            cli.cleanUp()
        }
        let total = 30_000
        let ndjson = (0..<total).map { #"{"_id":"d\#($0)","pad":"\#(String(repeating: "x", count: 200))"}"# }.joined(separator: "\n")
        #expect(try await source.run(["import", "-"], stdin: ndjson).status == 0)
        try await cli.run(["id"])
        let out = cli.dataDirectory + ".out"
        defer { try? FileManager.default.removeItem(atPath: out) }
        let p = try ChildProcess.spawn(
            FerryCLI.binary, ["sync", source.dataDirectory, "--pull", "--json", "--data", cli.dataDirectory], stdoutPath: out)
        // Interrupt once the first batch is stored: mid-pull.
        #expect(try await eventually(60) { (try? await cli.run(["info", "--json"]).json()["docCount"]?.intValue ?? 0) ?? 0 > 0 })
        let status = await p.stop(SIGTERM, grace: 30).status
        #expect(status == 143)
        let first = try JSON.parse((try? String(contentsOfFile: out, encoding: .utf8)) ?? "")
        #expect(first["interrupted"] == true)
        #expect(first["ok"] == false)
        let pulledFirst = try #require(first["pulled"]?.intValue)
        #expect(pulledFirst > 0 && pulledFirst < total)
        // What was pulled is stored and checkpointed: the next sync pulls only the rest.
        let second = try await cli.run(["sync", source.dataDirectory, "--pull", "--json"]).json()
        #expect(second["ok"] == true)
        #expect(second["pulled"]?.intValue == Int64(total) - pulledFirst)
        #expect(try await cli.run(["info", "--json"]).json()["docCount"]?.intValue == Int64(total))
    }

    @Test func aFailedSyncPrintsItsErrorOnceAndNoSummary() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await cli.run(["put", "local", "{}"])
        // A listener that is not there: every attempt is refused.
        let r = try await cli.run(["sync", "ws://127.0.0.1:1/ferry/sync", "--pin", String(repeating: "ab", count: 32)])
        #expect(r.status == 1, "\(r.stderr)")
        #expect(r.stdout.isEmpty, "\(r.stdout)")
        let lines = r.stderr.split(separator: "\n")
        #expect(lines.count == 1, "\(r.stderr)")
        #expect(lines.first?.hasPrefix("ferry: replication failed") == true, "\(r.stderr)")
    }
}

/// Read commands never create a data directory; writing commands do.
@Suite(.timeLimit(.minutes(10))) struct ReadCommandTests {
    @Test func readCommandsOnAMissingDirectorySaySoAndCreateNothing() async throws {
        let root = NSTemporaryDirectory() + "ferry-missing-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: root) }
        let missing = root + "/deep/dir"
        let cli = FerryCLI()
        let commands: [[String]] = [
            ["get", "x"], ["ls"], ["changes"], ["conflicts"], ["info"], ["check"],
            ["blob", "get", "sha256-" + String(repeating: "0", count: 64)], ["status"], ["peers"], ["trust", "ls"],
        ]
        for command in commands {
            let r = try await cli.run(command + ["--data", missing], useDataFlag: false)
            #expect(r.status == 1, "\(command): \(r.stderr)")
            #expect(r.stderr.contains("no Ferry data in \(missing)"), "\(command): \(r.stderr)")
            #expect(!FileManager.default.fileExists(atPath: root), "\(command) created \(root)")
        }
    }

    @Test func writingCommandsAndIDStillCreateTheDirectory() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        #expect(try await cli.run(["id"]).status == 0)
        let other = FerryCLI()
        defer { other.cleanUp() }
        #expect(try await other.run(["put", "a", "{}"]).status == 0)
        #expect(try await other.run(["get", "a"]).status == 0)
    }

    @Test func aReadOnlyDataDirectoryCanStillBeRead() async throws {
        let cli = FerryCLI()
        defer {
            _ = chmod(cli.dataDirectory, 0o755)
            cli.cleanUp()
        }
        try await cli.run(["put", "doc", #"{"v":1}"#])
        // Root ignores permissions: read as nobody when running as root.
        let asNobody = getuid() == 0
        for entry in (try? FileManager.default.subpathsOfDirectory(atPath: cli.dataDirectory)) ?? [] {
            _ = chmod(cli.dataDirectory + "/" + entry, 0o444 | (isDirectory(cli.dataDirectory + "/" + entry) ? 0o111 : 0))
        }
        _ = chmod(cli.dataDirectory, 0o555)
        let r: FerryCLI.Result
        if asNobody {
            let shell = try await Shell.run(
                ["--reuid=65534", "--regid=65534", "--clear-groups", FerryCLI.binary, "get", "doc", "--json", "--data", cli.dataDirectory],
                executable: "/usr/bin/setpriv", timeout: 60)
            r = FerryCLI.Result(status: shell.status, stdout: shell.stdout, stderr: shell.stderr)
        } else {
            r = try await cli.run(["get", "doc", "--json"])
        }
        #expect(r.status == 0, "\(r.stderr)")
        #expect(try r.json()["v"] == 1)
    }

    /// `rm -rf` of a running node's data directory (or of its database): the node notices
    /// within seconds, says so and exits 1 instead of serving a database that is gone.
    @Test(arguments: ["directory", "database"])
    func aNodeWhoseDataIsDeletedUnderItStopsAndSaysWhy(_ what: String) async throws {
        let node = ServeProcess()
        _ = try await node.start()
        let target = what == "directory" ? node.cli.dataDirectory : node.cli.dataDirectory + "/ferry.sqlite"
        try FileManager.default.removeItem(atPath: target)
        let process = try #require(node.process)
        let status = await process.wait(timeout: 30)
        #expect(status == 1, "\(node.logText)")
        #expect(node.logText.contains("the data directory \(node.cli.dataDirectory) was "), "\(node.logText)")
        #expect(node.logText.contains("start it again on the data you mean to serve"), "\(node.logText)")
    }

    /// Another user's data directory: a write names the owner and what to do, instead of
    /// Foundation's "The operation could not be completed".
    @Test(.enabled(if: getuid() == 0, "needs root to run ferry as another user"))
    func aWriteIntoAnotherUsersDataDirectorySaysWhoseItIs() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await cli.run(["put", "doc", "{}"])
        _ = chmod(cli.dataDirectory, 0o700)
        let shell = try await Shell.run(
            ["--reuid=65534", "--regid=65534", "--clear-groups", FerryCLI.binary, "put", "other", "{}", "--data", cli.dataDirectory],
            executable: "/usr/bin/setpriv", timeout: 60)
        #expect(shell.status == 1, "\(shell.stderr)")
        #expect(shell.stderr.contains("may not read and write the data directory \(cli.dataDirectory), which belongs to root"), "\(shell.stderr)")
        #expect(!shell.stderr.contains("could not be completed"), "\(shell.stderr)")
    }

    func isDirectory(_ path: String) -> Bool {
        var d: ObjCBool = false
        return FileManager.default.fileExists(atPath: path, isDirectory: &d) && d.boolValue
    }
}

/// Exit statuses and messages that are the same with or without a running node.
@Suite(.serialized, .timeLimit(.minutes(10))) struct CLIMessageTests {
    @Test func removingAMissingDocumentIsNotFoundOfflineAndThroughTheNode() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await cli.run(["put", "other", "{}"])
        let rev = "1-" + String(repeating: "a", count: 64)
        let offline = try await cli.run(["rm", "missing", "--rev", rev])
        #expect(offline.status == 3, "\(offline.stderr)")
        let node = ServeProcess(cli: cli)
        _ = try await node.start()
        let online = try await cli.run(["rm", "missing", "--rev", rev])
        #expect(online.status == 3, "\(online.stderr)")
        _ = await node.stop()
    }

    @Test func aDocumentOverTheLimitGivesTheSameMessageOfflineAndThroughTheNode() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let file = NSTemporaryDirectory() + "ferry-big-\(UUID().uuidString).json"
        defer { try? FileManager.default.removeItem(atPath: file) }
        try Data(#"{"blob":""#.utf8 + [UInt8](repeating: 0x61, count: 20 << 20) + #""}"#.utf8).write(to: URL(fileURLWithPath: file))
        try await cli.run(["put", "other", "{}"])
        let offline = try await cli.run(["put", "big", "@" + file])
        let node = ServeProcess(cli: cli)
        _ = try await node.start()
        let online = try await cli.run(["put", "big", "@" + file])
        _ = await node.stop()
        for r in [offline, online] {
            #expect(r.status == 1, "\(r.stderr)")
            let lines = errorLines(r)
            #expect(lines.count == 1 && lines[0].hasPrefix("ferry: document too large: ") && lines[0].hasSuffix("the limit is 8388608"), "\(r.stderr)")
        }
    }

    @Test func versionIsPrinted() async throws {
        let r = try await FerryCLI().run(["--version"], useDataFlag: false)
        #expect(r.status == 0)
        #expect(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: ".").count == 3, "\(r.stdout)")
    }

    @Test func aConflictSaysTheDocumentWasNotChanged() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        try await cli.run(["put", "doc", "{}"])
        let r = try await cli.run(["put", "doc", #"{"v":2}"#])
        #expect(r.status == 4)
        #expect(r.stderr.contains("not created"), "\(r.stderr)")
        #expect(!r.stderr.contains("was updated"), "\(r.stderr)")
    }
}
