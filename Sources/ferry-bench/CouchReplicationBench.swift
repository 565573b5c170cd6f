import ArgumentParser
import FerryCore
import Foundation

/// P12: a `ferry sync` process pulls a `ferry serve` node's whole database over the CouchDB
/// replication protocol (from the node's CouchDB API) and over Ferry's own protocol, from
/// the same node in the same run; the CouchDB pull's rate against the native one, and the
/// puller's peak RSS at each database size (P4's rule: flat as the database grows).
struct CouchReplicationBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "couch",
        abstract: "P12: pull over the CouchDB replication protocol vs the native protocol (target ≥ 0.5); puller peak RSS by size (≤ 1.5×).")

    @Option(help: "Documents in the source database; several sizes (e.g. 100000,1000000) also compare the puller's peak RSS.")
    var docs = "100000"
    @Option(help: "Approximate document size in bytes.") var size = 1024
    @Option(help: "One document in this many carries an attachment (0: none).") var attachmentEvery = 100
    @Option(help: "Attachment size in bytes.") var attachmentSize = 2048
    @Option(help: "Runs per size (median reported); the native pull runs at the first size only.") var runs = 3
    @Option(help: "Directory for scratch data.") var scratch = NSTemporaryDirectory()
    @Option(help: "Also record the figures in this JSON report.") var report: String?

    var sizes: [Int] { docs.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) } }

    func validate() throws {
        guard !sizes.isEmpty, sizes.allSatisfy({ $0 >= 1 }), sizes.count == docs.split(separator: ",").count else {
            throw ValidationError("--docs takes one or more positive counts, comma-separated (e.g. 100000,1000000)")
        }
        guard runs >= 1, size >= 64, attachmentEvery >= 0, attachmentSize >= 1 else {
            throw ValidationError("--runs must be at least 1, --size at least 64, --attachment-size at least 1")
        }
    }

    /// One pull: its rate and the puller's peak resident memory.
    struct Pull {
        let docsPerSecond: Double
        let peakRSSKiB: Int
    }

    func run() async throws {
        let ferry = NetBench.ferryBinary()
        let root = (scratch as NSString).appendingPathComponent("ferry-couchrep-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let clientTemplate = "\(root)/client-id"
        let clientID = try NetBench.capture(ferry, ["--data", clientTemplate, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let withAttachments = attachmentEvery > 0 ? "1 in \(attachmentEvery) with a \(attachmentSize)-byte attachment" : "no attachments"
        say("couch: pull \(sizes.map(String.init).joined(separator: " and ")) documents of ~\(size) bytes (\(withAttachments)) from a node's CouchDB API with `ferry sync http://…`, against `ferry sync wss://…` from the same node; \(runs) runs")

        var couch: [Int: [Pull]] = [:]
        var native: [Pull] = []
        for (index, count) in sizes.enumerated() {
            let source = try await makeSource(count: count, ferry: ferry, root: root, clientID: clientID)
            defer { kill(source.node.pid, SIGKILL); _ = NetBench.reap(source.node.pid) }
            for run in 1...runs {
                // Alternate the order so neither side always runs on a warmer machine.
                let nativeFirst = index == 0 && run % 2 == 0
                if nativeFirst { native.append(try pullNative(source, count: count, run: run, ferry: ferry, root: root, template: clientTemplate)) }
                let pulled = try pullCouch(source, count: count, run: run, ferry: ferry, root: root)
                couch[count, default: []].append(pulled)
                if index == 0 && !nativeFirst {
                    native.append(try pullNative(source, count: count, run: run, ferry: ferry, root: root, template: clientTemplate))
                }
                let nativeLine = index == 0 ? String(format: ", native %.0f docs/s (peak RSS %.1f MiB)", native.last!.docsPerSecond, Double(native.last!.peakRSSKiB) / 1024) : ""
                say(String(format: "  %d docs, run %d: CouchDB %.0f docs/s (peak RSS %.1f MiB)", count, run, pulled.docsPerSecond, Double(pulled.peakRSSKiB) / 1024) + nativeLine)
            }
            try? FileManager.default.removeItem(atPath: source.directory)
        }

        var figures: [Figure] = []
        let first = sizes[0]
        let rates = couch[first]!.map(\.docsPerSecond), baselines = native.map(\.docsPerSecond)
        let ratios = zip(rates, baselines).map { $0 / $1 }
        let c = Stats(rates), n = Stats(baselines), r = Stats(ratios)
        say(String(format: "CouchDB pull   %8.0f docs/s (min %.0f, max %.0f)", c.median, c.min, c.max))
        say(String(format: "native pull    %8.0f docs/s (min %.0f, max %.0f)", n.median, n.min, n.max))
        say(String(format: "ratio couch/native %6.2f (min %.2f, max %.2f)  target >= 0.50  %@", r.median, r.min, r.max, r.median >= 0.5 ? "HOLDS" : "MISSES"))
        figures.append(Figure(
            id: "P12", name: "Pull of \(first) documents over the CouchDB replication protocol from a node's CouchDB API, relative to a native pull from the same node",
            value: c.median, unit: "docs/s", baseline: n.median, ratio: r.median, target: ">= 0.5", holds: r.median >= 0.5,
            runs: zip(rates, baselines).map { ($0, $1, $0 / $1) }))
        for count in sizes {
            let rss = Stats(couch[count]!.map { Double($0.peakRSSKiB) / 1024 })
            let rate = Stats(couch[count]!.map(\.docsPerSecond))
            say(String(format: "CouchDB pull of %8d docs: %.0f docs/s, puller peak RSS %.1f MiB (min %.1f, max %.1f)", count, rate.median, rss.median, rss.min, rss.max))
        }
        if sizes.count > 1, let last = sizes.last {
            let small = couch[first]!.map { Double($0.peakRSSKiB) / 1024 }, large = couch[last]!.map { Double($0.peakRSSKiB) / 1024 }
            let ratio = Stats(large).median / Stats(small).median
            say(String(format: "ratio peak RSS %d / %d   %6.2f  target <= 1.50  %@", last, first, ratio, ratio <= 1.5 ? "HOLDS" : "MISSES"))
            figures.append(Figure(
                id: "P12-memory", name: "Peak RSS of the process pulling \(last) documents over the CouchDB protocol, relative to pulling \(first)",
                value: Stats(large).median, unit: "MiB", baseline: Stats(small).median, ratio: ratio, target: "<= 1.5", holds: ratio <= 1.5,
                runs: zip(large, small).map { ($0, $1, $0 / $1) }))
        }
        if let report { try BenchReport.record(figures, in: report) }
    }

    /// A serving source node and what pullers need to reach it.
    struct Source {
        let node: CouchAPIBench.StartedNode
        let directory: String
        /// `http://127.0.0.1:PORT/DB`.
        let couchDatabase: String
        let credentialsFile: String
    }

    /// Imports `count` documents into a new data directory and serves it; the documents
    /// that carry an attachment are written through the CouchDB API (inline, base64).
    func makeSource(count: Int, ferry: String, root: String, clientID: String) async throws -> Source {
        let generator = DocumentGenerator(size: size)
        let directory = "\(root)/source-\(count)"
        let ndjson = "\(root)/docs-\(count).ndjson"
        let hasAttachment: (Int) -> Bool = { attachmentEvery > 0 && $0 % attachmentEvery == 0 }
        try generator.writeNDJSON(count, skipping: hasAttachment, to: ndjson)
        let imported = try NetBench.spawn(ferry, ["--data", directory, "import", ndjson, "--batch-size", "10000", "--create"])
        guard imported.status == 0 else { throw BenchError("ferry import failed with status \(imported.status)") }
        try? FileManager.default.removeItem(atPath: ndjson)

        let node = try await CouchAPIBench.startNode(ferry, data: directory, trust: clientID)
        let database = node.couchURL + node.db
        var pending: [JSON] = []
        func flush() async throws {
            guard !pending.isEmpty else { return }
            let body = JSON.object(["docs": .array(pending)]).canonicalBytes
            let reply = try await BenchHTTPClient.shared.request(
                "POST", database + "/_bulk_docs", headers: node.headers + [("Content-Type", "application/json")], body: body)
            guard reply.status == 201, case .array(let results)? = try? JSON.parse(reply.body), results.allSatisfy({ $0["ok"] == .bool(true) })
            else { throw BenchError("_bulk_docs with attachments answered \(reply.status)") }
            pending.removeAll(keepingCapacity: true)
        }
        for i in 0..<count where hasAttachment(i) {
            let (id, body) = generator.document(i)
            var o = body.objectValue!
            o["_id"] = .string(id.rawValue)
            let bytes = (0..<attachmentSize).map { UInt8(truncatingIfNeeded: ($0 &* 31) ^ i) }
            o["_attachments"] = ["reading.bin": ["content_type": "application/octet-stream", "data": .string(Data(bytes).base64EncodedString())]]
            pending.append(.object(o))
            if pending.count == 100 { try await flush() }
        }
        try await flush()

        guard let key = node.headers.first?.1.split(separator: " ").last else { throw BenchError("no admin key for \(directory)") }
        let credentialsFile = "\(root)/couch-credentials-\(count)"
        _ = FileManager.default.createFile(atPath: credentialsFile, contents: Data("admin:\(key)\n".utf8), attributes: [.posixPermissions: 0o600])
        return Source(node: node, directory: directory, couchDatabase: database, credentialsFile: credentialsFile)
    }

    /// `ferry sync http://…/DB --pull` into an empty data directory.
    func pullCouch(_ source: Source, count: Int, run: Int, ferry: String, root: String) throws -> Pull {
        let receiver = "\(root)/couch-puller-\(count)-\(run)"
        defer { try? FileManager.default.removeItem(atPath: receiver) }
        try FileManager.default.createDirectory(atPath: receiver, withIntermediateDirectories: true)
        return try timedPull(
            ferry, ["--data", receiver, "sync", source.couchDatabase, "--pull", "--credentials-file", source.credentialsFile, "--json"],
            count: count, root: root, what: "CouchDB pull")
    }

    /// `ferry sync wss://… --pin ID --pull` into an empty data directory.
    func pullNative(_ source: Source, count: Int, run: Int, ferry: String, root: String, template: String) throws -> Pull {
        let receiver = try NetBench.makeReceiver("\(root)/native-puller-\(count)-\(run)", identityFrom: template)
        defer { try? FileManager.default.removeItem(atPath: receiver) }
        return try timedPull(
            ferry, ["--data", receiver, "sync", source.node.url, "--pin", source.node.id, "--pull", "--json"],
            count: count, root: root, what: "native pull")
    }

    /// Runs one `ferry sync`, checks that it stored every document, and times it.
    func timedPull(_ ferry: String, _ args: [String], count: Int, root: String, what: String) throws -> Pull {
        let out = "\(root)/summary-\(UUID().uuidString).json"
        defer { try? FileManager.default.removeItem(atPath: out) }
        // Start on a quiet disk: the previous pull's write-back would land in this one's time.
        sync()
        let start = ContinuousClock.now
        let pid = try NetBench.launch(ferry, args, quiet: true, output: out)
        let result = NetBench.reap(pid)
        let elapsed = ContinuousClock.now - start
        let summary = (try? JSON.parse(Array(FileManager.default.contents(atPath: out) ?? Data()))) ?? .null
        guard result.status == 0, summary["pulled"]?.intValue == Int64(count) else {
            throw BenchError("\(what): status \(result.status), summary \(summary.canonicalString)")
        }
        return Pull(docsPerSecond: Double(count) / elapsed.seconds, peakRSSKiB: result.maxRSSKiB)
    }
}
