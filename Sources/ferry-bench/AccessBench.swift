import ArgumentParser
import FerryCore
import FerryStore
import Foundation
import IntegrationHarness

/// Access by content: P1 (bulk pull) and P9 (a write through a four-node group mesh), each
/// measured with 20 group access rules against none in the same run (targets ≥ 0.8).
struct AccessBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "access",
        abstract: "Access by content: P1 pull and P9 mesh write with 20 rules, each against none (targets >= 0.8).")

    @OptionGroup var workload: Workload
    @Option(help: "P9: writes on each mesh, one at a time.") var writes = 200
    @Option(help: "P9: milliseconds between a write seen everywhere and the next.") var gap = 20
    @Option(help: "P9: writes in a row on one mesh before turning to the other.") var block = 20
    @Option(help: "Parts to run, comma-separated: p1, p9.") var parts = "p1,p9"

    /// The values of the documents' `ward` field.
    static let wards = (1...20).map { "w\($0)" }
    /// A selector that admits every ward value, so a reader sees every document through it.
    static let allWards = #"{"ward":{"$in":[\#(wards.map { "\"\($0)\"" }.joined(separator: ","))]}}"#

    func run() async throws {
        let selected = Set(parts.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() })
        guard !selected.isEmpty, selected.isSubset(of: ["p1", "p9"]) else { throw BenchError("--parts takes p1, p9 or both") }
        guard workload.runs >= 1, writes >= 1, block >= 1 else { throw BenchError("--runs, --writes and --block must be at least 1") }
        sync()
        let ferry = NetBench.ferryBinary()
        let root = try makeScratchDirectory(in: workload.scratch, prefix: "ferry-bench-access")
        defer { try? FileManager.default.removeItem(atPath: root) }
        var figures: [Figure] = []
        if selected.contains("p1") { figures.append(try await pull(ferry: ferry, root: root)) }
        if selected.contains("p9") { figures += try await mesh(ferry: ferry, root: root) }
        if let report = workload.report { try BenchReport.record(figures, in: report) }
    }

    /// The 20 rules as `ferry access` arguments: `everything` for the founder (supervisor),
    /// ward-1…ward-18 on one ward value each, and `role` reading (and writing, if asked) every
    /// ward through a selector, given to `principals`.
    static func ruleSteps(founder: String, role: String, principals: [String], writes: Bool) -> [[String]] {
        var steps: [[String]] = [
            ["access", "roles", founder, "supervisor"],
            ["access", "rule", "add", "everything", "--role", "supervisor", "--read-all", "--write-all", "--delete"],
        ]
        for k in 1...18 {
            let one = #"{"ward":"w\#(k)"}"#
            steps.append(["access", "rule", "add", "ward-\(k)", "--role", "ward-\(k)", "--read-selector", one, "--write-selector", one])
        }
        steps.append(["access", "rule", "add", role, "--role", role, "--read-selector", allWards] + (writes ? ["--write-selector", allWards] : []))
        for p in principals { steps.append(["access", "roles", p, role]) }
        return steps
    }

    /// Runs `ferry ARGS` to completion; throws with its error output when it fails.
    @discardableResult
    static func cli(_ ferry: String, _ args: [String]) async throws -> Ferry.Result {
        let r = try await Shell.run(args, executable: ferry, timeout: 120)
        guard r.status == 0 else { throw BenchError("ferry \(args.joined(separator: " ")) exited \(r.status): \(r.stderr)") }
        return r
    }

    static func nodeID(_ ferry: String, _ dir: String) async throws -> String {
        try await cli(ferry, ["--data", dir, "id"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    // MARK: P1

    /// `count` documents of about `size` bytes, each with a `ward` of 20 values, as NDJSON.
    static func writeWardDocuments(_ count: Int, size: Int, to path: String) throws -> Int {
        try DocumentGenerator(size: max(0, size - 14)).writeNDJSON(count, edit: { i, o in o["ward"] = .string(wards[i % wards.count]) }, to: path)
    }

    /// P1 with rules: a whole `ferry sync --pull` from a source that enforces 20 rules
    /// (the client's role reads every document through a selector) against the same pull from
    /// a plain source of the same documents.
    func pull(ferry: String, root: String) async throws -> Figure {
        let count = workload.count
        let dump = "\(root)/docs.ndjson"
        let bytes = try Self.writeWardDocuments(count, size: workload.size, to: dump)
        let plain = "\(root)/plain", ruled = "\(root)/ruled"
        for dir in [plain, ruled] {
            try await Self.cli(ferry, ["--data", dir, "import", dump, "--batch-size", "10000", "--create"])
        }
        try? FileManager.default.removeItem(atPath: dump)
        let clientTemplate = "\(root)/client-id"
        let clientID = try await Self.nodeID(ferry, clientTemplate)
        let sourceIDs = [false: try await Self.nodeID(ferry, plain), true: try await Self.nodeID(ferry, ruled)]

        // The rules are typed while the source runs; they persist in its store.
        let setup = try NetBench.startServe(ferry, data: ruled, trust: clientID)
        do {
            try await Self.cli(ferry, ["--data", ruled, "invite"])
            for step in Self.ruleSteps(founder: sourceIDs[true]!, role: "puller", principals: [clientID], writes: false) {
                try await Self.cli(ferry, ["--data", ruled] + step)
            }
            let access = try JSON.parse(Array(try await Self.cli(ferry, ["--data", ruled, "--json", "access"]).stdout.utf8))
            let inForce = Self.list(access["rules"]).filter { $0["inForce"]?.boolValue == true }.count
            guard inForce == 20 else { throw BenchError("the source has \(inForce) rules in force, not 20") }
        } catch {
            kill(setup.pid, SIGKILL)
            _ = NetBench.reap(setup.pid)
            throw error
        }
        kill(setup.pid, SIGTERM)
        _ = NetBench.reap(setup.pid)
        print("P1-access: \(count) documents of ~\(bytes / max(1, count)) bytes, \(workload.runs) runs, TLS 1.3 WebSocket on loopback; a source with 20 rules (the puller reads through a selector on `ward`) against a plain one")

        var rates: [Bool: [Double]] = [false: [], true: []]
        for run in 1...workload.runs {
            // Alternate the order so neither side always runs on a warmer machine.
            for withRules in run % 2 == 1 ? [false, true] : [true, false] {
                let (rate, cpu, received) = try await timedPull(
                    ferry: ferry, source: withRules ? ruled : plain, sourceID: sourceIDs[withRules]!, clientID: clientID,
                    template: clientTemplate, into: "\(root)/client-\(run)-\(withRules ? "rules" : "plain")")
                rates[withRules]!.append(rate)
                print(String(format: "  run %d: %@ %6.0f docs/s (server CPU %.2f s, %.1f MiB received)", run, withRules ? "20 rules" : "no rules", rate, cpu,
                    Double(received) / 1_048_576))
            }
        }
        let with = rates[true]!, without = rates[false]!
        let w = Stats(with), o = Stats(without)
        let ratios = zip(with, without).map { $0 / $1 }
        let r = Stats(ratios)
        print(String(format: "pull, no rules     %9.0f docs/s (min %.0f, max %.0f)", o.median, o.min, o.max))
        print(String(format: "pull, 20 rules     %9.0f docs/s (min %.0f, max %.0f)", w.median, w.min, w.max))
        print(String(format: "ratio rules/none   %9.2f (min %.2f, max %.2f)  target >= 0.80  %@", r.median, r.min, r.max, r.median >= 0.8 ? "HOLDS" : "MISSES"))
        return Figure(
            id: "P1-access", name: "Bulk pull over TLS WebSocket from a source enforcing 20 access rules (selectors), relative to no rules",
            value: w.median, unit: "docs/s", baseline: o.median, ratio: r.median, target: ">= 0.8", holds: r.median >= 0.8,
            runs: zip(with, without).map { ($0, $1, $0 / $1) })
    }

    /// One timed pull from a freshly started source into an empty directory; checks that every
    /// document arrived; documents per second, the server's CPU seconds (start-up included) and
    /// the bytes the client received.
    func timedPull(ferry: String, source: String, sourceID: String, clientID: String, template: String, into client: String) async throws
        -> (rate: Double, serverCPU: Double, bytes: Int64)
    {
        let server = try NetBench.startServe(ferry, data: source, trust: clientID)
        defer {
            kill(server.pid, SIGKILL)
            _ = NetBench.reap(server.pid)
            try? FileManager.default.removeItem(atPath: client)
        }
        _ = try NetBench.makeReceiver(client, identityFrom: template)
        let output = client + ".json"
        defer { try? FileManager.default.removeItem(atPath: output) }
        let start = ContinuousClock.now
        let pid = try NetBench.launch(ferry, ["--data", client, "sync", server.url, "--pin", sourceID, "--pull", "--json"], quiet: true, output: output)
        let result = NetBench.reap(pid)
        let elapsed = ContinuousClock.now - start
        let serverCPU = NetBench.cpuMilliseconds(server.pid)
        let summary = (try? JSON.parse(Array((FileManager.default.contents(atPath: output)) ?? Data()))) ?? .null
        guard result.status == 0 else { throw BenchError("ferry sync exited \(result.status): \(summary)") }
        let store = try DocumentStore.openExisting(directory: client)
        let held = try store.allDocuments().filter { !$0.id.rawValue.hasPrefix("_ferry/") }.count
        guard held == workload.count else { throw BenchError("the pull stored \(held) of \(workload.count) documents (\(summary))") }
        return (Double(workload.count) / elapsed.seconds, serverCPU / 1000, summary["bytesReceived"]?.intValue ?? 0)
    }

    // MARK: P9

    /// One `ferry serve` of a mesh.
    struct MeshNode {
        let name: String
        let dir: String
        let id: String
        let process: ChildProcess
        let admin: String
    }

    /// P9 with rules: two four-node group meshes, one with 20 rules (every member's role
    /// admits every document through a selector), one without; blocks of writes on a member
    /// alternate between them. Per write: the time until all three peers have it; per block:
    /// the replication bytes the whole mesh sent.
    func mesh(ferry: String, root: String) async throws -> [Figure] {
        var meshes: [[MeshNode]] = []
        defer {
            for n in meshes.joined() { n.process.signal(SIGKILL) }
        }
        do {
            meshes.append(try await startMesh("plain", rules: false, ferry: ferry, root: root))
            meshes.append(try await startMesh("ruled", rules: true, ferry: ferry, root: root))
        } catch {
            let logs = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).filter { $0.hasSuffix(".log") }.sorted()
            for log in logs { print("--- \(log) (last lines)\n" + Self.logTail("\(root)/\(log)")) }
            throw error
        }
        for (m, name) in zip(meshes, ["no rules", "20 rules"]) {
            let before = m.map { NetBench.cpuMilliseconds($0.process.pid) }
            try await Task.sleep(for: .seconds(2))
            let idle = zip(m, before).map { (NetBench.cpuMilliseconds($0.process.pid) - $1) / 2000 * 100 }
            print(String(format: "P9-access: mesh with %@ up and quiet; idle CPU per node %@%%", name, idle.map { String(format: "%.1f", $0) }.joined(separator: " ")))
            // Relay suppression relies on the links peers report: 3 per peer in a mesh of 4.
            var reported: [String] = []
            for n in m { reported.append("\(n.name) " + (try await Self.reportedLinks(n)).map(String.init).joined(separator: "/")) }
            print("P9-access: mesh with \(name): links each node's peers report: \(reported.joined(separator: ", "))")
        }
        let body = String(repeating: "n", count: 1000)
        let writer = 1  // a member, not the founder: with rules, its role writes through a selector
        var latencies: [[Double]] = [[], []]
        var roundP50: [[Double]] = [[], []]
        var roundBytes: [[Double]] = [[], []]
        var sentBytes = [0.0, 0.0]
        var cpu = [0.0, 0.0]
        var duplicates = [0.0, 0.0]
        var since = [try await Self.lastSequences(meshes[0]), try await Self.lastSequences(meshes[1])]
        var done = 0
        var round = 0
        while done < writes {
            let n = min(block, writes - done)
            for m in round % 2 == 0 ? [0, 1] : [1, 0] {
                let mesh = meshes[m]
                let sentBefore = try await Self.sentBytes(mesh)
                let duplicatesBefore = try await Self.metricSum(mesh, "ferry_documents_duplicate_total")
                let cpuBefore = mesh.map { NetBench.cpuMilliseconds($0.process.pid) }
                var times: [Double] = []
                for k in done..<(done + n) {
                    if gap > 0 { try await Task.sleep(for: .milliseconds(gap)) }
                    let doc = #"{"ward":"\#(Self.wards[k % Self.wards.count])","k":\#(k),"note":"\#(body)"}"#
                    let (ms, seqs) = try await Self.timeWrite(mesh, writer: writer, id: "a-\(k)", body: doc, since: since[m])
                    since[m] = seqs
                    times.append(ms)
                }
                // Let the last write's relays finish before the counters are read.
                try await Task.sleep(for: .milliseconds(300))
                let sent = try await Self.sentBytes(mesh) - sentBefore
                duplicates[m] += try await Self.metricSum(mesh, "ferry_documents_duplicate_total") - duplicatesBefore
                cpu[m] += zip(mesh, cpuBefore).map { NetBench.cpuMilliseconds($0.process.pid) - $1 }.reduce(0, +)
                sentBytes[m] += sent
                latencies[m] += times
                roundP50[m].append(Percentiles(times).p50)
                roundBytes[m].append(sent / Double(n))
            }
            done += n
            round += 1
        }
        let plain = Percentiles(latencies[0]), ruled = Percentiles(latencies[1])
        let bytes = sentBytes.map { $0 / Double(writes) }
        let cpuPerWrite = cpu.map { $0 / Double(writes) }
        let latencyRatio = plain.p50 / ruled.p50
        let bytesRatio = bytes[0] / bytes[1]
        let latencyRounds = Stats(zip(roundP50[0], roundP50[1]).map { $0 / $1 })
        let bytesRounds = Stats(zip(roundBytes[0], roundBytes[1]).map { $0 / $1 })
        print("P9-access: 4 members in a group mesh on loopback, \(writes) writes of ~1 KiB on a member (not the founder) per mesh, blocks of \(block) alternating, \(gap) ms apart")
        for (m, name) in [(0, "no rules"), (1, "20 rules")] {
            let p = Percentiles(latencies[m])
            print(String(format: "mesh, %@  all 3 peers p50 %6.2f ms  p99 %6.2f ms;  %6.0f B of replication messages per write;  %.2f duplicate revisions per write;  CPU %.2f ms per write (4 nodes)",
                name, p.p50, p.p99, bytes[m], duplicates[m] / Double(writes), cpuPerWrite[m]))
        }
        print(String(format: "ratio latency none/rules  p50 %.2f (blocks: min %.2f, max %.2f), p99 %.2f  target >= 0.80  %@",
            latencyRatio, latencyRounds.min, latencyRounds.max, plain.p99 / ruled.p99, latencyRatio >= 0.8 ? "HOLDS" : "MISSES"))
        print(String(format: "ratio bytes none/rules        %.2f (blocks: min %.2f, max %.2f)  target >= 0.80  %@",
            bytesRatio, bytesRounds.min, bytesRounds.max, bytesRatio >= 0.8 ? "HOLDS" : "MISSES"))
        for n in meshes.joined() { _ = await n.process.stop(SIGTERM, grace: 10) }
        return [
            Figure(
                id: "P9-access-latency", name: "A 1 KiB write to all 3 peers of a 4-node group mesh, p50, with 20 access rules (runs: p50, p99) against none",
                value: ruled.p50, unit: "ms", baseline: plain.p50, ratio: latencyRatio, target: ">= 0.8 (none/rules)", holds: latencyRatio >= 0.8,
                runs: [(ruled.p50, plain.p50, latencyRatio), (ruled.p99, plain.p99, plain.p99 / ruled.p99)]),
            Figure(
                id: "P9-access-bytes", name: "Replication bytes per 1 KiB write, whole 4-node group mesh, with 20 access rules (runs: blocks) against none",
                value: bytes[1], unit: "bytes", baseline: bytes[0], ratio: bytesRatio, target: ">= 0.8 (none/rules)", holds: bytesRatio >= 0.8,
                runs: zip(roundBytes[1], roundBytes[0]).map { ($0, $1, $1 / $0) }),
        ]
    }

    /// Starts four nodes, makes them one group (`invite` on the first, `join` on the others),
    /// types the 20 rules if asked, and waits until every link is up and the mesh is quiet.
    func startMesh(_ prefix: String, rules: Bool, ferry: String, root: String) async throws -> [MeshNode] {
        // Without avahi, members dial each other where their entries say they listen.
        var environment = ProcessInfo.processInfo.environment.filter { $0.key != "FERRY_DATA" }
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = "unix:path=/nonexistent/ferry-no-dbus"
        var nodes: [MeshNode] = []
        for i in 1...4 {
            let name = "\(prefix)-\(i)", dir = "\(root)/\(prefix)-\(i)", log = "\(root)/\(prefix)-\(i).log"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let id = try await Self.nodeID(ferry, dir)
            let process = try ChildProcess.spawn(
                ferry,
                ["--data", dir, "serve", "--name", name, "--port", "0", "--admin-port", "0", "--couch-port", "0", "--discovery", "--interface", "127.0.0.1"],
                environment: environment, stdoutPath: log, stderrPath: log)
            let info = try await NetBench.waitForNodeFile(dir, pid: process.pid)
            nodes.append(MeshNode(name: name, dir: dir, id: id, process: process, admin: info["adminURL"]?.stringValue ?? ""))
        }
        for n in nodes.dropFirst() {
            let invite = try await Self.cli(ferry, ["--data", nodes[0].dir, "--json", "invite"])
            guard let code = try JSON.parse(Array(invite.stdout.utf8))["code"]?.stringValue else { throw BenchError("no code: \(invite.stdout)") }
            try await Self.cli(ferry, ["--data", n.dir, "join", code])
        }
        let members = nodes
        try await waitUntil("every \(prefix) member is linked to the other three", timeout: 120) {
            for n in members where try await Self.connectedPeers(n).count < 3 { return false }
            return true
        }
        if rules {
            for step in Self.ruleSteps(founder: nodes[0].id, role: "member", principals: nodes.dropFirst().map(\.id), writes: true) {
                try await Self.cli(ferry, ["--data", nodes[0].dir] + step)
            }
            let version = try await get(nodes[0].admin + "/")["access"]?["version"]?.stringValue ?? ""
            try await waitUntil("every \(prefix) member has the 20 rules", timeout: 120) {
                for n in members {
                    let access = try await get(n.admin + "/")["access"]
                    guard access?["version"]?.stringValue == version, access?["rules"]?.intValue == 20 else { return false }
                }
                return true
            }
            for n in members.dropFirst() {
                let own = Self.list(try await get(n.admin + "/access")["self"]?["roles"]).compactMap(\.stringValue)
                guard own == ["member"] else { throw BenchError("\(n.name) has roles \(own), not member") }
            }
            try await waitUntil("every \(prefix) member is linked again after the rules", timeout: 120) {
                for n in members where try await Self.connectedPeers(n).count < 3 { return false }
                return true
            }
        }
        try await Self.waitUntilQuiet(nodes, prefix)
        return nodes
    }

    /// Waits until the mesh sends no more than its heartbeats (64 bytes a second per link
    /// and direction allowed) for two seconds running.
    static func waitUntilQuiet(_ nodes: [MeshNode], _ prefix: String) async throws {
        let start = ContinuousClock.now
        let idleRate = Double(nodes.count * (nodes.count - 1)) * 64
        var last = try await sentBytes(nodes)
        var lastBusy = ContinuousClock.now
        while ContinuousClock.now - lastBusy < .seconds(2) {
            guard ContinuousClock.now - start < .seconds(120) else { throw BenchError("the \(prefix) mesh never went quiet") }
            try await Task.sleep(for: .seconds(1))
            let sent = try await sentBytes(nodes)
            if sent - last > idleRate { lastBusy = ContinuousClock.now }
            last = sent
        }
    }

    /// Writes `body` as `id` on node `writer` and waits until every other node's change feed
    /// names it: milliseconds from the write to the last arrival, and each node's feed position.
    static func timeWrite(_ mesh: [MeshNode], writer: Int, id: String, body: String, since: [Int64]) async throws -> (Double, [Int64]) {
        try await withThrowingTaskGroup(of: (Int, ContinuousClock.Instant, Int64).self) { group in
            for i in mesh.indices where i != writer {
                let node = mesh[i], start = since[i]
                group.addTask {
                    var seq = start
                    let deadline = ContinuousClock.now + .seconds(60)
                    while ContinuousClock.now < deadline {
                        let feed = try await get(node.admin + "/changes?since=\(seq)&feed=longpoll&timeout=30000")
                        let now = ContinuousClock.now
                        seq = feed["last_seq"]?.intValue ?? seq
                        if Self.list(feed["results"]).contains(where: { $0["id"]?.stringValue == id }) { return (i, now, seq) }
                    }
                    throw BenchError("\(id) did not reach \(node.name)")
                }
            }
            try await Task.sleep(for: .milliseconds(1))  // let the long-polls reach the nodes first
            let t0 = ContinuousClock.now
            try await put(mesh[writer], id, body)
            var seqs = since
            var last = t0
            for try await (i, t, seq) in group {
                seqs[i] = seq
                last = max(last, t)
            }
            return ((last - t0).seconds * 1000, seqs)
        }
    }

    static func put(_ node: MeshNode, _ id: String, _ body: String) async throws {
        let url = node.admin + "/docs/" + id
        let headers = AdminKeys.shared.headers(for: url) + [("Content-Type", "application/json")]
        let reply = try await BenchHTTPClient.shared.request("PUT", url, headers: headers, body: Array(body.utf8))
        guard reply.status == 201 else { throw BenchError("PUT \(id) on \(node.name): \(reply.status) \(String(decoding: reply.body, as: UTF8.self))") }
    }

    static func lastSequences(_ nodes: [MeshNode]) async throws -> [Int64] {
        try await nodes.asyncMap { try await get($0.admin + "/changes?since=\(Int64.max)&limit=1")["last_seq"]?.intValue ?? 0 }
    }

    /// Replication message bytes the nodes have sent so far, summed.
    static func sentBytes(_ nodes: [MeshNode]) async throws -> Double { try await metricSum(nodes, "ferry_bytes_sent_total") }

    /// A metric summed over the nodes (and its label sets).
    static func metricSum(_ nodes: [MeshNode], _ name: String) async throws -> Double {
        try await nodes.asyncMap { n in
            let url = n.admin + "/metrics"
            let reply = try await BenchHTTPClient.shared.request("GET", url, headers: AdminKeys.shared.headers(for: url))
            return AdminClient.metricTotal(in: String(decoding: reply.body, as: UTF8.self), name)
        }.reduce(0, +)
    }

    /// The trusted peers a node lists as connected.
    static func connectedPeers(_ node: MeshNode) async throws -> Set<String> {
        guard case .array(let list)? = try await get(node.admin + "/peers")["peers"] else { return [] }
        return Set(list.filter { $0["trusted"] == true && $0["connected"] == true }.compactMap { $0["id"]?.stringValue })
    }

    /// How many live links each connected peer of `node` reports in its heartbeats.
    static func reportedLinks(_ node: MeshNode) async throws -> [Int] {
        list(try await get(node.admin + "/peers")["peers"]).filter { $0["connected"] == true }.map { list($0["links"]).count }
    }

    /// The elements of a JSON array (none for anything else).
    static func list(_ value: JSON?) -> [JSON] {
        if case .array(let a)? = value { return a }
        return []
    }

    static func logTail(_ path: String, lines: Int = 30) -> String {
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        return text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
    }
}
