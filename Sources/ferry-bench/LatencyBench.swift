import ArgumentParser
import FerryCore
import FerryTransport
import Foundation
import Logging


/// P2: propagation latency. Five `ferry serve` nodes in continuous sync (one link per pair);
/// one write at a time on node 1; the time until it is visible on the first peer and on all
/// four, read through long-poll change feeds opened before the write. Same-run baseline:
/// the round-trip time of a small message over a raw TLS WebSocket on this machine.
struct LatencyBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "latency", abstract: "P2: write-to-visible latency across 5 nodes (one peer p50 <= 5 ms; all 4 p50 <= 20 ms, p99 <= 100 ms).")

    @Option(help: "Writes, one at a time.") var writes = 1000
    @Option(help: "Milliseconds between a write being seen everywhere and the next write, so each write meets a quiet mesh (the peers' relays of the previous one done); 0: back to back.")
    var gap = 20
    @Option(help: "Nodes in the mesh.") var nodes = 5
    @Option(help: "mesh: every node links to every other (as DNS-SD discovery makes them); star: only node 1 links to the others, so no peer relays a write to another.")
    var topology = "mesh"
    @Option(help: "Directory for scratch data.") var scratch = NSTemporaryDirectory()
    @Option(help: "Also record the figures in this JSON report.") var report: String?

    struct NodeProcess {
        let pid: pid_t
        let admin: String
    }

    /// The nodes node `i` dials (each dials only nodes started before it, which are later indices).
    func dialed(by i: Int) -> [Int] {
        topology == "star" ? (i == 0 ? Array(1..<nodes) : []) : Array((i + 1)..<nodes)
    }

    func run() async throws {
        guard topology == "mesh" || topology == "star" else { throw BenchError("--topology must be mesh or star") }
        // Start from a quiet disk: dirty pages left by an earlier benchmark (`make bench`
        // runs `net` just before) would otherwise be written back under the nodes' fsyncs.
        sync()
        let root = try makeScratchDirectory(in: scratch, prefix: "ferry-bench-latency")
        defer { try? FileManager.default.removeItem(atPath: root) }
        let ferry = NetBench.ferryBinary()
        let dirs = (1...nodes).map { "\(root)/n\($0)" }
        let ids = try dirs.map { try NetBench.capture(ferry, ["--data", $0, "id"]).trimmingCharacters(in: .whitespacesAndNewlines) }
        var started: [NodeProcess] = []
        var urls = [String](repeating: "", count: nodes)
        defer { for n in started { kill(n.pid, SIGTERM) } }
        // Start from the last node, so that each node can dial every node after it.
        for i in (0..<nodes).reversed() {
            var args = ["--data", dirs[i], "serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--no-discovery", "--interface", "127.0.0.1"]
            for (j, id) in ids.enumerated() where j != i { args += ["--trust", id] }
            for j in dialed(by: i) { args += ["--peer", "\(urls[j])#\(ids[j])"] }
            let pid = try NetBench.launch(ferry, args, quiet: true)
            let info = try await NetBench.waitForNodeFile(dirs[i], pid: pid)
            urls[i] = info["url"]?.stringValue ?? ""
            started.append(NodeProcess(pid: pid, admin: info["adminURL"]?.stringValue ?? ""))
        }
        let byIndex = started.reversed().map { $0 }  // index 0 is node 1
        // Wait until every node sees all its links up.
        try await waitUntilMeshIsUp(byIndex)
        let rtt = try await rawRoundTrip(root: root, count: 200)
        print("latency: \(nodes) nodes (\(topology)), \(writes) writes on node 1, \(gap) ms apart, long-poll change feeds on the others; raw TLS WebSocket RTT p50 \(fmt(rtt.p50)) ms")
        var first: [Double] = []
        var all: [Double] = []
        var local: [Double] = []
        var puts: [Double] = []
        let writer = byIndex[0]
        // Each feed's reply gives the sequence the next one starts after (GET / would also
        // compute each node's content digest between writes, for nothing).
        // What the nodes use with nothing to do, so the per-write figures below can be read.
        let idleBefore = byIndex.map { NetBench.cpuMilliseconds($0.pid) }
        try await Task.sleep(for: .seconds(2))
        let idle = zip(byIndex, idleBefore).map { (NetBench.cpuMilliseconds($0.pid) - $1) / 2000 * 100 }
        print(String(format: "idle CPU: writer %.1f%%, peers %@%%", idle[0], idle.dropFirst().map { String(format: "%.1f", $0) }.joined(separator: ", ")))
        var since = try await lastSequences(byIndex)
        let cpuBefore = byIndex.map { NetBench.cpuMilliseconds($0.pid) }
        for k in 0..<writes {
            if gap > 0 { try await Task.sleep(for: .milliseconds(gap)) }
            let start = ContinuousClock.now
            let startAfter = since
            let arrivals = try await withThrowingTaskGroup(of: (Int, Double, Int64).self) { group in
                // The writer's own feed too: how much of the latency is the write and the HTTP feed.
                for (index, (peer, seq)) in zip(byIndex, startAfter).enumerated() {
                    group.addTask {
                        let feed = try await get(peer.admin + "/changes?since=\(seq)&feed=longpoll&timeout=10000")
                        return (index, (ContinuousClock.now - start).seconds * 1000, feed["last_seq"]?.intValue ?? seq)
                    }
                }
                try await Task.sleep(for: .microseconds(200))  // let the long-polls reach the nodes first
                let t0 = ContinuousClock.now
                _ = try await request("PUT", writer.admin + "/docs/lat-\(k)", body: #"{"k":\#(k)}"#)
                puts.append((ContinuousClock.now - t0).seconds * 1000)
                let offset = (t0 - start).seconds * 1000
                var out = [Double](repeating: 0, count: byIndex.count)
                for try await (index, t, seq) in group {
                    out[index] = t - offset
                    since[index] = seq
                }
                return out
            }
            local.append(arrivals[0])
            first.append(arrivals.dropFirst().min() ?? 0)
            all.append(arrivals.dropFirst().max() ?? 0)
        }
        let cpu = zip(byIndex, cpuBefore).map { (NetBench.cpuMilliseconds($0.pid) - $1) / Double(writes) }
        let p1 = Percentiles(first), pa = Percentiles(all), pl = Percentiles(local)
        print(String(format: "CPU per write: writer %.2f ms, peers %.2f ms in all (each: %@)", cpu[0], cpu.dropFirst().reduce(0, +),
            cpu.dropFirst().map { String(format: "%.2f", $0) }.joined(separator: ", ")))
        print(String(format: "the write's own reply p50 %7.2f ms", Percentiles(puts).p50))
        print(String(format: "writer's own feed p50 %7.2f ms  p99 %7.2f ms  (the write and the HTTP feed, no replication)", pl.p50, pl.p99))
        print(String(format: "one peer   p50 %7.2f ms  p99 %7.2f ms  target p50 <= 5 ms    %@", p1.p50, p1.p99, p1.p50 <= 5 ? "HOLDS" : "MISSES"))
        print(String(format: "all peers  p50 %7.2f ms  p99 %7.2f ms  target p50 <= 20, p99 <= 100 ms  %@", pa.p50, pa.p99, pa.p50 <= 20 && pa.p99 <= 100 ? "HOLDS" : "MISSES"))
        print(String(format: "ratio one-peer p50 / raw RTT p50  %.1f", p1.p50 / rtt.p50))
        if let report {
            try BenchReport.record([
                Figure(
                    id: "P2-one", name: "Propagation latency to the first of 4 peers, p50 (p99 in runs)", value: p1.p50, unit: "ms",
                    baseline: rtt.p50, ratio: p1.p50 / rtt.p50, target: "p50 <= 5 ms", holds: p1.p50 <= 5,
                    runs: [(p1.p50, rtt.p50, p1.p50 / rtt.p50), (p1.p99, rtt.p99, p1.p99 / rtt.p99)]),
                Figure(
                    id: "P2-all", name: "Propagation latency to all 4 peers, p50 (p99 in runs)", value: pa.p50, unit: "ms",
                    baseline: rtt.p50, ratio: pa.p50 / rtt.p50, target: "p50 <= 20 ms, p99 <= 100 ms", holds: pa.p50 <= 20 && pa.p99 <= 100,
                    runs: [(pa.p50, rtt.p50, pa.p50 / rtt.p50), (pa.p99, rtt.p99, pa.p99 / rtt.p99)]),
            ], in: report)
        }
    }

    func fmt(_ v: Double) -> String { String(format: "%.3f", v) }

    func waitUntilMeshIsUp(_ nodes: [NodeProcess]) async throws {
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            var up = true
            // Node i lists the nodes it dials (those after it); each link must be up and idle.
            for (i, n) in nodes.enumerated() {
                // Peers that dialled this node are listed too (inbound): count only its own links.
                guard case .array(let all)? = try await get(n.admin + "/peers")["peers"] else { up = false; break }
                let list = all.filter { $0["dialled"] == true }
                guard list.count == dialed(by: i).count,
                    list.allSatisfy({ $0["connected"] == true && $0["replication"]?["activity"] == "idle" })
                else {
                    up = false
                    break
                }
            }
            if up { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw BenchError("the mesh did not come up")
    }

    func lastSequences(_ nodes: [NodeProcess]) async throws -> [Int64] {
        var out: [Int64] = []
        for n in nodes { out.append(try await get(n.admin + "/")["lastSequence"]?.intValue ?? 0) }
        return out
    }

    /// Median and 99th percentile of small-message round trips over a raw TLS WebSocket.
    func rawRoundTrip(root: String, count: Int) async throws -> Percentiles {
        let raw = try await RawWebSocket.start(root: root, name: "rtt") { endpoint in
            do { for try await m in endpoint.incoming { try await endpoint.send(m) } } catch {}
        }
        defer { raw.stop() }
        let endpoint = try await raw.connect()
        var it = endpoint.incoming.makeAsyncIterator()
        var times: [Double] = []
        for _ in 0..<count {
            let t = ContinuousClock.now
            try await endpoint.send(Array(repeating: 7, count: 64))
            _ = try await it.next()
            times.append((ContinuousClock.now - t).seconds * 1000)
        }
        await endpoint.close(error: nil)
        return Percentiles(times)
    }
}

/// p50 and p99 of a sample.
struct Percentiles {
    let p50: Double
    let p99: Double
    init(_ values: [Double]) {
        let s = values.sorted()
        p50 = s.isEmpty ? 0 : s[s.count / 2]
        p99 = s.isEmpty ? 0 : s[min(s.count - 1, Int(Double(s.count) * 0.99))]
    }
}

func get(_ url: String) async throws -> JSON {
    try await request("GET", url, body: nil)
}

func request(_ method: String, _ url: String, body: String?) async throws -> JSON {
    var headers = AdminKeys.shared.headers(for: url)
    if body != nil { headers.append(("Content-Type", "application/json")) }
    let reply = try await BenchHTTPClient.shared.request(method, url, headers: headers, body: body.map { Array($0.utf8) })
    return (try? JSON.parse(reply.body)) ?? .null
}

/// The admin keys of the nodes a benchmark started, by admin URL, so every admin call
/// carries its node's `Authorization: Bearer KEY`.
final class AdminKeys: Sendable {
    static let shared = AdminKeys()
    private let keys = Locked<[String: String]>([:])

    /// Reads the key file a node.json names.
    func register(_ nodeFile: JSON) {
        guard let base = nodeFile["adminURL"]?.stringValue, let file = nodeFile["adminKeyFile"]?.stringValue,
            let key = try? String(contentsOfFile: file, encoding: .utf8)
        else { return }
        keys.withLock { $0[base] = key.trimmingCharacters(in: .whitespacesAndNewlines) }
    }

    func headers(for url: String) -> [(String, String)] {
        keys.withLock { keys in keys.first { url.hasPrefix($0.key + "/") || url == $0.key }.map { [("Authorization", "Bearer \($0.value)")] } ?? [] }
    }
}
