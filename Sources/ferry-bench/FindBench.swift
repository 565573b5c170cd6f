import ArgumentParser
import FerryCore
import FerryCouch
import FerryQuery
import FerryStore
import Foundation
import GRDBSQLite

/// Mango `_find` on a large store: indexed queries against the same query written by hand as
/// SQL on a SQLite expression index and against a full scan, write throughput with two
/// indexes against none, and index build time.
struct FindBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "find",
        abstract: "Mango _find: indexed 20-document queries vs hand-written SQL on an expression index (target >= 0.5) and vs a full scan; writes with two indexes vs none (target >= 0.7); index build time.")

    @Option(help: "Documents in the query store.") var docs = 1_000_000
    @Option(help: "Documents per run of the write-throughput comparison.") var writeDocs = 100_000
    @Option(help: "Runs of the write-throughput comparison (median reported).") var runs = 3
    @Option(help: "Queries of each kind for the latency figures.") var queries = 2000
    @Option(help: "Full-scan queries of each kind (each reads the whole store).") var scans = 3
    @Option(help: "Directory for scratch data.") var scratch = NSTemporaryDirectory()
    @Option(help: "Also record the figures in this JSON report (e.g. Benchmarks/results/latest.json).") var report: String?

    /// Documents with a value of `batch` shared by exactly 20 of them and a unique `created`.
    static func document(_ i: Int) -> (DocumentID, JSON) {
        let statuses = ["open", "closed", "waiting", "review", "done"]
        var fields: [String: JSON] = [
            "type": "visit", "batch": .int(Int64(i / 20)), "created": .int(1_700_000_000 + Int64(i)),
            "status": .string(statuses[i % statuses.count]), "ward": .int(Int64(i % 50)),
            "score": .double(Double(i % 997) / 7), "tags": ["a", .string("t\(i % 13)")],
        ]
        let base = JSON.object(fields).canonicalBytes.count
        var note = ""
        var k = UInt64(i) &* 2_654_435_761
        while note.utf8.count < 1024 - base - 12 {
            note += String(k % 1_000_003, radix: 36) + " "
            k = k &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        }
        fields["note"] = .string(String(note.prefix(max(0, 1024 - base - 12))))
        return (try! DocumentID(String(format: "v-%08d", i)), .object(fields))
    }

    static let batchIndex = MangoIndex(
        designDocument: "_design/bench", name: "by-batch", fields: [.init(path: try! FieldPath(parsing: "batch"))])
    static let createdIndex = MangoIndex(
        designDocument: "_design/bench", name: "by-created", fields: [.init(path: try! FieldPath(parsing: "created"))])

    func run() async throws {
        print("find: \(docs) documents of ~1 KiB; \(queries) queries per kind; write comparison \(writeDocs) documents × \(runs) runs")
        var figures: [Figure] = []

        // 1. Write throughput: two indexes against none, fresh stores, alternating order.
        var plain: [Double] = []
        var indexed: [Double] = []
        for run in 1...runs {
            for withIndexes in (run % 2 == 1 ? [false, true] : [true, false]) {
                let rate = try writeRate(withIndexes: withIndexes)
                if withIndexes { indexed.append(rate) } else { plain.append(rate) }
            }
        }
        let writeRatio = Stats(zip(indexed, plain).map { $0 / $1 })
        print(String(format: "writes, no index        %9.0f docs/s", Stats(plain).median))
        print(String(format: "writes, two indexes     %9.0f docs/s", Stats(indexed).median))
        print(String(format: "ratio indexed/plain     %9.2f (min %.2f, max %.2f)  target >= 0.70  %@",
                     writeRatio.median, writeRatio.min, writeRatio.max, writeRatio.median >= 0.7 ? "HOLDS" : "MISSES"))
        figures.append(Figure(
            id: "P13w", name: "Local saves with two Mango indexes relative to none",
            value: Stats(indexed).median, unit: "docs/s", baseline: Stats(plain).median, ratio: writeRatio.median,
            target: ">= 0.7", holds: writeRatio.median >= 0.7,
            runs: zip(indexed, plain).map { ($0, $1, $0 / $1) }))

        // 2. The query store.
        let dir = try makeScratchDirectory(in: scratch, prefix: "ferry-bench-find")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var options = StoreOptions()
        options.durability = .normal
        let store = try DocumentStore.open(directory: dir, options: options)
        let loadStart = ContinuousClock.now
        try load(store, range: 0..<docs)
        print(String(format: "loaded %d documents in %.1f s", docs, (ContinuousClock.now - loadStart).seconds))
        let couch = CouchDatabase(name: "bench", store: store, serverUUID: "bench")

        // 3. Full scans (no index yet): the same queries read every document.
        let eqScan = try latencies(count: scans) { i in try self.ferryEquality(couch, batch: self.batchValue(i)) }
        // Without an index CouchDB (and Ferry) refuse a sort, so the scanned range query has none.
        let rangeScan = try latencies(count: scans) { i in try self.ferryRange(couch, from: self.createdValue(i), sorted: false) }

        // 4. Index builds, one index at a time, with the longest single step (how long a writer can wait).
        var builds: [(String, Double, Double)] = []
        for index in [Self.batchIndex, Self.createdIndex] {
            let ddoc = try DocumentID("_design/\(index.name)", allowReserved: true)
            var definition = index
            definition.designDocument = ddoc.rawValue
            try store.put(ddoc, body: MangoDesignDocument.adding(definition, to: nil))
            let start = ContinuousClock.now
            var longest = 0.0
            while true {
                let stepStart = ContinuousClock.now
                let step = try store.buildMangoIndexes(maxDocuments: 1000)
                longest = max(longest, (ContinuousClock.now - stepStart).seconds)
                if step.work == 0 { break }
            }
            let total = (ContinuousClock.now - start).seconds
            builds.append((index.name, total, longest))
            print(String(format: "index %@ built over %d documents in %.1f s (longest step %.1f ms)", index.name, docs, total, longest * 1000))
        }
        guard try store.mangoIndexes().allSatisfy({ $0.state == .ready }) else {
            throw BenchError("an index did not become ready")
        }

        // 5. The hand-written baseline: expression indexes on the same table, raw prepared statements.
        let hand = try HandSQL(path: (dir as NSString).appendingPathComponent(DocumentStore.databaseFileName))
        defer { hand.close() }
        let handBuild = try hand.createIndexes()
        print(String(format: "hand expression indexes created in %.1f s", handBuild))

        // 6. Interleaved queries: the same values through `_find` and through hand-written SQL.
        var ferryEq: [Double] = [], handEq: [Double] = [], ferryRange: [Double] = [], handRange: [Double] = []
        for i in 0..<queries {
            let b = batchValue(i)
            let c = createdValue(i)
            ferryEq.append(try time { try self.ferryEquality(couch, batch: b) })
            handEq.append(try time { try hand.equality(batch: b) })
            ferryRange.append(try time { try self.ferryRange(couch, from: c) })
            handRange.append(try time { try hand.range(from: c) })
        }
        for (kind, ferry, baseline, scan) in [("equality", ferryEq, handEq, eqScan), ("range", ferryRange, handRange, rangeScan)] {
            let f = Percentiles(ferry), h = Percentiles(baseline), s = Percentiles(scan)
            let ratio = h.p50 / f.p50
            print(String(format: "%-8@ _find indexed  p50 %7.3f ms  p99 %7.3f ms", kind, f.p50 * 1000, f.p99 * 1000))
            print(String(format: "%-8@ hand SQL       p50 %7.3f ms  p99 %7.3f ms", kind, h.p50 * 1000, h.p99 * 1000))
            print(String(format: "%-8@ full scan      p50 %7.1f ms  (%.0fx the indexed p50)", kind, s.p50 * 1000, s.p50 / f.p50))
            print(String(format: "%-8@ rate ratio _find/hand SQL %.2f  target >= 0.50  %@;  p50 <= 1 ms  %@", kind, ratio,
                         ratio >= 0.5 ? "HOLDS" : "MISSES", f.p50 <= 0.001 ? "HOLDS" : "MISSES"))
            figures.append(Figure(
                id: kind == "equality" ? "P13e" : "P13r",
                name: "Indexed _find (\(kind), 20 documents, \(docs) stored): rate relative to hand-written SQL on an expression index",
                value: f.p50 * 1000, unit: "ms p50", baseline: h.p50 * 1000, ratio: ratio, target: ">= 0.5 and p50 <= 1 ms",
                holds: ratio >= 0.5 && f.p50 <= 0.001, runs: [(f.p99 * 1000, h.p99 * 1000, h.p99 / f.p99)]))
        }
        if let report {
            try BenchReport.record(figures, in: report)
        }
        _ = builds
    }

    /// A `batch` value whose 20 documents lie anywhere in the store (a full scan reads to the end).
    func batchValue(_ i: Int) -> Int64 { Int64((i &* 7919) % max(1, docs / 20)) }
    func createdValue(_ i: Int) -> Int64 { 1_700_000_000 + Int64((i &* 104_729) % max(1, docs - 20)) }

    func ferryEquality(_ couch: CouchDatabase, batch: Int64) throws -> Int {
        let query = try MangoQuery(parsing: ["selector": ["batch": .int(batch)], "limit": 20])
        let n = try couch.find(query, principal: .admin).encodedDocs.count
        guard n == 20 else { throw BenchError("equality query found \(n) documents, not 20") }
        return n
    }

    func ferryRange(_ couch: CouchDatabase, from: Int64, sorted: Bool = true) throws -> Int {
        var body: JSON = ["selector": ["created": ["$gte": .int(from), "$lt": .int(from + 20)]], "limit": 20]
        if sorted, case .object(var members) = body {
            members["sort"] = ["created"]
            body = .object(members)
        }
        let query = try MangoQuery(parsing: body)
        let n = try couch.find(query, principal: .admin).encodedDocs.count
        guard n == 20 else { throw BenchError("range query found \(n) documents, not 20") }
        return n
    }

    func writeRate(withIndexes: Bool) throws -> Double {
        let dir = try makeScratchDirectory(in: scratch, prefix: "ferry-bench-find-w")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try DocumentStore.open(directory: dir)
        if withIndexes {
            var body: JSON? = nil
            for index in [Self.batchIndex, Self.createdIndex] { body = MangoDesignDocument.adding(index, to: body) }
            try store.put(try DocumentID("_design/bench", allowReserved: true), body: body!)
            while try store.buildMangoIndexes().work > 0 {}
        }
        let start = ContinuousClock.now
        try load(store, range: 0..<writeDocs, perTransaction: 1000)
        return Double(writeDocs) / (ContinuousClock.now - start).seconds
    }

    func load(_ store: DocumentStore, range: Range<Int>, perTransaction: Int = 10_000) throws {
        var i = range.lowerBound
        while i < range.upperBound {
            let end = min(range.upperBound, i + perTransaction)
            let batch = (i..<end).map(Self.document)
            try store.write { txn in for (id, body) in batch { try txn.put(id, body: body) } }
            i = end
        }
    }

    func latencies(count: Int, _ body: (Int) throws -> Int) throws -> [Double] {
        try (0..<count).map { i in try time { try body(i) } }
    }

    func time(_ body: () throws -> Int) throws -> Double {
        let start = ContinuousClock.now
        _ = try body()
        return (ContinuousClock.now - start).seconds
    }
}

