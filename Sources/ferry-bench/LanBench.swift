import ArgumentParser
import FerryCore
import Foundation
import IntegrationHarness

/// P8–P10: a LAN of K hosts in the lab (network namespaces on one bridge, an avahi-daemon
/// each, nodes finding each other over mDNS). For each K: a node joins K−1 nodes that hold
/// the same documents (P8: time from process start to an equal digest, bytes received
/// against the documents' bytes, revisions received twice); writes of 1 KiB rotate over the
/// nodes (P9: bytes on the wire and CPU per write, mesh-wide, and first-peer and all-peer
/// latency through long-poll change feeds); a host's cable is pulled and put back (P10: time
/// until every other node shows it offline, and from the heal to equal digests).
struct LanBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lan",
        abstract: "P8–P10: a LAN of K lab hosts (root): join, cost per write, dead-link detection and heal.")

    @Option(help: "Host counts, comma-separated.") var hosts = "8,16"
    @Option(help: "Documents of about 1 KiB the group holds when a node joins.") var docs = 10_000
    @Option(help: "Writes for the per-write figures, one at a time, on the nodes in turn.") var writes = 200
    @Option(help: "Directory for scratch data.") var scratch = "/var/tmp"
    @Option(help: "Also record the figures in this JSON report.") var report: String?
    @Option(help: "Seconds to pause after the join's traffic ends, printing the node PIDs, before the writes (to inspect the nodes).")
    var pauseAfterJoin = 0

    /// One running node on a lab host.
    struct LabNode {
        let index: Int
        let host: LabHost
        let data: String
        let pid: pid_t
        let admin: String
        var namespace: NetworkNamespace { NetworkNamespace(holderPID: host.holderPID) }
    }

    func run() async throws {
        guard getuid() == 0 else { throw BenchError("lan: the LAN lab needs root") }
        if let why = await Lab.unavailableReason() { throw BenchError("lan: \(why)") }
        let counts = hosts.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !counts.isEmpty, counts.allSatisfy({ $0 >= 3 }) else { throw BenchError("--hosts takes counts of at least 3, e.g. 8,16") }
        var figures: [Figure] = []
        for k in counts { figures += try await measure(k) }
        if let report { try BenchReport.record(figures, in: report) }
    }

    func measure(_ k: Int) async throws -> [Figure] {
        sync()
        let root = try makeScratchDirectory(in: scratch, prefix: "ferry-bench-lan")
        defer { try? FileManager.default.removeItem(atPath: root) }
        let lab = try await Lab(hosts: k)
        var started: [LabNode] = []
        do {
            let figures = try await measure(k, lab: lab, root: root, started: &started)
            for n in started { kill(n.pid, SIGTERM) }
            await lab.tearDown()
            return figures
        } catch {
            for n in started { kill(n.pid, SIGKILL) }
            await lab.tearDown()
            throw error
        }
    }

    func measure(_ k: Int, lab: Lab, root: String, started: inout [LabNode]) async throws -> [Figure] {
        let ferry = NetBench.ferryBinary()
        let dirs = (1...k).map { "\(root)/n\($0)" }
        let ids = try dirs.map { try NetBench.capture(ferry, ["--data", $0, "id"]).trimmingCharacters(in: .whitespacesAndNewlines) }
        // The same documents imported on every node but the last: the same edits make the
        // same revision IDs, so those nodes start converged.
        let dump = "\(root)/docs.ndjson"
        let dataBytes = try DocumentFixtures.writeKiBDocuments(docs, to: dump)
        for dir in dirs.dropLast() {
            guard NetBench.reap(try NetBench.launch(ferry, ["--data", dir, "import", dump, "--create"], quiet: true)).status == 0 else {
                throw BenchError("import into \(dir) failed")
            }
        }
        func start(_ i: Int) async throws -> LabNode {
            var args = lab.hosts[i].nsenterArguments + [ferry, "--data", dirs[i], "serve", "--name", "n\(i + 1)", "--port", "4985"]
            args += ["--admin-port", "0", "--couch-port", "0", "--discovery", "--group", "bench", "--interface", "0.0.0.0"]
            for (j, id) in ids.enumerated() where j != i { args += ["--trust", id] }
            let pid = try NetBench.launch("/usr/bin/nsenter", args, quiet: true)
            let info = try await NetBench.waitForNodeFile(dirs[i], pid: pid)
            return LabNode(index: i, host: lab.hosts[i], data: dirs[i], pid: pid, admin: info["adminURL"]?.stringValue ?? "")
        }
        for i in 0..<(k - 1) { started.append(try await start(i)) }
        let members = started
        try await waitUntil("the \(k - 1) members are linked", timeout: 300) {
            for n in members where try await Self.connectedPeers(n).count < k - 2 { return false }
            return true
        }
        say("lan: K = \(k) hosts, \(docs) documents of ~1 KiB on \(k - 1) of them, mesh up")

        // P8: the K-th node joins.
        let reference = try await Self.digest(members[0])
        let joinStart = ContinuousClock.now
        let joiner = try await start(k - 1)
        started.append(joiner)
        try await waitUntil("the joiner holds every document", timeout: 600, every: .milliseconds(20)) {
            try await Self.digest(joiner) == reference
        }
        let joinTime = (ContinuousClock.now - joinStart).seconds
        let joinMetrics = try await Self.metrics(joiner)
        let received = AdminClient.metricTotal(in: joinMetrics, "ferry_bytes_received_total")
        let duplicates = AdminClient.metricTotal(in: joinMetrics, "ferry_documents_duplicate_total")
        let bytesRatio = received / Double(dataBytes)
        let duplicateShare = duplicates / Double(docs)
        say(String(format: "P8 join: %.2f s from process start to equal digest (target <= 3 s)  %@", joinTime, joinTime <= 3 ? "HOLDS" : "MISSES"))
        say(String(format: "P8 join: received %.1f MB for %.1f MB of documents: %.2fx (target <= 1.2x)  %@", received / 1e6,
            Double(dataBytes) / 1e6, bytesRatio, bytesRatio <= 1.2 ? "HOLDS" : "MISSES"))
        say(String(format: "P8 join: %.0f duplicate revisions, %.2f%% (target <= 1%%)  %@", duplicates, duplicateShare * 100,
            duplicateShare <= 0.01 ? "HOLDS" : "MISSES"))

        // P9: writes rotating over the nodes, each timed to the first and to the last peer.
        let nodes = started
        try await waitUntil("every node is linked to the other \(k - 1)", timeout: 300) {
            for n in nodes where try await Self.connectedPeers(n).count < k - 1 { return false }
            return true
        }
        // The join's aftermath (the joiner's pushes, relays and checkpoints) must be over
        // before writes are timed: wait until the mesh sends no more than its idle heartbeats
        // (about 25 bytes a second each way per link; 64 allowed) for two seconds running.
        let quietStart = ContinuousClock.now
        let idleRate = Double(k * (k - 1)) * 64
        var lastSent = try await nodes.asyncMap { AdminClient.metricTotal(in: try await Self.metrics($0), "ferry_bytes_sent_total") }.reduce(0, +)
        var lastBusy = ContinuousClock.now
        while ContinuousClock.now - lastBusy < .seconds(2) {
            guard ContinuousClock.now - quietStart < .seconds(300) else { throw BenchError("the mesh never went quiet after the join") }
            try await Task.sleep(for: .seconds(1))
            let sent = try await nodes.asyncMap { AdminClient.metricTotal(in: try await Self.metrics($0), "ferry_bytes_sent_total") }.reduce(0, +)
            if sent - lastSent > idleRate { lastBusy = ContinuousClock.now }
            lastSent = sent
        }
        let aftermath = (lastBusy - joinStart).seconds
        say(String(format: "P8 join: the mesh's replication traffic of the join ended %.1f s after the joiner started", aftermath))
        if pauseAfterJoin > 0 {
            say("pausing \(pauseAfterJoin) s; node PIDs: \(nodes.map { String($0.pid) }.joined(separator: " "))")
            try await Task.sleep(for: .seconds(pauseAfterJoin))
        }
        let idleBefore = nodes.map { NetBench.cpuMilliseconds($0.pid) }
        try await Task.sleep(for: .seconds(2))
        let idle = zip(nodes, idleBefore).map { (NetBench.cpuMilliseconds($0.pid) - $1) / 2000 * 100 }
        var since = try await nodes.asyncMap { try await Self.lastSequence($0) }
        let body = #"{"text":"\#(String(repeating: "w", count: 1000))"}"#
        var first: [Double] = []
        var all: [Double] = []
        for w in 0..<writes {
            let writer = nodes[w % k]
            let start = ContinuousClock.now
            let startAfter = since
            let arrivals = try await withThrowingTaskGroup(of: (Int, Double, Int64).self) { group in
                for (i, (n, seq)) in zip(nodes, startAfter).enumerated() {
                    group.addTask {
                        let feed = try await Self.get(n, "/changes?since=\(seq)&feed=longpoll&timeout=30000")
                        return (i, (ContinuousClock.now - start).seconds * 1000, feed["last_seq"]?.intValue ?? seq)
                    }
                }
                try await Task.sleep(for: .milliseconds(2))  // let the long-polls reach the nodes first
                let t0 = ContinuousClock.now
                _ = try await Self.call(writer, "PUT", "/docs/w-\(k)-\(w)", body: body)
                let offset = (t0 - start).seconds * 1000
                var out = [Double](repeating: 0, count: nodes.count)
                for try await (i, t, seq) in group {
                    out[i] = t - offset
                    since[i] = seq
                }
                return out
            }
            let peers = arrivals.enumerated().filter { $0.offset != writer.index }.map(\.element)
            first.append(peers.min() ?? 0)
            all.append(peers.max() ?? 0)
            // Let relays and checkpoints of this write settle, so each write meets a quiet mesh.
            try await Task.sleep(for: .milliseconds(20))
        }
        // The cost pass: the same writes again with no change feed open (answering K
        // long-polls per write is the benchmark's work, not replication's), 50 ms apart.
        let wireBefore = try await Self.wireBytes(k)
        let appBefore = try await nodes.asyncMap { AdminClient.metricTotal(in: try await Self.metrics($0), "ferry_bytes_sent_total") }
        let cpuBefore = nodes.map { NetBench.cpuMilliseconds($0.pid) }
        for w in 0..<writes {
            _ = try await Self.call(nodes[w % k], "PUT", "/docs/c-\(k)-\(w)", body: body)
            try await Task.sleep(for: .milliseconds(50))
        }
        try await Task.sleep(for: .milliseconds(500))
        let wirePerWrite = Double(try await Self.wireBytes(k) - wireBefore) / Double(writes)
        let appAfter = try await nodes.asyncMap { AdminClient.metricTotal(in: try await Self.metrics($0), "ferry_bytes_sent_total") }
        let appPerWrite = zip(appAfter, appBefore).map { $0 - $1 }.reduce(0, +) / Double(writes)
        let cpuPerWrite = zip(nodes, cpuBefore).map { NetBench.cpuMilliseconds($0.pid) - $1 }.reduce(0, +) / Double(writes)
        let byteTarget = Double(k - 1) * 1536 + Double(k) * 200
        let cpuTarget = Double(k) * 2
        let p1 = Percentiles(first), pa = Percentiles(all)
        say(String(format: "P9 idle CPU per node: %@%%", idle.map { String(format: "%.1f", $0) }.joined(separator: " ")))
        say(String(format: "P9 bytes per 1 KiB write, whole mesh: %.0f B on the wire (target <= %.0f B)  %@; %.0f B of replication messages",
            wirePerWrite, byteTarget, wirePerWrite <= byteTarget ? "HOLDS" : "MISSES", appPerWrite))
        say(String(format: "P9 CPU per write, whole mesh: %.1f ms (target <= %.0f ms)  %@", cpuPerWrite, cpuTarget,
            cpuPerWrite <= cpuTarget ? "HOLDS" : "MISSES"))
        say(String(format: "P9 latency: first peer p50 %.2f ms p99 %.2f ms; all %d peers p50 %.2f ms p99 %.2f ms", p1.p50, p1.p99, k - 1, pa.p50, pa.p99))

        // P10: the last host's cable is pulled, both sides write, the cable comes back.
        let cut = nodes[k - 1]
        let cutID = ids[k - 1]
        let others = Array(nodes.dropLast())
        let partitionStart = ContinuousClock.now
        try await lab.partition(cut.host)
        // When each other node first stops listing the cut-off host as connected, and when
        // the cut-off host lists none; a side that never notices counts as the whole wait.
        var seenOffline: [Int: Double] = [:]
        let deadline = partitionStart + .seconds(60)
        while seenOffline.count < nodes.count && ContinuousClock.now < deadline {
            for n in nodes where seenOffline[n.index] == nil {
                let offline = n.index == cut.index ? try await Self.connectedPeers(n).isEmpty : try await !Self.connectedPeers(n).contains(cutID)
                if offline { seenOffline[n.index] = (ContinuousClock.now - partitionStart).seconds }
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        if seenOffline.count < nodes.count { say("P10 dead link: \(nodes.count - seenOffline.count) of \(nodes.count) nodes did not notice the pulled cable in 60 s") }
        let detection = seenOffline.count < nodes.count ? 60 : seenOffline.values.max() ?? 0
        _ = try await Self.call(others[0], "PUT", "/docs/cut-majority-\(k)", body: "{}")
        _ = try await Self.call(cut, "PUT", "/docs/cut-island-\(k)", body: "{}")
        try await Task.sleep(for: .seconds(2))
        let healStart = ContinuousClock.now
        try await lab.heal(cut.host)
        try await waitUntil("all digests are equal after the heal", timeout: 300, every: .milliseconds(50)) {
            let d = try await nodes.asyncMap { try await Self.digest($0) }
            return Set(d).count == 1
        }
        let heal = (ContinuousClock.now - healStart).seconds
        say(String(format: "P10 dead link: first node saw it %@ after the cable was pulled, all nodes (both sides) %.2f s (target <= 5 s)  %@",
            seenOffline.values.min().map { String(format: "%.2f s", $0) } ?? "never", detection, detection <= 5 ? "HOLDS" : "MISSES"))
        say(String(format: "P10 heal: %.2f s from the cable's return to equal digests (target <= 5 s)  %@", heal, heal <= 5 ? "HOLDS" : "MISSES"))

        let tag = "K\(k)"
        func figure(_ id: String, _ name: String, _ value: Double, _ unit: String, baseline: Double?, target: String, holds: Bool) -> Figure {
            let ratio = baseline.map { value / $0 } ?? value
            return Figure(id: "\(id)-\(tag)", name: name, value: value, unit: unit, baseline: baseline, ratio: ratio, target: target, holds: holds,
                runs: [(value, baseline, ratio)])
        }
        return [
            figure("P8-join-time", "A node joins \(k - 1) nodes holding \(docs) documents: process start to equal digest", joinTime, "s",
                baseline: nil, target: "<= 3 s", holds: joinTime <= 3),
            figure("P8-join-bytes", "Bytes the joiner received, against the documents' bytes", received, "bytes", baseline: Double(dataBytes),
                target: "ratio <= 1.2", holds: bytesRatio <= 1.2),
            figure("P8-join-duplicates", "Revisions the joiner received twice, as a share of the documents", duplicateShare * 100, "%",
                baseline: nil, target: "<= 1 %", holds: duplicateShare <= 0.01),
            figure("P9-write-bytes", "Bytes on the wire per 1 KiB write, whole mesh (baseline: the target)", wirePerWrite, "bytes",
                baseline: byteTarget, target: "ratio <= 1", holds: wirePerWrite <= byteTarget),
            figure("P9-write-cpu", "CPU per write, whole mesh (baseline: the target)", cpuPerWrite, "ms", baseline: cpuTarget,
                target: "ratio <= 1", holds: cpuPerWrite <= cpuTarget),
            Figure(id: "P9-latency-\(tag)", name: "Write to visible on the first peer (p50; runs: first p50, p99, all p50, p99)",
                value: p1.p50, unit: "ms", baseline: nil, ratio: p1.p50, target: "reported", holds: true,
                runs: [(p1.p50, nil, p1.p50), (p1.p99, nil, p1.p99), (pa.p50, nil, pa.p50), (pa.p99, nil, pa.p99)]),
            figure("P10-detect", "A pulled cable: time until every node on both sides shows the link offline", detection, "s",
                baseline: nil, target: "<= 5 s", holds: detection <= 5),
            figure("P10-heal", "The cable back: time until every digest is equal", heal, "s", baseline: nil, target: "<= 5 s",
                holds: heal <= 5),
        ]
    }

    static func call(_ node: LabNode, _ method: String, _ path: String, body: String? = nil) async throws -> BenchHTTPClient.Reply {
        var headers = AdminKeys.shared.headers(for: node.admin + path)
        if body != nil { headers.append(("Content-Type", "application/json")) }
        return try await BenchHTTPClient.shared.request(
            method, node.admin + path, headers: headers, body: body.map { Array($0.utf8) }, namespace: node.namespace)
    }

    static func get(_ node: LabNode, _ path: String) async throws -> JSON {
        let reply = try await call(node, "GET", path)
        guard reply.status == 200 else { throw BenchError("GET \(path) on n\(node.index + 1): \(reply.status)") }
        return (try? JSON.parse(reply.body)) ?? .null
    }

    static func digest(_ node: LabNode) async throws -> String { try await get(node, "/")["digest"]?.stringValue ?? "" }
    static func lastSequence(_ node: LabNode) async throws -> Int64 { try await get(node, "/changes?since=\(Int64.max)&limit=1")["last_seq"]?.intValue ?? 0 }
    static func metrics(_ node: LabNode) async throws -> String { String(decoding: try await call(node, "GET", "/metrics").body, as: UTF8.self) }

    /// The trusted peers a node lists as connected.
    static func connectedPeers(_ node: LabNode) async throws -> Set<String> {
        let peers = try await get(node, "/peers")["peers"]
        guard case .array(let list)? = peers else { return [] }
        return Set(list.filter { $0["trusted"] == true && $0["connected"] == true }.compactMap { $0["id"]?.stringValue })
    }

    /// Bytes every host has sent onto the lab's bridge so far (its ports' receive counters).
    static func wireBytes(_ k: Int) async throws -> Int {
        let r = try await Shell.bash(
            "for n in $(seq 1 \(k)); do ip netns exec ferrylab-br cat /sys/class/net/p$n/statistics/rx_bytes; done")
        return r.stdout.split(separator: "\n").compactMap { Int($0) }.reduce(0, +)
    }
}

extension Array {
    /// Maps in order, awaiting each element's transform.
    func asyncMap<T>(_ transform: (Element) async throws -> T) async throws -> [T] {
        var out: [T] = []
        for e in self { out.append(try await transform(e)) }
        return out
    }
}

/// Prints a line at once, unbuffered, so a long run's figures show as they are measured.
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
