import ArgumentParser
import FerryCore
import Foundation


/// P7: Ferry side by side with Syncthing (Debian's `syncthing`): two instances of each on
/// loopback, driven through their REST APIs, inside a private network namespace that has
/// only loopback (Syncthing's discovery, relays, NAT and announcements are also off in its
/// config; the namespace is the second safety net). Needs root for the namespace.
struct SyncthingBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "syncthing",
        abstract: "P7: bulk and single-change latency against two local Syncthing instances (bulk >= 100x faster; fair latency <= Syncthing near-empty and <= 0.1x at 30k files; default latency >= 100x faster).")

    @Option(help: "Files/documents for the bulk measurement.") var files = 10_000
    @Option(help: "Approximate file/document size in bytes.") var size = 1024
    @Option(help: "Files/documents in the large folder for the latency measurement.") var largeFolder = 30_000
    @Option(help: "Bulk runs (median reported).") var runs = 3
    @Option(help: "Single changes timed per folder for the fair latency.") var changes = 20
    @Option(help: "Single changes timed with Syncthing's default file watcher.") var watcherChanges = 3
    @Option(help: "Directory for scratch data.") var scratch = NSTemporaryDirectory()
    @Option(help: "Also record the figures in this JSON report.") var report: String?
    @Flag(help: .hidden) var inNamespace = false

    func validate() throws {
        guard files >= 1, largeFolder >= 1, runs >= 1, changes >= 1, watcherChanges >= 1, size >= 64 else {
            throw ValidationError("--files, --large-folder, --runs, --changes and --watcher-changes must be at least 1, and --size at least 64")
        }
    }

    func run() async throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/syncthing") else {
            throw BenchError("syncthing is not installed (apt-get install syncthing; make bench installs it)")
        }
        if !inNamespace { return try reexecInPrivateNetwork() }
        guard Self.run("/usr/sbin/ip", ["link", "set", "lo", "up"]) == 0 || Self.run("/sbin/ip", ["link", "set", "lo", "up"]) == 0 else {
            throw BenchError("cannot bring up loopback in the private namespace")
        }
        setenv("STNOUPGRADE", "1", 1)
        setenv("STNORESTART", "1", 1)
        let root = try makeScratchDirectory(in: scratch, prefix: "ferry-bench-syncthing")
        defer { try? FileManager.default.removeItem(atPath: root) }
        let generator = DocumentGenerator(size: size)
        print("syncthing: \(files) files/documents of ~\(size) bytes (\(runs) runs); single changes on a near-empty folder and on \(largeFolder) files; \(try Self.syncthingVersion())")

        // Syncthing: two paired instances.
        let (a, b) = try await Syncthing.connectedPair(root: root, gui: 18384, listen: 22001)
        defer { a.stop(); b.stop() }

        // Bulk.
        var stBulk: [Double] = []
        var ferryBulk: [Double] = []
        for run in 1...runs {
            let folder = "bulk\(run)"
            try FileManager.default.createDirectory(atPath: "\(b.home)/\(folder)", withIntermediateDirectories: true)
            try writeFiles(generator, count: files, into: "\(a.home)/\(folder)")
            try await b.addFolder(folder, path: "\(b.home)/\(folder)", sharedWith: a, watcher: false)
            let start = ContinuousClock.now
            try await a.addFolder(folder, path: "\(a.home)/\(folder)", sharedWith: b, watcher: false)
            try await waitForFiles(files, in: "\(b.home)/\(folder)", timeout: 900)
            stBulk.append((ContinuousClock.now - start).seconds)
            ferryBulk.append(try ferryPull(generator, count: files, root: "\(root)/ferry-bulk-\(run)"))
            print(String(format: "  bulk run %d: syncthing %.1f s, ferry %.2f s", run, stBulk.last!, ferryBulk.last!))
        }

        // Fair latency (Syncthing triggered by a scan request of the changed file).
        let stSmall = try await syncthingLatency(a, b, folder: "near-empty", preload: 1, generator: generator, watcher: false, samples: changes)
        let stLarge = try await syncthingLatency(a, b, folder: "large", preload: largeFolder, generator: generator, watcher: false, samples: changes)
        let stDefault = try await syncthingLatency(a, b, folder: "watched", preload: 1, generator: generator, watcher: true, samples: watcherChanges)
        let ferrySmall = try await ferryLatency(preload: 1, generator: generator, root: "\(root)/ferry-lat-small")
        let ferryLarge = try await ferryLatency(preload: largeFolder, generator: generator, root: "\(root)/ferry-lat-large")

        let sb = Stats(stBulk), fb = Stats(ferryBulk)
        let bulkRatio = sb.median / fb.median
        let (sS, sL, sD) = (Percentiles(stSmall), Percentiles(stLarge), Percentiles(stDefault))
        let (fS, fL) = (Percentiles(ferrySmall), Percentiles(ferryLarge))
        let smallRatio = fS.p50 / sS.p50, largeRatio = fL.p50 / sL.p50, defaultRatio = sD.p50 / fS.p50
        print(String(format: "bulk %d:     syncthing %7.1f s (min %.1f, max %.1f)   ferry %6.2f s (min %.2f, max %.2f)", files, sb.median, sb.min, sb.max, fb.median, fb.min, fb.max))
        print(String(format: "  ferry is %.0fx faster  target >= 100x  %@", bulkRatio, bulkRatio >= 100 ? "HOLDS" : "MISSES"))
        print(String(format: "latency, near-empty (scan request): syncthing p50 %8.1f ms p99 %8.1f   ferry p50 %6.2f ms p99 %6.2f", sS.p50, sS.p99, fS.p50, fS.p99))
        print(String(format: "  ferry/syncthing %.3f  target <= 1  %@", smallRatio, smallRatio <= 1 ? "HOLDS" : "MISSES"))
        print(String(format: "latency, %d files (scan request): syncthing p50 %8.1f ms p99 %8.1f   ferry p50 %6.2f ms p99 %6.2f", largeFolder, sL.p50, sL.p99, fL.p50, fL.p99))
        print(String(format: "  ferry/syncthing %.3f  target <= 0.1  %@", largeRatio, largeRatio <= 0.1 ? "HOLDS" : "MISSES"))
        print(String(format: "latency, default watcher: syncthing p50 %8.1f ms   ferry p50 %6.2f ms", sD.p50, fS.p50))
        print(String(format: "  ferry is %.0fx faster  target >= 100x  %@", defaultRatio, defaultRatio >= 100 ? "HOLDS" : "MISSES"))
        if let report {
            try BenchReport.record([
                Figure(
                    id: "P7-bulk", name: "Bulk: \(files) documents pulled by Ferry vs \(files) files synced by Syncthing (ratio = times faster)",
                    value: fb.median, unit: "s", baseline: sb.median, ratio: bulkRatio, target: ">= 100", holds: bulkRatio >= 100,
                    runs: zip(ferryBulk, stBulk).map { ($0, $1, $1 / $0) }),
                Figure(
                    id: "P7-fair-small", name: "One change, near-empty folder, Syncthing triggered by a scan request: p50 latency (ratio = Ferry / Syncthing)",
                    value: fS.p50, unit: "ms", baseline: sS.p50, ratio: smallRatio, target: "<= 1", holds: smallRatio <= 1,
                    runs: [(fS.p50, sS.p50, smallRatio), (fS.p99, sS.p99, fS.p99 / sS.p99)]),
                Figure(
                    id: "P7-fair-large", name: "One change, \(largeFolder) files, Syncthing triggered by a scan request: p50 latency (ratio = Ferry / Syncthing)",
                    value: fL.p50, unit: "ms", baseline: sL.p50, ratio: largeRatio, target: "<= 0.1", holds: largeRatio <= 0.1,
                    runs: [(fL.p50, sL.p50, largeRatio), (fL.p99, sL.p99, fL.p99 / sL.p99)]),
                Figure(
                    id: "P7-default", name: "One change, Syncthing left to its default file watcher: p50 latency (ratio = times faster)",
                    value: fS.p50, unit: "ms", baseline: sD.p50, ratio: defaultRatio, target: ">= 100", holds: defaultRatio >= 100,
                    runs: stDefault.map { (fS.p50, $0, $0 / fS.p50) }),
            ], in: report)
        }
    }

    // MARK: Syncthing side

    /// Times `samples` single-file changes from A to B in a folder holding `preload` files on both sides.
    func syncthingLatency(
        _ a: Syncthing, _ b: Syncthing, folder: String, preload: Int, generator: DocumentGenerator, watcher: Bool, samples: Int
    ) async throws -> [Double] {
        let pathA = "\(a.home)/\(folder)", pathB = "\(b.home)/\(folder)"
        try writeFiles(generator, count: preload, into: pathA)
        try writeFiles(generator, count: preload, into: pathB)  // identical content: only indexes are exchanged
        try await b.addFolder(folder, path: pathB, sharedWith: a, watcher: watcher)
        try await a.addFolder(folder, path: pathA, sharedWith: b, watcher: watcher)
        try await a.awaitIdle(folder, files: preload)
        try await b.awaitIdle(folder, files: preload)
        var out: [Double] = []
        for k in 0..<samples {
            let name = "change-\(k).json"
            let body = generator.document(1_000_000 + k).1.canonicalBytes
            let target = "\(pathB)/\(name)"
            let start = ContinuousClock.now
            FileManager.default.createFile(atPath: "\(pathA)/\(name)", contents: Data(body))
            let scan = watcher ? nil : Task { try await a.rest("POST", "/rest/db/scan?folder=\(folder)&sub=\(name)") }
            while !FileManager.default.fileExists(atPath: target) {
                guard ContinuousClock.now - start < .seconds(120) else { throw BenchError("syncthing did not deliver \(name) in 120 s") }
                try await Task.sleep(for: .microseconds(watcher ? 10_000 : 200))
            }
            out.append((ContinuousClock.now - start).seconds * 1000)
            _ = try await scan?.value
            try await b.awaitIdle(folder, files: preload + k + 1)
        }
        print(String(format: "  syncthing %@ (%d files%@): p50 %.1f ms", folder, preload, watcher ? ", watcher" : ", scan request", Percentiles(out).p50))
        return out
    }

    func writeFiles(_ generator: DocumentGenerator, count: Int, into dir: String) throws {
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for i in 0..<count {
            let (id, body) = generator.document(i)
            FileManager.default.createFile(atPath: "\(dir)/\(id.rawValue).json", contents: Data(body.canonicalBytes))
        }
    }

    /// Waits until `dir` holds `count` finished files (Syncthing renames temp files into place).
    func waitForFiles(_ count: Int, in dir: String, timeout: Double) async throws {
        let deadline = ContinuousClock.now + .seconds(timeout)
        while ContinuousClock.now < deadline {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
            if names.lazy.filter({ !$0.hasPrefix(".syncthing") && !$0.hasPrefix(".stfolder") && $0.hasSuffix(".json") }).count >= count { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw BenchError("syncthing did not deliver \(count) files to \(dir) in \(Int(timeout)) s")
    }

    // MARK: Ferry side

    /// Seconds for `ferry sync --pull` to bring `count` documents from a serving node.
    func ferryPull(_ generator: DocumentGenerator, count: Int, root: String) throws -> Double {
        let ferry = NetBench.ferryBinary()
        let source = "\(root)/source", receiver = "\(root)/receiver"
        try generator.writeNDJSON(count, to: "\(root).ndjson")
        defer { try? FileManager.default.removeItem(atPath: "\(root).ndjson") }
        guard try NetBench.spawn(ferry, ["--data", source, "import", "\(root).ndjson", "--create"]).status == 0 else { throw BenchError("ferry import failed") }
        let receiverID = try NetBench.capture(ferry, ["--data", receiver, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let sourceID = try NetBench.capture(ferry, ["--data", source, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let server = try NetBench.startServe(ferry, data: source, trust: receiverID)
        defer { kill(server.pid, SIGKILL); _ = NetBench.reap(server.pid) }
        let start = ContinuousClock.now
        let r = try NetBench.spawn(ferry, ["--data", receiver, "sync", server.url, "--pin", sourceID, "--pull"])
        let elapsed = (ContinuousClock.now - start).seconds
        guard r.status == 0 else { throw BenchError("ferry sync failed with status \(r.status)") }
        try? FileManager.default.removeItem(atPath: root)
        return elapsed
    }

    /// Milliseconds from a write on node A to its arrival on node B (continuous sync), for
    /// `changes` single writes, with `preload` documents on both.
    func ferryLatency(preload: Int, generator: DocumentGenerator, root: String) async throws -> [Double] {
        let ferry = NetBench.ferryBinary()
        let dirA = "\(root)/a", dirB = "\(root)/b"
        try generator.writeNDJSON(preload, to: "\(root).ndjson")
        defer { try? FileManager.default.removeItem(atPath: "\(root).ndjson") }
        for dir in [dirA, dirB] {
            guard try NetBench.spawn(ferry, ["--data", dir, "import", "\(root).ndjson", "--create"]).status == 0 else { throw BenchError("ferry import failed") }
        }
        let idA = try NetBench.capture(ferry, ["--data", dirA, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let idB = try NetBench.capture(ferry, ["--data", dirB, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let base = ["serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--no-discovery", "--interface", "127.0.0.1"]
        let pidB = try NetBench.launch(ferry, ["--data", dirB] + base + ["--trust", idA], quiet: true)
        defer { kill(pidB, SIGKILL); _ = NetBench.reap(pidB) }
        let infoB = try await NetBench.waitForNodeFile(dirB, pid: pidB)
        let pidA = try NetBench.launch(ferry, ["--data", dirA] + base + ["--trust", idB, "--peer", "\(infoB["url"]?.stringValue ?? "")#\(idB)"], quiet: true)
        defer { kill(pidA, SIGKILL); _ = NetBench.reap(pidA) }
        let infoA = try await NetBench.waitForNodeFile(dirA, pid: pidA)
        let adminA = infoA["adminURL"]?.stringValue ?? "", adminB = infoB["adminURL"]?.stringValue ?? ""
        // Identical documents on both sides: the first exchange only compares revisions.
        let deadline = ContinuousClock.now + .seconds(120)
        func linkIsIdle() async throws -> Bool {
            guard case .array(let peers)? = try await get(adminA + "/peers")["peers"] else { return false }
            return peers.first?["connected"] == true && peers.first?["replication"]?["activity"] == "idle"
        }
        while try await !linkIsIdle() {
            guard ContinuousClock.now < deadline else { throw BenchError("ferry nodes did not connect") }
            try await Task.sleep(for: .milliseconds(50))
        }
        var out: [Double] = []
        for k in 0..<changes {
            let since = try await get(adminB + "/")["lastSequence"]?.intValue ?? 0
            let start = ContinuousClock.now
            let arrival = Task { () throws -> Double in
                _ = try await get(adminB + "/changes?since=\(since)&feed=longpoll&timeout=30000")
                return (ContinuousClock.now - start).seconds * 1000
            }
            try await Task.sleep(for: .microseconds(200))  // let the long-poll reach node B first
            let t0 = ContinuousClock.now
            let body = String(decoding: generator.document(1_000_000 + k).1.canonicalBytes, as: UTF8.self)
            _ = try await request("PUT", adminA + "/docs/change-\(k)", body: body)
            out.append(try await arrival.value - (t0 - start).seconds * 1000)
        }
        try? FileManager.default.removeItem(atPath: root)
        print(String(format: "  ferry (%d documents): p50 %.2f ms", preload, Percentiles(out).p50))
        return out
    }

    // MARK: Process plumbing

    /// Runs this same command again inside `unshare --net` (a namespace with only loopback).
    func reexecInPrivateNetwork() throws {
        guard getuid() == 0 else {
            // Not a failure of `make bench`: the other figures stand; this one says why it is absent.
            print("P7 not measured: the Syncthing benchmark runs Syncthing in a private network namespace and needs root (sudo)")
            return
        }
        let exe = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let args = ["--net", "--", exe] + Array(CommandLine.arguments.dropFirst()) + ["--in-namespace"]
        // Inherits stdout and stderr, so the figures print as they come.
        let argv = (["/usr/bin/unshare"] + args).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/usr/bin/unshare", nil, nil, argv, environ)
        guard rc == 0 else { throw BenchError("cannot run unshare: errno \(rc)") }
        let result = NetBench.reap(pid)
        guard result.status == 0 else { throw ExitCode(result.status) }
    }

    static func run(_ path: String, _ args: [String]) -> Int32 {
        guard FileManager.default.isExecutableFile(atPath: path), let r = try? NetBench.spawn(path, args) else { return -1 }
        return r.status
    }

    static func syncthingVersion() throws -> String {
        try NetBench.capture("/usr/bin/syncthing", ["--version"]).split(separator: " ").prefix(2).joined(separator: " ")
    }
}

/// One Syncthing instance in its own home, locked down to loopback, driven over REST.
final class Syncthing: @unchecked Sendable {
    // @unchecked: used by one benchmark task at a time.
    let home: String
    let gui: Int
    let listen: Int
    let apiKey = UUID().uuidString
    var pid: pid_t = 0
    var deviceID = ""

    init(home: String, gui: Int, listen: Int) throws {
        self.home = home
        self.gui = gui
        self.listen = listen
        let r = try NetBench.spawn("/usr/bin/syncthing", ["generate", "--home=\(home)", "--no-default-folder", "--skip-port-probing"])
        guard r.status == 0 else { throw BenchError("syncthing generate failed with status \(r.status)") }
        try lockDown()
    }

    /// Rewrites config.xml before the first start: GUI on 127.0.0.1 with our API key, one
    /// loopback listen address, and no discovery, relays, NAT, upgrades or reporting.
    func lockDown() throws {
        let path = "\(home)/config.xml"
        var xml = try String(contentsOfFile: path, encoding: .utf8)
        func set(_ tag: String, _ value: String) throws {
            let re = try NSRegularExpression(pattern: "<\(tag)>[^<]*</\(tag)>")
            let range = NSRange(xml.startIndex..., in: xml)
            guard re.firstMatch(in: xml, range: range) != nil else { throw BenchError("syncthing config has no <\(tag)>") }
            xml = re.stringByReplacingMatches(in: xml, range: range, withTemplate: "<\(tag)>\(value)</\(tag)>")
        }
        guard let gui = xml.range(of: "<gui "), let guiEnd = xml.range(of: "</gui>", range: gui.upperBound..<xml.endIndex) else {
            throw BenchError("syncthing config has no <gui>")
        }
        var guiBlock = String(xml[gui.lowerBound..<guiEnd.upperBound])
        guiBlock = guiBlock.replacingOccurrences(of: #"<address>[^<]*</address>"#, with: "<address>127.0.0.1:\(self.gui)</address>", options: .regularExpression)
        guiBlock = guiBlock.replacingOccurrences(of: #"<apikey>[^<]*</apikey>"#, with: "<apikey>\(apiKey)</apikey>", options: .regularExpression)
        xml.replaceSubrange(gui.lowerBound..<guiEnd.upperBound, with: guiBlock)
        try set("listenAddress", "tcp://127.0.0.1:\(listen)")
        for tag in ["localAnnounceEnabled", "globalAnnounceEnabled", "relaysEnabled", "natEnabled", "startBrowser", "crashReportingEnabled", "announceLANAddresses", "restartOnWakeup"] {
            try set(tag, "false")
        }
        try set("urAccepted", "-1")
        try set("autoUpgradeIntervalH", "0")
        try set("stunKeepaliveStartS", "0")
        try xml.write(toFile: path, atomically: true, encoding: .utf8)
    }

    func start() async throws {
        pid = try NetBench.launch("/usr/bin/syncthing", ["serve", "--home=\(home)", "--no-browser", "--no-restart", "--no-upgrade"], quiet: true)
        let deadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < deadline {
            if let id = try? await rest("GET", "/rest/system/status")["myID"]?.stringValue {
                deviceID = id
                return
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw BenchError("syncthing in \(home) did not start")
    }

    func stop() {
        guard pid != 0 else { return }
        kill(pid, SIGTERM)  // the monitor stops its worker too
        _ = NetBench.reap(pid)
        pid = 0
    }

    @discardableResult
    func rest(_ method: String, _ path: String, body: JSON? = nil) async throws -> JSON {
        let reply = try await BenchHTTPClient.shared.request(
            method, "http://127.0.0.1:\(gui)\(path)", headers: [("X-API-Key", apiKey), ("Content-Type", "application/json")],
            body: body?.canonicalBytes, timeout: .seconds(600))
        guard (200..<300).contains(reply.status) else {
            throw BenchError("syncthing \(method) \(path) → \(reply.status): \(String(decoding: reply.body, as: UTF8.self))")
        }
        let data = reply.body
        return (try? JSON.parse(Array(data))) ?? .null
    }

    /// Adds the other instance with its explicit loopback address (no discovery).
    /// Two instances under `root` (`st-a`, `st-b`), started, paired both ways and connected;
    /// the caller stops them.
    static func connectedPair(root: String, gui: Int, listen: Int) async throws -> (Syncthing, Syncthing) {
        let a = try Syncthing(home: "\(root)/st-a", gui: gui, listen: listen)
        let b = try Syncthing(home: "\(root)/st-b", gui: gui + 1, listen: listen + 1)
        do {
            try await a.start()
            try await b.start()
            try await a.pair(with: b)
            try await b.pair(with: a)
            try await a.awaitConnected(to: b)
        } catch {
            a.stop()
            b.stop()
            throw error
        }
        return (a, b)
    }

    func pair(with other: Syncthing) async throws {
        try await rest("POST", "/rest/config/devices", body: ["deviceID": .string(other.deviceID), "addresses": [.string("tcp://127.0.0.1:\(other.listen)")]])
    }

    func awaitConnected(to other: Syncthing) async throws {
        let deadline = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < deadline {
            if try await rest("GET", "/rest/system/connections")["connections"]?[other.deviceID]?["connected"] == true { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw BenchError("syncthing instances did not connect")
    }

    func addFolder(_ id: String, path: String, sharedWith other: Syncthing, watcher: Bool) async throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        try await rest("POST", "/rest/config/folders", body: [
            "id": .string(id), "path": .string(path), "type": "sendreceive", "fsWatcherEnabled": .bool(watcher),
            "devices": [["deviceID": .string(deviceID)], ["deviceID": .string(other.deviceID)]],
        ])
    }

    /// Waits until the folder is idle with `files` files in sync locally and nothing needed.
    func awaitIdle(_ folder: String, files: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(900)
        while ContinuousClock.now < deadline {
            if let s = try? await rest("GET", "/rest/db/status?folder=\(folder)"), s["state"] == "idle",
                s["needFiles"]?.intValue == 0, (s["localFiles"]?.intValue ?? 0) >= Int64(files), (s["globalFiles"]?.intValue ?? 0) >= Int64(files)
            {
                return
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw BenchError("syncthing folder \(folder) did not settle")
    }
}