/// The same queries written by hand: expression indexes on `json_extract` over the documents
/// table, and prepared statements that return the 20 rows' IDs, revisions and bodies.
final class HandSQL {
    private var db: OpaquePointer?
    private var eq: OpaquePointer?
    private var range: OpaquePointer?
    private let batchExpr = "json_extract(CAST(body AS TEXT), '$.batch')"
    private let createdExpr = "json_extract(CAST(body AS TEXT), '$.created')"

    init(path: String) throws {
        guard sqlite3_open(path, &db) == SQLITE_OK else { throw BenchError("sqlite3_open failed") }
    }

    func createIndexes() throws -> Double {
        let start = ContinuousClock.now
        try exec("CREATE INDEX hand_batch ON documents (\(batchExpr)) WHERE deleted = 0")
        try exec("CREATE INDEX hand_created ON documents (\(createdExpr)) WHERE deleted = 0")
        let elapsed = (ContinuousClock.now - start).seconds
        eq = try prepare("SELECT id, rev, body FROM documents WHERE deleted = 0 AND \(batchExpr) = ?1 LIMIT 20")
        range = try prepare(
            "SELECT id, rev, body FROM documents WHERE deleted = 0 AND \(createdExpr) >= ?1 AND \(createdExpr) < ?2 ORDER BY \(createdExpr) LIMIT 20")
        return elapsed
    }

