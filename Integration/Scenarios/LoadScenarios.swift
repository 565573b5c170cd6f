import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Scenario 45: writes stay prompt while a large blob fans out. Five `ferry serve` nodes
/// (the debug build, which `make run` starts) in one group, a full mesh on loopback; node 1
/// takes a write every 50 ms through its admin API for `FERRY_IT_LOAD_SECONDS` (60) while
/// a blob of `FERRY_IT_LOAD_BLOB_MB` (200) MB written on it replicates to the four others.
/// Run once on an idle machine and once with Debian's `stress-ng` loading both cores. No
/// link may go silent; the writes' p99 stays under 100 ms (500 ms under stress-ng); within
/// 5 s of the last write every node should hold every write (asserted when idle) and the
/// blob: both must arrive, and when is printed (under stress-ng a debug build misses the
/// 5 s, a known issue). The figures are
/// printed (Benchmarks/README.md, "Load").
@Suite(.serialized, .timeLimit(.minutes(20)))
struct LoadScenarios {
    static let seconds = ProcessInfo.processInfo.environment["FERRY_IT_LOAD_SECONDS"].flatMap(Int.init) ?? 60
    static let blobMB = ProcessInfo.processInfo.environment["FERRY_IT_LOAD_BLOB_MB"].flatMap(Int.init) ?? 200
    static let nodeCount = 5
    static let gap = Duration.milliseconds(50)
    /// How long after the last write the blob may still be on its way.
    static let blobWait = 300

