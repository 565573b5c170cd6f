import ArgumentParser
import FerryCore
import FerryStore
import Foundation
import FerrySync
import GRDBSQLite
import Logging

/// Benchmarks that print their figures, each against a baseline measured in the same run.
@main
/// The benchmark command: each subcommand prints figures against same-run baselines.
struct FerryBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ferry-bench",
        abstract: "Ferry benchmarks: each figure is a ratio against a baseline measured in the same run.",
        subcommands: [StoreBench.self, SyncBench.self, NetBench.self, DeltaBench.self, LatencyBench.self, ScaleBench.self, SyncthingBench.self, LanBench.self, CouchAPIBench.self, CouchReplicationBench.self, FindBench.self, ConflictBench.self, BlobBench.self, AccessBench.self, CouchbaseLiteBench.self])
}

/// Saves documents through FerryStore and inserts the same documents with raw prepared SQLite statements.
struct StoreBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store", abstract: "FerryStore save throughput vs raw SQLite inserts (target ratio >= 0.5).")

    @OptionGroup var workload: Workload
    @Option(help: "Profile one side only: ferry or raw (prints its rate, no ratio).") var only: String?

    func run() throws {
        let docs = DocumentGenerator(size: workload.size).documents(workload.count)
        let bodies = docs.map { $0.1.canonicalBytes }
        let avg = bodies.reduce(0) { $0 + $1.count } / max(bodies.count, 1)
        print("store: \(workload.count) documents of ~\(avg) bytes, one transaction each run, \(workload.runs) runs, WAL, synchronous=FULL")
        if only == "encode" {
            let t0 = ContinuousClock.now
            var total = 0
            for (_, body) in docs { total &+= body.canonicalBytes.count }
            let t1 = ContinuousClock.now
            for b in bodies { total &+= RevisionID.compute(parent: nil, deleted: false, canonicalBody: b).generation }
            let t2 = ContinuousClock.now
            print("encode \((t1 - t0).seconds * 1e6 / Double(workload.count)) us/doc, hash \((t2 - t1).seconds * 1e6 / Double(workload.count)) us/doc (\(total))")
            return
        }
        if let only {
            for _ in 1...workload.runs {
                let rate = only == "raw" ? try rawInsert(docs.map(\.0.rawValue), bodies) : try ferrySave(docs)
                print(String(format: "%@ %.0f docs/s", only, rate))
            }
            return
        }
        var ferry: [Double] = []
        var raw: [Double] = []
        for run in 1...workload.runs {
            // Alternate the order so neither side always runs on a warmer machine.
            if run % 2 == 1 {
                raw.append(try rawInsert(docs.map(\.0.rawValue), bodies))
                ferry.append(try ferrySave(docs))
            } else {
                ferry.append(try ferrySave(docs))
                raw.append(try rawInsert(docs.map(\.0.rawValue), bodies))
            }
        }
        let f = Stats(ferry)
        let r = Stats(raw)
        let ratios = zip(ferry, raw).map { $0 / $1 }
        let ratio = Stats(ratios)
        print(String(format: "raw SQLite insert   %9.0f docs/s (min %.0f, max %.0f)", r.median, r.min, r.max))
        print(String(format: "FerryStore save     %9.0f docs/s (min %.0f, max %.0f)", f.median, f.min, f.max))
        print(String(format: "ratio ferry/raw     %9.2f (min %.2f, max %.2f)  target >= 0.50  %@",
                     ratio.median, ratio.min, ratio.max, ratio.median >= 0.5 ? "HOLDS" : "MISSES"))
        if let report = workload.report {
            try BenchReport.record([
                Figure(
                    id: "P6", name: "Local saves: FerryStore save throughput relative to raw prepared SQLite inserts",
                    value: f.median, unit: "docs/s", baseline: r.median, ratio: ratio.median, target: ">= 0.5",
                    holds: ratio.median >= 0.5, runs: zip(ferry, raw).map { ($0, $1, $0 / $1) })
            ], in: report)
        }
    }

    func scratchDir() throws -> String { try makeScratchDirectory(in: workload.scratch) }

    func ferrySave(_ docs: [(DocumentID, JSON)]) throws -> Double {
        let dir = try scratchDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try DocumentStore.open(directory: dir)
        let start = ContinuousClock.now
        try store.write { txn in
            for (id, body) in docs { try txn.put(id, body: body) }
        }
        let elapsed = ContinuousClock.now - start
        let stored = try store.documentCount
        precondition(stored == docs.count)
        return Double(docs.count) / elapsed.seconds
    }

    func rawInsert(_ ids: [String], _ bodies: [[UInt8]]) throws -> Double {
        try RawSQLite.insert(ids, bodies, scratch: scratchDir())
    }
}

