import ArgumentParser
import FerryCore
import Foundation

/// P15: a Couchbase Lite app (Couchbase Lite C's `cbl-driver`) pulls a node's documents over
/// `ws://…/{db}/_blipsync`, and pushes them on into an empty node, each against a native
/// Ferry pull of the same documents from the same node in the same run; and the serving
/// node's peak RSS after the app's pull at each database size (flat as the database grows).
struct CouchbaseLiteBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cbl",
        abstract: "P15: a Couchbase Lite app's pull and push vs a native pull (each target ≥ 0.5); the node's peak RSS by size (≤ 1.5×).")

    @Option(help: "Documents; several sizes (e.g. 10000,50000) also compare the node's peak RSS.") var docs = "10000"
    @Option(help: "Approximate document size in bytes.") var size = 1024
    @Option(help: "Runs per size (median reported); the push and the native pull run at the first size only.") var runs = 3
    @Option(help: "Couchbase Lite C's directory (bin/cbl-driver, lib/); default $FERRY_CBL_DIR, else ../shared/cbl.")
    var cbl = ProcessInfo.processInfo.environment["FERRY_CBL_DIR"] ?? "../shared/cbl"
    @Option(help: "Directory for scratch data.") var scratch = NSTemporaryDirectory()
    @Option(help: "Also record the figures in this JSON report.") var report: String?

    var sizes: [Int] { docs.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) } }

    func validate() throws {
        guard !sizes.isEmpty, sizes.allSatisfy({ $0 >= 1 }), sizes.count == docs.split(separator: ",").count else {
            throw ValidationError("--docs takes one or more positive counts, comma-separated (e.g. 10000,50000)")
        }
        guard runs >= 1, size >= 64 else { throw ValidationError("--runs must be at least 1 and --size at least 64") }
        guard FileManager.default.isExecutableFile(atPath: cbl + "/bin/cbl-driver") else {
            throw ValidationError("no Couchbase Lite driver at \(cbl)/bin/cbl-driver (set --cbl or FERRY_CBL_DIR)")
        }
    }

    func run() async throws {
        let ferry = NetBench.ferryBinary()
        // Absolute: the library's symbolic link below lives in another directory.
        let cbl = URL(fileURLWithPath: cbl).standardizedFileURL.path
        let driver = cbl + "/bin/cbl-driver"
        let root = (scratch as NSString).appendingPathComponent("ferry-cbl-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        // The library under its versioned name, where the loader looks (copies may flatten symlinks).
        let lib = root + "/lib"
        try FileManager.default.createDirectory(atPath: lib, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: lib + "/libcblite.so.3", withDestinationPath: cbl + "/lib/libcblite.so.3.2.1")
        setenv("LD_LIBRARY_PATH", lib, 1)
        let clientTemplate = "\(root)/client-id"
        let clientID = try NetBench.capture(ferry, ["--data", clientTemplate, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let helper = try CouchReplicationBench.parse(["--size", String(size), "--attachment-every", "0", "--scratch", root])
        say("cbl: a Couchbase Lite C 3.2.1 app pulls \(sizes.map(String.init).joined(separator: " and ")) documents of ~\(size) bytes from a node, and pushes as many into an empty node, against `ferry sync wss://…` pulling from the same node; \(runs) runs")

        var pulls: [Int: [Double]] = [:], pushes: [Double] = [], natives: [Double] = [], nodeRSS: [Int: [Double]] = [:]
        for (index, count) in sizes.enumerated() {
            let source = try await helper.makeSource(count: count, ferry: ferry, root: root, clientID: clientID)
            defer { kill(source.node.pid, SIGKILL); _ = NetBench.reap(source.node.pid) }
            let key = String(source.node.headers[0].1.split(separator: " ").last ?? "")
            let endpoint = source.node.couchURL.replacingOccurrences(of: "http://", with: "ws://") + source.node.db
            for run in 1...runs {
                let app = "\(root)/app-\(count)-\(run)"
                defer { try? FileManager.default.removeItem(atPath: app) }
                let pulled = try replicate(driver, [app, endpoint, "--pull", "--user", "admin", "--password", key], count: count, key: "pulled", root: root)
                pulls[count, default: []].append(pulled)
                nodeRSS[count, default: []].append(Double(NetBench.peakRSS(source.node.pid)) / 1024)
                var line = String(format: "  %d docs, run %d: app pull %.0f docs/s", count, run, pulled)
                if index == 0 {
                    let native = try helper.pullNative(source, count: count, run: run, ferry: ferry, root: root, template: clientTemplate)
                    natives.append(native.docsPerSecond)
                    let pushed = try await push(driver, app: app, count: count, run: run, ferry: ferry, root: root, clientID: clientID)
                    pushes.append(pushed)
                    line += String(format: ", app push %.0f docs/s, native pull %.0f docs/s", pushed, native.docsPerSecond)
                }
                say(line + String(format: ", node peak RSS %.1f MiB", nodeRSS[count]!.last!))
            }
            try? FileManager.default.removeItem(atPath: source.directory)
        }

        let first = sizes[0]
        let pull = Stats(pulls[first]!), push = Stats(pushes), native = Stats(natives)
        let pullRatios = zip(pulls[first]!, natives).map { $0 / $1 }, pushRatios = zip(pushes, natives).map { $0 / $1 }
        let pr = Stats(pullRatios), ur = Stats(pushRatios)
        say(String(format: "app pull       %8.0f docs/s (min %.0f, max %.0f)", pull.median, pull.min, pull.max))
        say(String(format: "app push       %8.0f docs/s (min %.0f, max %.0f)", push.median, push.min, push.max))
        say(String(format: "native pull    %8.0f docs/s (min %.0f, max %.0f)", native.median, native.min, native.max))
        say(String(format: "ratio pull/native %6.2f (min %.2f, max %.2f)  target >= 0.50  %@", pr.median, pr.min, pr.max, pr.median >= 0.5 ? "HOLDS" : "MISSES"))
        say(String(format: "ratio push/native %6.2f (min %.2f, max %.2f)  target >= 0.50  %@", ur.median, ur.min, ur.max, ur.median >= 0.5 ? "HOLDS" : "MISSES"))
        var figures = [
            Figure(
                id: "P15-pull", name: "A Couchbase Lite app's pull of \(first) documents from a node, relative to a native pull from the same node",
                value: pull.median, unit: "docs/s", baseline: native.median, ratio: pr.median, target: ">= 0.5", holds: pr.median >= 0.5,
                runs: zip(pulls[first]!, natives).map { ($0, $1, $0 / $1) }),
            Figure(
                id: "P15-push", name: "A Couchbase Lite app's push of \(first) documents into an empty node, relative to a native pull of as many",
                value: push.median, unit: "docs/s", baseline: native.median, ratio: ur.median, target: ">= 0.5", holds: ur.median >= 0.5,
                runs: zip(pushes, natives).map { ($0, $1, $0 / $1) }),
        ]
        if sizes.count > 1, let last = sizes.last {
            let small = Stats(nodeRSS[first]!).median, large = Stats(nodeRSS[last]!).median
            let ratio = large / small
            say(String(format: "ratio node peak RSS %d / %d   %6.2f  (%.1f vs %.1f MiB)  target <= 1.50  %@", last, first, ratio, large, small, ratio <= 1.5 ? "HOLDS" : "MISSES"))
            figures.append(
                Figure(
                    id: "P15-memory", name: "The serving node's peak RSS after an app pulled \(last) documents, relative to \(first)",
                    value: large, unit: "MiB", baseline: small, ratio: ratio, target: "<= 1.5", holds: ratio <= 1.5,
                    runs: zip(nodeRSS[last]!, nodeRSS[first]!).map { ($0, $1, $0 / $1) }))
        }
        if let report { try BenchReport.record(figures, in: report) }
    }

    /// Runs one `cbl-driver replicate`, checks its summary counted every document, and
    /// answers documents per second (the wall time, the driver's start included).
    func replicate(_ driver: String, _ args: [String], count: Int, key: String, root: String) throws -> Double {
        let out = "\(root)/cbl-\(UUID().uuidString).out"
        defer { try? FileManager.default.removeItem(atPath: out) }
        sync()
        let start = ContinuousClock.now
        let pid = try NetBench.launch(driver, ["replicate"] + args + ["--timeout", "600"], quiet: true, output: out)
        let result = NetBench.reap(pid)
        let elapsed = ContinuousClock.now - start
        let text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        let summary = text.split(separator: "\n").last.flatMap { try? JSON.parse(Array($0.utf8)) } ?? .null
        guard result.status == 0, summary[key]?.intValue == Int64(count) else {
            throw BenchError("cbl-driver replicate: status \(result.status), summary \(summary.canonicalString)")
        }
        return Double(count) / elapsed.seconds
    }

    /// The app that just pulled `count` documents of about `size` bytes pushes them into an empty node.
    func push(_ driver: String, app: String, count: Int, run: Int, ferry: String, root: String, clientID: String) async throws -> Double {
        let target = "\(root)/push-target-\(count)-\(run)"
        defer { try? FileManager.default.removeItem(atPath: target) }
        let node = try await CouchAPIBench.startNode(ferry, data: target, trust: clientID)
        defer { kill(node.pid, SIGKILL); _ = NetBench.reap(node.pid) }
        let key = String(node.headers[0].1.split(separator: " ").last ?? "")
        let endpoint = node.couchURL.replacingOccurrences(of: "http://", with: "ws://") + node.db
        return try replicate(driver, [app, endpoint, "--push", "--user", "admin", "--password", key], count: count, key: "pushed", root: root)
    }
}
