import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The admin API of a real `ferry serve`: who may drive it, how it stops, and the CLI
/// commands that use it.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AdminSafetyTests {
    /// `curl` with the node's key, printing only the status code.
    func status(_ info: JSON, _ arguments: String) async -> String {
        let key = info["adminKeyFile"]?.stringValue ?? "/nonexistent"
        let base = info["adminURL"]?.stringValue ?? ""
        let r = await shell(#"curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(cat '\#(key)')" \#(arguments) '\#(base)'"#)
        return r.output
    }

    @Test func aForeignHostOrAWebPageIsRefusedAndTheKeyIsRequired() async throws {
        let node = ServeProcess()
        let info = try await node.start()
        let keyFile = try #require(info["adminKeyFile"]?.stringValue)
        let mode = try #require(FileManager.default.attributesOfItem(atPath: keyFile)[.posixPermissions] as? NSNumber).uint16Value
        #expect(mode & 0o777 == 0o600)
        #expect(await status(info, "") == "200")
        // DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1.
        #expect(await status(info, "-H 'Host: evil.example'") == "421")
        let id = String(repeating: "a", count: 64)
        let trustURL = try #require(info["adminURL"]?.stringValue) + "/trust"
        // What any web page can send without a preflight: a "simple" cross-origin POST.
        let simple = await shell(
            #"curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Origin: http://evil.example' -H 'Content-Type: text/plain' --data-binary '{"id":"\#(id)"}' '\#(trustURL)'"#)
        #expect(simple.output == "401" || simple.output == "403", "\(simple.output)")
        let api = AdminClient(nodeFile: info)
        let fromPage = try await api.call(
            "POST", "/trust", body: #"{"id":"\#(id)"}"#, headers: ["Origin": "http://evil.example", "Content-Type": "text/plain"])
        #expect(fromPage.status == 403 && fromPage.json["error"] == "forbidden_origin", "\(fromPage.text)")
        let replication = #"{"url":"wss://10.0.0.66:4985/ferry/sync","peer":"\#(id)"}"#
        #expect(try await api.call("POST", "/replications", body: replication, headers: ["Origin": "http://evil.example"]).status == 403)
        #expect(try await api.call("POST", "/replications", body: replication, headers: ["Content-Type": "text/plain"]).status == 415)
        #expect(await status(info, "-H 'Authorization: Bearer wrong'") == "401")
        #expect(try await api.get("/trust")["trusted"]?.arrayCount == 0)
        #expect(try await api.get("/replications")["replications"]?.arrayCount == 0)
        #expect(await node.stop() == 0)
    }

    @Test func sigtermAnswersAnOpenLongPollAndTheNodeExits() async throws {
        let node = ServeProcess()
        let info = try await node.start(environment: ["FERRY_LOG_LEVEL": "debug"])
        let api = AdminClient(nodeFile: info)
        let last = try await api.get("/")["lastSequence"]?.intValue ?? 0
        let started = Date()
        async let poll = api.call("GET", "/changes?since=\(last)&feed=longpoll&timeout=60000")
        try await waitUntil("the long-poll is waiting in the node") { node.logText.contains("admin long-poll waiting") }
        let exit = await node.stop()
        let answer = try await poll
        #expect(exit == 0)
        #expect(answer.status == 200 && answer.json["results"]?.arrayCount == 0, "\(answer.text)")
        // Generous: without the fix it is the long-poll's 60 s (or the client's 30 s timeout).
        #expect(Date().timeIntervalSince(started) < 10)
    }

    @Test func aStaleNodeFileWhosePidIsAliveIsIgnored() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        #expect(try await cli.run(["put", "a", "{}"]).status == 0)
        // The pid of this (live) test process, and an admin port nothing listens on.
        let stale: JSON = ["pid": .int(Int64(getpid())), "adminURL": "http://127.0.0.1:1", "adminPort": 1]
        FileManager.default.createFile(atPath: cli.dataDirectory + "/node.json", contents: Data(stale.canonicalBytes))
        let get = try await cli.run(["get", "a"])
        #expect(get.status == 0, "\(get.stderr)")
        let status = try await cli.run(["status"])
        #expect(status.status != 0 && status.stderr.contains("no ferry serve is running"), "\(status.stderr)")
    }

    @Test func trustAddRefusesAKnownIDTrustSetChangesOnlyWhatItNamesAndLsPrintsTheConfigForm() async throws {
        let node = ServeProcess()
        _ = try await node.start()
        let id = String(repeating: "b", count: 64)
        let add = try await node.cli.run(["trust", "add", id, "--name", "tablet", "--write", "notes/*"])
        #expect(add.status == 0, "\(add.stderr)")
        let again = try await node.cli.run(["trust", "add", id])
        #expect(again.status == 4 && again.stderr.contains("trust set"), "\(again.stderr)")
        let set = try await node.cli.run(["trust", "set", id, "--no-delete"])
        #expect(set.status == 0, "\(set.stderr)")
        #expect(set.stdout == "\(id)\ttablet\tapi\t{\"read\":\"all\",\"write\":{\"ids\":[\"notes/*\"]},\"mayDelete\":false}\n", "\(set.stdout)")
        let ls = try await node.cli.run(["trust", "ls"])
        #expect(ls.stdout.hasPrefix("ID\tNAME\tSOURCE\tPOLICY\n"), "\(ls.stdout)")
        #expect(ls.stdout.contains(#"{"read":"all","write":{"ids":["notes/*"]},"mayDelete":false}"#), "\(ls.stdout)")
        #expect(ls.stdout.contains("tablet"))
        #expect(!ls.stdout.contains("FerryCore"))
        let api = try await node.cli.run(["trust", "ls", "--json"])
        #expect(try api.json().canonicalString.contains(#""policy":{"mayDelete":false,"read":"all","write":{"ids":["notes/*"]}}"#), "\(api.stdout)")
        let renamed = try await node.cli.run(["trust", "set", id, "--name", "tablet-2"])
        #expect(renamed.status == 0 && renamed.stdout.hasPrefix("\(id)\ttablet-2\tapi\t"), "\(renamed.stdout)")
        #expect(await node.stop() == 0)
        // Without a node, the same rules apply to DATA/trust.json.
        #expect(try await node.cli.run(["trust", "add", id]).status == 4)
        let offlineSet = try await node.cli.run(["trust", "set", id, "--write-all"])
        #expect(offlineSet.status == 0 && offlineSet.stdout.hasPrefix("\(id)\ttablet-2\tapi\t"), "\(offlineSet.stdout)")
        let offline = try await node.cli.run(["trust", "ls"])
        #expect(offline.stdout.contains(#"{"read":"all","write":"all","mayDelete":false}"#), "\(offline.stdout)")
    }

    @Test func changesNeverReportsALastSequencePastTheStores() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        #expect(try await cli.run(["put", "a", "{}"]).status == 0)
        let offline = try await cli.run(["changes", "--since", "99999999999", "--json"])
        #expect(try offline.json() == ["last_seq": 1, "results": []], "\(offline.stdout)")
        let text = try await cli.run(["changes", "--since", "99999999999"])
        #expect(text.stdout == "last_seq 1\n", "\(text.stdout)")
        let node = ServeProcess(cli: cli)
        _ = try await node.start()
        let online = try await cli.run(["changes", "--since", "99999999999", "--json"])
        #expect(try online.json() == ["last_seq": 1, "results": []], "\(online.stdout)")
        #expect(await node.stop() == 0)
    }

    @Test func namesWithControlCharactersAreRefusedEverywhereANameIsGiven() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let id = String(repeating: "c", count: 64)
        let add = try await cli.run(["trust", "add", id, "--name", "tr\nFAKE2"])
        #expect(add.status == 64 && add.stderr.contains("U+000A"), "\(add.stderr)")
        #expect(try await cli.run(["trust", "add", id, "--name", "tablet"]).status == 0)
        let set = try await cli.run(["trust", "set", id, "--name", "a\u{202E}b"])
        #expect(set.status == 64 && set.stderr.contains("U+202E"), "\(set.stderr)")
        let ls = try await cli.run(["trust", "ls"])
        #expect(ls.stdout.contains("\ttablet\t") && !ls.stdout.contains("FAKE2"), "\(ls.stdout)")
        let identity = try await cli.run(["id", "--name", "evil\n\u{1B}[31m"])
        #expect(identity.status == 64 && identity.stderr.contains("U+000A"), "\(identity.stderr)")
        #expect(!FileManager.default.fileExists(atPath: cli.dataDirectory + "/identity/cert.pem"))
        let serve = try await cli.run(["serve", "--name", "x\u{7F}", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--no-discovery"])
        #expect(serve.status == 64 && serve.stderr.contains("U+007F"), "\(serve.stderr)")
        let config = cli.dataDirectory + ".json"
        defer { try? FileManager.default.removeItem(atPath: config) }
        FileManager.default.createFile(atPath: config, contents: Data(#"{"name":"a\u0085b"}"#.utf8))
        let configured = try await cli.run(["serve", "--config", config, "--port", "0", "--admin-port", "0", "--couch-port", "0", "--no-discovery"])
        #expect(configured.status == 1 && configured.stderr.contains("name") && configured.stderr.contains("U+0085"), "\(configured.stderr)")
    }

    /// The mode bits of a path, and of every entry under it.
    func modes(_ path: String) -> [String: UInt16] {
        var out: [String: UInt16] = [:]
        var paths = [path]
        if let sub = FileManager.default.subpaths(atPath: path) { paths += sub.map { path + "/" + $0 } }
        for p in paths {
            var st = stat()
            if lstat(p, &st) == 0 { out[p] = UInt16(st.st_mode & 0o777) }
        }
        return out
    }

    func expectPrivate(_ path: String, _ when: String) {
        for (p, mode) in modes(path).sorted(by: { $0.key < $1.key }) {
            var st = stat()
            lstat(p, &st)
            let isDirectory = st.st_mode & S_IFMT == S_IFDIR
            // The certificate is public (every peer gets it); its directory is owner-only.
            let expected: UInt16 = isDirectory ? 0o700 : p.hasSuffix("/identity/cert.pem") ? 0o644 : 0o600
            #expect(mode == expected, "\(when): \(p) is \(String(mode, radix: 8))")
        }
    }

    @Test func whatFerryCreatesIsPrivateToItsUser() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        #expect(try await cli.run(["put", "a", #"{"secret":1}"#]).status == 0)
        let blob = cli.dataDirectory + ".blob"
        defer { try? FileManager.default.removeItem(atPath: blob) }
        FileManager.default.createFile(atPath: blob, contents: Data("bytes".utf8))
        #expect(try await cli.run(["blob", "put", blob]).status == 0)
        expectPrivate(cli.dataDirectory, "after put")
        let node = ServeProcess(cli: cli)
        _ = try await node.start()
        #expect(try await cli.run(["trust", "add", String(repeating: "d", count: 64)]).status == 0)
        expectPrivate(cli.dataDirectory, "while serving")
        #expect(!node.logText.contains("accessible to other users"), "\(node.logText)")
        #expect(await node.stop() == 0)
        expectPrivate(cli.dataDirectory, "after serve")
        // Another local user cannot read a document (only checkable as root).
        if getuid() == 0 {
            let other = await shell("setpriv --reuid=nobody --regid=nogroup --clear-groups '\(FerryCLI.binary)' --data '\(cli.dataDirectory)' get a")
            #expect(other.status == 1 && other.output.contains("permission denied") && !other.output.contains("secret"), "\(other.output)")
        }
    }

    @Test func serveWarnsOnceAboutADataDirectoryOthersCanRead() async throws {
        let cli = FerryCLI()
        try FileManager.default.createDirectory(atPath: cli.dataDirectory, withIntermediateDirectories: true)
        chmod(cli.dataDirectory, 0o755)
        let node = ServeProcess(cli: cli)
        _ = try await node.start()
        #expect(await node.stop() == 0)
        #expect(node.logText.components(separatedBy: "accessible to other users").count == 2, "\(node.logText)")
        // An existing directory keeps its mode.
        #expect(modes(cli.dataDirectory)[cli.dataDirectory] == 0o755)
    }
}