/// Inserts documents with raw prepared SQLite statements: the baseline for store and sync.
enum RawSQLite {
    static func insert(_ ids: [String], _ bodies: [[UInt8]], scratch dir: String) throws -> Double {
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var db: OpaquePointer?
        guard sqlite3_open(dir + "/raw.sqlite", &db) == SQLITE_OK else { throw BenchError("sqlite3_open failed") }
        defer { sqlite3_close(db) }
        func exec(_ sql: String) throws {
            guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
                throw BenchError(String(cString: sqlite3_errmsg(db)))
            }
        }
        try exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL")
        try exec("CREATE TABLE docs (id TEXT PRIMARY KEY NOT NULL, body BLOB NOT NULL)")
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, "INSERT INTO docs (id, body) VALUES (?, ?)", -1, &stmt, nil) == SQLITE_OK else {
            throw BenchError("prepare failed")
        }
        defer { sqlite3_finalize(stmt) }
        let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
        let start = ContinuousClock.now
        try exec("BEGIN")
        for (id, body) in zip(ids, bodies) {
            sqlite3_bind_text(stmt, 1, id, -1, transient)
            body.withUnsafeBytes { _ = sqlite3_bind_blob(stmt, 2, $0.baseAddress, Int32($0.count), transient) }
            guard sqlite3_step(stmt) == SQLITE_DONE else { throw BenchError(String(cString: sqlite3_errmsg(db))) }
            sqlite3_reset(stmt)
        }
        try exec("COMMIT")
        let elapsed = ContinuousClock.now - start
        return Double(ids.count) / elapsed.seconds
    }
}

/// Replicates documents between two stores over the in-memory endpoint, against a raw insert.
struct SyncBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync", abstract: "Replication throughput between two stores vs raw SQLite inserts.")

    @OptionGroup var workload: Workload
    @Option(help: "Changes per batch.") var batch = 1000
    @Option(help: "Revisions per getRevs request.") var perRequest = 500
    @Option(help: "Target durability: full or normal.") var durability = "full"

    func run() throws {
        let docs = DocumentGenerator(size: workload.size).documents(workload.count)
        let bodies = docs.map { $0.1.canonicalBytes }
        print("sync: \(workload.count) documents of ~\(bodies.reduce(0) { $0 + $1.count } / max(1, workload.count)) bytes pulled between two file stores over the in-memory endpoint, \(workload.runs) runs")
        let dir = (workload.scratch as NSString).appendingPathComponent("ferry-bench-src-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let source = try DocumentStore.open(directory: dir)
        try source.write { txn in for (id, body) in docs { try txn.put(id, body: body) } }
        var ferry: [Double] = []
        var raw: [Double] = []
        for _ in 1...workload.runs {
            raw.append(try RawSQLite.insert(docs.map(\.0.rawValue), bodies, scratch: scratchDir()))
            ferry.append(try pull(from: source))
        }
        let f = Stats(ferry)
        let r = Stats(raw)
        let ratio = Stats(zip(ferry, raw).map { $0 / $1 })
        print(String(format: "raw SQLite insert   %9.0f docs/s (min %.0f, max %.0f)", r.median, r.min, r.max))
        print(String(format: "Ferry replication   %9.0f docs/s (min %.0f, max %.0f)", f.median, f.min, f.max))
        print(String(format: "ratio ferry/raw     %9.2f (min %.2f, max %.2f)", ratio.median, ratio.min, ratio.max))
    }

    func scratchDir() throws -> String { try makeScratchDirectory(in: workload.scratch) }

    func pull(from source: DocumentStore) throws -> Double {
        let dir = try scratchDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var options = StoreOptions()
        options.durability = durability == "normal" ? .normal : .full
        let target = try DocumentStore.open(directory: dir, options: options)
        var config = ReplicatorConfiguration()
        config.direction = .pull
        config.batchSize = batch
        config.maxRevisionsPerRequest = perRequest
        let replicator = inMemoryReplicator(from: source, into: target, config)
        let start = ContinuousClock.now
        let done = DispatchSemaphore(value: 0)
        // Unowned: the benchmark waits for it (`done`).
        Task {
            await replicator.run()
            done.signal()
        }
        done.wait()
        let elapsed = ContinuousClock.now - start
        if let error = replicator.status.error { throw BenchError("replication failed: \(error)") }
        let n = try target.documentCount
        guard n == (try source.documentCount) else { throw BenchError("replicated \(n) documents") }
        return Double(n) / elapsed.seconds
    }
}

