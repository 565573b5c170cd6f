import ArgumentParser
import FerryCore
import FerryStore
import Foundation

/// P4 and P5: how a pull's memory and an incremental sync's time grow with the database.
/// Both at a small and a large size (10k and 1M documents), between two `ferry` processes
/// over TLS WebSocket on loopback.
struct ScaleBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "scale",
        abstract: "P4 peak RSS pulling 1M docs vs 10k (target ≤1.5×); P5 syncing 100 changes into 1M docs vs 10k (target ≤1.5×).")

    @Option(help: "Documents in the small database.") var small = 10_000
    @Option(help: "Documents in the large database.") var large = 1_000_000
    @Option(help: "Approximate document size in bytes.") var size = 1024
    @Option(help: "Documents changed for the incremental sync (P5).") var changed = 100
    @Option(help: "Runs per measurement (median reported).") var runs = 3
    @Option(help: "Directory for scratch data (needs about 2.5 × large × size bytes).") var scratch = NSTemporaryDirectory()
    @Option(help: "Also record the figures in this JSON report.") var report: String?

    func validate() throws {
        guard small >= 1, large >= 1, runs >= 1, size >= 64 else {
            throw ValidationError("--small, --large and --runs must be at least 1, and --size at least 64")
        }
        guard changed >= 1, changed <= small, changed <= large else {
            throw ValidationError("--changed must be between 1 and the smaller database size")
        }
    }

    /// One database size's measurements.
    struct Sample {
        var pullRSSKiB: [Int] = []
        var pullSeconds: [Double] = []
        var incrementalSeconds: [Double] = []
    }

    func run() async throws {
        let ferry = NetBench.ferryBinary()
        let root = (scratch as NSString).appendingPathComponent("ferry-scale-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        print("scale: \(small) and \(large) documents of ~\(size) bytes, \(changed) changed for the incremental sync, \(runs) runs")
        let clientTemplate = "\(root)/client-id"
        let clientID = try NetBench.capture(ferry, ["--data", clientTemplate, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)

        var samples: [Int: Sample] = [:]
        for count in [small, large] {
            samples[count] = try await measure(count: count, ferry: ferry, root: root, clientTemplate: clientTemplate, clientID: clientID)
        }
        let s = samples[small]!, l = samples[large]!
        let rssSmall = Stats(s.pullRSSKiB.map(Double.init)), rssLarge = Stats(l.pullRSSKiB.map(Double.init))
        let incSmall = Stats(s.incrementalSeconds), incLarge = Stats(l.incrementalSeconds)
        let pullSmall = Stats(s.pullSeconds), pullLarge = Stats(l.pullSeconds)
        let rssRatio = rssLarge.median / rssSmall.median
        let incRatio = incLarge.median / incSmall.median
        print(String(format: "pull %8d docs: %7.1f s (%.0f docs/s), receiver peak RSS %6.1f MiB (min %.1f, max %.1f)",
            small, pullSmall.median, Double(small) / pullSmall.median, rssSmall.median / 1024, rssSmall.min / 1024, rssSmall.max / 1024))
        print(String(format: "pull %8d docs: %7.1f s (%.0f docs/s), receiver peak RSS %6.1f MiB (min %.1f, max %.1f)",
            large, pullLarge.median, Double(large) / pullLarge.median, rssLarge.median / 1024, rssLarge.min / 1024, rssLarge.max / 1024))
        print(String(format: "P4 ratio peak RSS %d / %d   %6.2f  target <= 1.50  %@", large, small, rssRatio, rssRatio <= 1.5 ? "HOLDS" : "MISSES"))
        print(String(format: "sync %d changes into %8d docs: %6.1f ms (min %.1f, max %.1f)",
            changed, small, incSmall.median * 1000, incSmall.min * 1000, incSmall.max * 1000))
        print(String(format: "sync %d changes into %8d docs: %6.1f ms (min %.1f, max %.1f)",
            changed, large, incLarge.median * 1000, incLarge.min * 1000, incLarge.max * 1000))
        print(String(format: "P5 ratio incremental %d / %d   %6.2f  target <= 1.50  %@", large, small, incRatio, incRatio <= 1.5 ? "HOLDS" : "MISSES"))
        if let report {
            try BenchReport.record([
                Figure(
                    id: "P4", name: "Peak RSS of the receiving process pulling \(large) documents, relative to pulling \(small)",
                    value: rssLarge.median / 1024, unit: "MiB", baseline: rssSmall.median / 1024, ratio: rssRatio, target: "<= 1.5",
                    holds: rssRatio <= 1.5,
                    runs: zip(l.pullRSSKiB, s.pullRSSKiB).map { (Double($0) / 1024, Double($1) / 1024, Double($0) / Double($1)) }),
                Figure(
                    id: "P5", name: "Time to sync \(changed) changed documents into \(large) documents, relative to \(small)",
                    value: incLarge.median * 1000, unit: "ms", baseline: incSmall.median * 1000, ratio: incRatio, target: "<= 1.5",
                    holds: incRatio <= 1.5,
                    runs: zip(l.incrementalSeconds, s.incrementalSeconds).map { ($0 * 1000, $1 * 1000, $0 / $1) }),
            ], in: report)
        }
    }

    /// Fills a source node with `count` documents; pulls them `runs` times into fresh
    /// receivers (peak RSS, time); then `runs` times changes `changed` of them and times the
    /// one-shot sync that brings them into the last receiver.
    func measure(count: Int, ferry: String, root: String, clientTemplate: String, clientID: String) async throws -> Sample {
        let generator = DocumentGenerator(size: size)
        let source = "\(root)/source-\(count)"
        let ndjson = "\(root)/docs-\(count).ndjson"
        try generator.writeNDJSON(count, to: ndjson)
        let imported = try NetBench.spawn(ferry, ["--data", source, "import", ndjson, "--batch-size", "10000", "--create"])
        guard imported.status == 0 else { throw BenchError("ferry import failed with status \(imported.status)") }
        try? FileManager.default.removeItem(atPath: ndjson)
        let sourceID = try NetBench.capture(ferry, ["--data", source, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)

        var sample = Sample()
        var receiver = ""
        for run in 1...runs {
            let server = try NetBench.startServe(ferry, data: source, trust: clientID)
            defer { kill(server.pid, SIGKILL); _ = NetBench.reap(server.pid) }
            if !receiver.isEmpty { try? FileManager.default.removeItem(atPath: receiver) }
            receiver = try NetBench.makeReceiver("\(root)/receiver-\(count)-\(run)", identityFrom: clientTemplate)
            let start = ContinuousClock.now
            let pulled = try NetBench.spawn(ferry, ["--data", receiver, "sync", server.url, "--pin", sourceID, "--pull", "--json"])
            let elapsed = ContinuousClock.now - start
            guard pulled.status == 0 else { throw BenchError("ferry sync failed with status \(pulled.status)") }
            sample.pullSeconds.append(elapsed.seconds)
            sample.pullRSSKiB.append(pulled.maxRSSKiB)
            print("  \(count) docs, run \(run): pulled in \(String(format: "%.1f", elapsed.seconds)) s, peak RSS \(pulled.maxRSSKiB / 1024) MiB")
        }

        for run in 1...runs {
            // Change documents spread over the whole ID range (the node is stopped: one writer).
            do {
                let store = try DocumentStore.open(directory: source)
                let stride = max(1, count / changed)
                var edits: [(DocumentID, JSON, RevisionID?)] = []
                for k in 0..<changed {
                    let (id, body) = generator.document((k * stride) % count)
                    var o = body.objectValue!
                    o["edit"] = .int(Int64(run))
                    edits.append((id, .object(o), try store.document(id)?.revision))
                }
                try store.write { txn in
                    for (id, body, parent) in edits { _ = try txn.put(id, body: body, parent: parent) }
                }
            }
            let server = try NetBench.startServe(ferry, data: source, trust: clientID)
            defer { kill(server.pid, SIGKILL); _ = NetBench.reap(server.pid) }
            let out = "\(root)/sync-\(count)-\(run).json"
            // Time the sync on a quiet disk: the large case follows a gigabyte of pulls
            // whose write-back would otherwise land in its measurement only.
            sync()
            let start = ContinuousClock.now
            let pid = try NetBench.launch(ferry, ["--data", receiver, "sync", server.url, "--pin", sourceID, "--pull", "--json"], quiet: true, output: out)
            let result = NetBench.reap(pid)
            let elapsed = ContinuousClock.now - start
            let summary = try JSON.parse(Array(FileManager.default.contents(atPath: out) ?? Data()))
            guard result.status == 0, summary["pulled"]?.intValue == Int64(changed) else {
                throw BenchError("incremental sync: status \(result.status), summary \(summary)")
            }
            sample.incrementalSeconds.append(elapsed.seconds)
            print("  \(count) docs, run \(run): \(changed) changes synced in \(String(format: "%.1f", elapsed.seconds * 1000)) ms")
        }
        try? FileManager.default.removeItem(atPath: receiver)
        try? FileManager.default.removeItem(atPath: source)
        return sample
    }
}