    @Test(arguments: [false, true])
    func writesStayPromptWhileABlobFansOutToFourPeers(underStress: Bool) async throws {
        let cluster = Cluster("load-\(underStress ? "stress" : "idle")")
        let nodes = (1...Self.nodeCount).map { cluster.add("n\($0)") }
        let ids = try await cluster.ids(nodes)
        let group = "load-\(UInt32.random(in: 0...UInt32.max))"
        for (i, node) in nodes.enumerated().reversed() {
            var args = ["--group", group]
            for (j, id) in ids.enumerated() where j != i { args += ["--trust", id] }
            for j in (i + 1)..<nodes.count { args += ["--peer", "\(nodes[j].url)#\(ids[j])"] }
            try await node.start(args)
        }
        let origin = nodes[0]
        try await waitUntil("every node has its four links", timeout: 60) {
            for node in nodes where (try? await node.admin.call("GET", "/peers").json["peers"]?.items.filter { $0["connected"] == true }.count) != Self.nodeCount - 1 {
                return false
            }
            return true
        }

        // The blob, stored on node 1 by the CLI beside the running node.
        let blobPath = cluster.root + "/video.bin"
        let made = try await Shell.bash("head -c \(Self.blobMB)M /dev/urandom > \(blobPath)")
        #expect(made.status == 0, "\(made.stderr)")
        let put = try await Ferry.run(["--data", origin.dataDirectory, "blob", "put", blobPath, "--content-type", "video/mp4"])
        try #require(put.status == 0, "ferry blob put: \(put.stderr)")
        let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let digest = try #require(try JSON.parse(ref)["digest"]?.stringValue)

        // stress-ng in a session of its own (setsid), so that its workers end with it: stopping
        // the parent alone once left two workers spinning for half an hour, and every suite
        // that ran after this one was starved past its time limits.
        var stress: ChildProcess?
        if underStress {
            stress = try ChildProcess.spawn(
                "/usr/bin/setsid", ["/usr/bin/stress-ng", "--cpu", "2", "--timeout", "\(Self.seconds + 60)s", "--quiet"],
                stdoutPath: cluster.root + "/stress.log", stderrPath: cluster.root + "/stress.log")
        }
        defer { if let stress { kill(-stress.pid, SIGKILL) } }

        // When each peer holds the blob (polled beside the writes).
        let arrivals = Locked<[String: Duration]>([:])
        let started = ContinuousClock.now
        let video = try await origin.admin.call("PUT", "/docs/video", body: #"{"type":"video","file":\#(ref)}"#)
        try #require(video.status == 201, "PUT video: \(video.text)")
        let watcher = Task {
            while !Task.isCancelled && arrivals.withLock({ $0.count }) < Self.nodeCount - 1 {
                for node in nodes.dropFirst() where arrivals.withLock({ $0[node.name] == nil }) {
                    if (try? await node.admin.call("GET", "/blobs/\(digest)/state").json["state"]?.stringValue) == "present",
                        (try? await node.admin.call("GET", "/docs/video").status) == 200
                    {
                        arrivals.withLock { $0[node.name] = ContinuousClock.now - started }
                    }
                }
                try? await Task.sleep(for: .milliseconds(250))
            }
        }
        defer { watcher.cancel() }

        // A write every 50 ms, each waited for before the next (as an app does).
        var latencies: [Duration] = []
        var failed: [String] = []
        let end = started + .seconds(Self.seconds)
        var k = 0
        while ContinuousClock.now < end {
            let due = started + Self.gap * k
            if due > ContinuousClock.now { try await Task.sleep(until: due) }
            let t0 = ContinuousClock.now
            let reply = try await origin.admin.call("PUT", "/docs/load-\(k)", body: #"{"type":"reading","n":\#(k),"pad":"\#(String(repeating: "x", count: 900))"}"#)
            latencies.append(ContinuousClock.now - t0)
            if reply.status != 201 { failed.append("load-\(k): \(reply.status) \(reply.text)") }
            k += 1
        }
        let wrote = ContinuousClock.now
        if let stress {
            kill(-stress.pid, SIGTERM)
            _ = await stress.stop(SIGTERM, grace: 10)
            kill(-stress.pid, SIGKILL)
            #expect(await Self.groupEnded(stress.pid), "stress-ng's workers outlived it")
        }
        #expect(failed.isEmpty, "writes refused: \(failed.prefix(5))")

        // Every node holds every write, and the blob: when, after the last write.
        let converged = await eventually(Double(Self.blobWait)) {
            for node in nodes where (try? await node.admin.call("GET", "/docs/load-\(k - 1)").status) != 200 { return false }
            return true
        }
        let settled = ContinuousClock.now - wrote
        let blobEverywhere = await eventually(Double(Self.blobWait)) { arrivals.withLock { $0.count } == Self.nodeCount - 1 }
        watcher.cancel()
        if converged && blobEverywhere { try await cluster.awaitConvergence(timeout: 60) }

        let sorted = latencies.sorted()
        func pct(_ p: Double) -> Duration { sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }
        let limit: Duration = underStress ? .milliseconds(500) : .milliseconds(100)
        var lags: [String] = []
        for node in nodes {
            let lag = try? await node.admin.call("GET", "/").json["schedulerLag"]?["worstMs"]?.intValue
            lags.append("\(node.name) \(lag.map { "\($0) ms" } ?? "?")")
        }
        let arrived = arrivals.withLock { $0 }.sorted { $0.key < $1.key }.map { "\($0.key) \(Self.ms($0.value))" }
        print(
            """
            load (\(underStress ? "stress-ng --cpu 2" : "idle"), debug build, \(Self.seconds) s, \(Self.blobMB) MB blob): \
            \(latencies.count) writes of \(Self.seconds * 1000 / 50) due; p50 \(Self.ms(pct(0.5))), p99 \(Self.ms(pct(0.99))), \
            max \(Self.ms(sorted.last ?? .zero)) (limit \(Self.ms(limit))); blob held by \(arrived.joined(separator: ", ")); \
            every write on every node \(converged ? "\(Self.ms(settled)) after the last" : "never"); \
            worst scheduler lag \(lags.joined(separator: ", "))
            """)
        #expect(pct(0.99) < limit, "writes p99 \(Self.ms(pct(0.99))) is over \(Self.ms(limit))")
        #expect(converged, "not every node held every write within \(Self.blobWait) s of the last one")
        #expect(blobEverywhere, "the blob did not reach every node within \(Self.blobWait) s of the last write")
        // The target is 5 s. Idle, the writes make it: a document with a blob goes beside the
        // pages that follow (BlobBacklog). Under stress-ng a debug build can miss it while the
        // blob crosses (Benchmarks/README.md, "Load").
        if underStress {
            withKnownIssue("under stress-ng a debug build's blob fan-out slows the writes' replication", isIntermittent: true) {
                #expect(settled <= .seconds(5), "every write reached every node \(Self.ms(settled)) after the last one")
            }
        } else {
            #expect(settled <= .seconds(5), "every write reached every node \(Self.ms(settled)) after the last one")
        }
        for node in nodes {
            #expect(!node.log.contains("peer went silent"), "\(node.name) declared a link silent: \(node.logTail(20))")
        }
        await finish(cluster)
    }

    /// Whether every process of the group `pgid` is gone (waited for up to 10 s).
    static func groupEnded(_ pgid: Int32) async -> Bool {
        for _ in 0..<100 {
            let running = (try? FileManager.default.contentsOfDirectory(atPath: "/proc"))?.contains { entry in
                guard let pid = Int32(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                    let close = stat.lastIndex(of: ")")
                else { return false }
                // After the name: state, ppid, pgrp. A zombie (Z) is over, only not yet reaped.
                let fields = stat[stat.index(after: close)...].split(separator: " ")
                return pid > 0 && fields.count > 2 && fields[0] != "Z" && Int32(fields[2]) == pgid
            } ?? false
            if !running { return true }
            try? await Task.sleep(for: .milliseconds(100))
        }
        return false
    }

    static func ms(_ d: Duration) -> String {
        String(format: "%.1f ms", Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15)
    }
}