/// A quiet replicator from `source` into `target` over an in-memory endpoint pair.
func inMemoryReplicator(
    from source: DocumentStore, into target: DocumentStore, _ config: ReplicatorConfiguration,
    wrap: @escaping @Sendable (any MessageEndpoint) -> any MessageEndpoint = { $0 }
) -> Replicator {
    let responder = ReplicationResponder(store: source)
    var logger = Logger(label: "bench")
    logger.logLevel = .error
    return Replicator(
        store: target,
        connector: {
            let (client, server) = InMemoryEndpoint.pair()
            // Unowned: the responder's session ends when the in-memory pair closes, with the replication.
            Task { await responder.serve(server) }
            return wrap(client)
        }, configuration: config, logger: logger)
}

/// Deterministic documents of roughly a given size.
struct DocumentGenerator {
    let size: Int

    func documents(_ count: Int) -> [(DocumentID, JSON)] { (0..<count).map(document) }

    /// Document number `i`: the same on every call, so large sets can be streamed.
    func document(_ i: Int) -> (DocumentID, JSON) {
        let words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
        var fields: [String: JSON] = [
            "type": "reading", "seq": .int(Int64(i)), "station": .string("st-\(i % 97)"),
            "value": .number(Double(i % 1000) / 8), "ok": .bool(i % 3 != 0),
            "tags": .array((0..<4).map { .string(words[(i + $0) % words.count]) }),
        ]
        let base = JSON.object(fields).canonicalBytes.count
        let pad = max(0, size - base - 12)
        var note = ""
        var k = i
        while note.utf8.count < pad {
            note += words[Int(UInt(bitPattern: k) % UInt(words.count))] + " "
            k = k &* 31 &+ 7
        }
        fields["note"] = .string(String(note.prefix(pad)))
        return (try! DocumentID(String(format: "doc-%08d", i)), .object(fields))
    }

    /// Writes documents 0..<count as NDJSON (each with "_id") for `ferry import`, streaming;
    /// those `skipping` names are left out, and `edit` may change each body first. Returns
    /// the bodies' canonical bytes (without "_id").
    @discardableResult
    func writeNDJSON(
        _ count: Int, skipping: (Int) -> Bool = { _ in false }, edit: (Int, inout [String: JSON]) -> Void = { _, _ in }, to path: String
    ) throws -> Int {
        FileManager.default.createFile(atPath: path, contents: nil)
        guard let out = FileHandle(forWritingAtPath: path) else { throw BenchError("cannot write \(path)") }
        defer { try? out.close() }
        var chunk: [UInt8] = []
        var total = 0
        for i in 0..<count where !skipping(i) {
            let (id, body) = document(i)
            var o = body.objectValue!
            edit(i, &o)
            total += JSON.object(o).canonicalBytes.count
            o["_id"] = .string(id.rawValue)
            chunk.append(contentsOf: JSON.object(o).canonicalBytes)
            chunk.append(0x0A)
            if chunk.count > 1 << 20 {
                try out.write(contentsOf: chunk)
                chunk.removeAll(keepingCapacity: true)
            }
        }
        try out.write(contentsOf: chunk)
        return total
    }
}

/// Median, minimum and maximum of repeated measurements.
struct Stats {
    let median: Double
    let min: Double
    let max: Double
    init(_ values: [Double]) {
        let s = values.sorted()
        median = s[s.count / 2]
        min = s.first!
        max = s.last!
    }
}

/// A benchmark that could not run, with the reason.
struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

extension Duration {
    var seconds: Double {
        let (s, a) = components
        return Double(s) + Double(a) / 1e18
    }
}

/// A fresh, uniquely named directory under `parent` for one measurement.
func makeScratchDirectory(in parent: String, prefix: String = "ferry-bench") throws -> String {
    let dir = (parent as NSString).appendingPathComponent("\(prefix)-\(UUID().uuidString)")
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    return dir
}

/// The options every benchmark shares: how many documents, how big, how many runs, where.
struct Workload: ParsableArguments {
    @Option(help: "Documents per run.") var count = 100_000
    @Option(help: "Approximate document size in bytes.") var size = 1024
    @Option(help: "Runs per measurement (median reported).") var runs = 3
    @Option(help: "Directory for scratch data.") var scratch = NSTemporaryDirectory()
    @Option(help: "Also record the figures in this JSON report (e.g. Benchmarks/results/latest.json).") var report: String?
}