    func equality(batch: Int64) throws -> Int {
        sqlite3_bind_int64(eq, 1, batch)
        return try rows(eq)
    }

    func range(from: Int64) throws -> Int {
        sqlite3_bind_int64(range, 1, from)
        sqlite3_bind_int64(range, 2, from + 20)
        return try rows(range)
    }

    /// Steps through the rows, copying each column as a client would.
    private func rows(_ stmt: OpaquePointer?) throws -> Int {
        defer { sqlite3_reset(stmt) }
        var n = 0
        var bytes = 0
        while true {
            let rc = sqlite3_step(stmt)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else { throw BenchError(String(cString: sqlite3_errmsg(db))) }
            let id = String(cString: sqlite3_column_text(stmt, 0))
            let rev = String(cString: sqlite3_column_text(stmt, 1))
            let count = Int(sqlite3_column_bytes(stmt, 2))
            let body = [UInt8](UnsafeRawBufferPointer(start: sqlite3_column_blob(stmt, 2), count: count))
            bytes += id.utf8.count + rev.utf8.count + body.count
            n += 1
        }
        guard n == 20 else { throw BenchError("hand-written SQL found \(n) rows, not 20") }
        return bytes
    }

    private func exec(_ sql: String) throws {
        guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else { throw BenchError(String(cString: sqlite3_errmsg(db))) }
    }

    private func prepare(_ sql: String) throws -> OpaquePointer? {
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK else { throw BenchError(String(cString: sqlite3_errmsg(db))) }
        return stmt
    }

    func close() {
        sqlite3_finalize(eq)
        sqlite3_finalize(range)
        sqlite3_close(db)
    }
}
