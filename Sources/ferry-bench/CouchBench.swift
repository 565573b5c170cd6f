import ArgumentParser
import FerryCore
import Foundation

/// The CouchDB API of a `ferry serve` process against Ferry's own replication protocol into
/// and out of the same kind of process, in the same run: `_bulk_docs` writes against a
/// native push, `_changes?include_docs=true` and `_bulk_get` reads against a native pull.
struct CouchAPIBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "couch-api",
        abstract: "CouchDB API write and read rates against the native protocol's (target: each ≥ 0.5).")

    @OptionGroup var workload: Workload
    @Option(help: "Documents per _bulk_docs, _changes page and _bulk_get request.") var batch = 1000

    /// One run's rates in documents a second.
    struct Rates {
        var bulkDocs = 0.0, nativePush = 0.0, changes = 0.0, bulkGet = 0.0, nativePull = 0.0
    }

    func run() async throws {
        let ferry = NetBench.ferryBinary()
        let generator = DocumentGenerator(size: workload.size)
        let root = (workload.scratch as NSString).appendingPathComponent("ferry-couch-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        // Request bodies are built before timing: the figures time the node, not this client's encoder.
        var batches: [[UInt8]] = []
        var idBatches: [[UInt8]] = []
        var bytes = 0
        for start in stride(from: 0, to: workload.count, by: batch) {
            let docs = (start..<min(start + batch, workload.count)).map { i -> JSON in
                let (id, body) = generator.document(i)
                var o = body.objectValue!
                o["_id"] = .string(id.rawValue)
                return .object(o)
            }
            let body = JSON.object(["docs": .array(docs)]).canonicalBytes
            bytes += body.count
            batches.append(body)
            idBatches.append(JSON.object(["docs": .array(docs.map { .object(["id": $0["_id"]!]) })]).canonicalBytes)
        }
        say("couch-api: \(workload.count) documents of ~\(bytes / max(1, workload.count)) bytes, batches of \(batch), \(workload.runs) runs, loopback")
        try generator.writeNDJSON(workload.count, to: "\(root)/docs.ndjson")
        let clientTemplate = "\(root)/client-id"
        let clientID = try NetBench.capture(ferry, ["--data", clientTemplate, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)

        var runs: [Rates] = []
        for run in 1...workload.runs {
            var rates = Rates()
            // Writes through the CouchDB API into an empty node.
            let couchData = "\(root)/couch-\(run)"
            let couchNode = try await Self.startNode(ferry, data: couchData, trust: clientID)
            defer { kill(couchNode.pid, SIGKILL); _ = NetBench.reap(couchNode.pid) }
            let db = couchNode.couchURL + couchNode.db
            var t0 = ContinuousClock.now
            for body in batches {
                let reply = try await BenchHTTPClient.shared.request(
                    "POST", db + "/_bulk_docs", headers: couchNode.headers + [("Content-Type", "application/json")], body: body)
                guard reply.status == 201, case .array(let results)? = try? JSON.parse(reply.body), results.allSatisfy({ $0["ok"] == .bool(true) })
                else { throw BenchError("_bulk_docs answered \(reply.status)") }
            }
            rates.bulkDocs = Double(workload.count) / (ContinuousClock.now - t0).seconds

            // The same documents pushed over Ferry's protocol into another empty node.
            let nativeData = "\(root)/native-\(run)"
            let nativeNode = try await Self.startNode(ferry, data: nativeData, trust: clientID)
            defer { kill(nativeNode.pid, SIGKILL); _ = NetBench.reap(nativeNode.pid) }
            let pusher = try NetBench.makeReceiver("\(root)/pusher-\(run)", identityFrom: clientTemplate)
            _ = try NetBench.spawn(ferry, ["--data", pusher, "import", "\(root)/docs.ndjson", "--batch-size", "10000", "--create"])
            t0 = ContinuousClock.now
            let pushed = try NetBench.spawn(ferry, ["--data", pusher, "sync", nativeNode.url, "--pin", nativeNode.id, "--push", "--json"])
            guard pushed.status == 0 else { throw BenchError("ferry sync --push failed with status \(pushed.status)") }
            rates.nativePush = Double(workload.count) / (ContinuousClock.now - t0).seconds

            // Reads out of the CouchDB node: the changes feed with bodies, page by page.
            t0 = ContinuousClock.now
            var since = "0"
            var seen = 0
            while true {
                let reply = try await BenchHTTPClient.shared.request(
                    "GET", db + "/_changes?include_docs=true&limit=\(batch)&since=\(since)", headers: couchNode.headers)
                let page = try JSON.parse(reply.body)
                guard reply.status == 200, let results = page["results"].flatMap(Self.items), let last = page["last_seq"] else {
                    throw BenchError("_changes answered \(reply.status)")
                }
                seen += results.filter { $0["doc"]?.objectValue != nil }.count
                if results.isEmpty { break }
                since = last.stringValue ?? last.canonicalString
            }
            guard seen == workload.count else { throw BenchError("_changes returned \(seen) documents, not \(workload.count)") }
            rates.changes = Double(workload.count) / (ContinuousClock.now - t0).seconds

            // …and by ID with _bulk_get.
            t0 = ContinuousClock.now
            for body in idBatches {
                let reply = try await BenchHTTPClient.shared.request(
                    "POST", db + "/_bulk_get?revs=true", headers: couchNode.headers + [("Content-Type", "application/json")], body: body)
                guard reply.status == 200, let results = try JSON.parse(reply.body)["results"].flatMap(Self.items),
                    results.allSatisfy({ $0["docs"].flatMap(Self.items)?.first?["ok"]?.objectValue != nil })
                else { throw BenchError("_bulk_get answered \(reply.status)") }
            }
            rates.bulkGet = Double(workload.count) / (ContinuousClock.now - t0).seconds

            // A native pull of the whole database out of the same node.
            let puller = try NetBench.makeReceiver("\(root)/puller-\(run)", identityFrom: clientTemplate)
            t0 = ContinuousClock.now
            let pulled = try NetBench.spawn(ferry, ["--data", puller, "sync", couchNode.url, "--pin", couchNode.id, "--pull", "--json"])
            guard pulled.status == 0 else { throw BenchError("ferry sync --pull failed with status \(pulled.status)") }
            rates.nativePull = Double(workload.count) / (ContinuousClock.now - t0).seconds
            say(String(format: "  run %d: _bulk_docs %.0f/s, native push %.0f/s; _changes %.0f/s, _bulk_get %.0f/s, native pull %.0f/s",
                       run, rates.bulkDocs, rates.nativePush, rates.changes, rates.bulkGet, rates.nativePull))
            runs.append(rates)
            for dir in [pusher, puller] { try? FileManager.default.removeItem(atPath: dir) }
        }

        let rows: [(id: String, name: String, value: KeyPath<Rates, Double>, baseline: KeyPath<Rates, Double>, label: String)] = [
            ("P11a", "CouchDB API writes: _bulk_docs rate relative to a native push into the same kind of node", \.bulkDocs, \.nativePush, "_bulk_docs / native push"),
            ("P11b", "CouchDB API reads: _changes?include_docs=true rate relative to a native pull", \.changes, \.nativePull, "_changes / native pull"),
            ("P11c", "CouchDB API reads: _bulk_get rate relative to a native pull", \.bulkGet, \.nativePull, "_bulk_get / native pull"),
        ]
        var figures: [Figure] = []
        for row in rows {
            let values = runs.map { $0[keyPath: row.value] }
            let baselines = runs.map { $0[keyPath: row.baseline] }
            let ratios = zip(values, baselines).map { $0 / $1 }
            let v = Stats(values), b = Stats(baselines), r = Stats(ratios)
            say(row.label.padding(toLength: 26, withPad: " ", startingAt: 0) + String(format: " %8.0f vs %8.0f docs/s  ratio %.2f (min %.2f, max %.2f)  target >= 0.50  %@",
                       v.median, b.median, r.median, r.min, r.max, r.median >= 0.5 ? "HOLDS" : "MISSES"))
            figures.append(Figure(
                id: row.id, name: row.name, value: v.median, unit: "docs/s", baseline: b.median, ratio: r.median, target: ">= 0.5",
                holds: r.median >= 0.5, runs: zip(values, baselines).map { ($0, $1, $0 / $1) }))
        }
        if let report = workload.report { try BenchReport.record(figures, in: report) }
    }

    static func items(_ value: JSON) -> [JSON]? {
        if case .array(let items) = value { return items }
        return nil
    }

    /// A started node: its process, sync URL, node ID, CouchDB API base and credentials.
    struct StartedNode {
        let pid: pid_t
        let url: String
        let id: String
        let couchURL: String
        let db: String
        let headers: [(String, String)]
    }

    /// Starts `ferry serve` on ephemeral ports, trusting `trust`, and waits for node.json.
    static func startNode(_ ferry: String, data: String, trust: String) async throws -> StartedNode {
        try? FileManager.default.removeItem(atPath: "\(data)/node.json")
        let pid = try NetBench.launch(
            ferry,
            ["--data", data, "serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--no-discovery",
             "--interface", "127.0.0.1", "--trust", trust],
            quiet: true)
        let info = try await NetBench.waitForNodeFile(data, pid: pid)
        guard let url = info["url"]?.stringValue, let id = info["id"]?.stringValue, let couch = info["couchURL"]?.stringValue,
            let keyFile = info["adminKeyFile"]?.stringValue,
            let key = try? String(contentsOfFile: keyFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        else { throw BenchError("node.json in \(data) lacks url, id, couchURL or adminKeyFile") }
        return StartedNode(
            pid: pid, url: url, id: id, couchURL: couch.hasSuffix("/") ? couch : couch + "/", db: info["group"]?.stringValue ?? "ferry",
            headers: [("Authorization", "Bearer \(key)")])
    }
}
