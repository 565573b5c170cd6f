import ArgumentParser
import FerryCore
import FerryStore
import Foundation

/// Cost of wide revision trees: inserting replicated conflict leaves into a fresh document
/// against one that already holds many, and `_revs_diff` of growing size through a
/// `ferry serve` process's CouchDB API; each figure printed as a ratio that a linear cost
/// keeps near 1 (inserts) or near 2 per doubling (`_revs_diff`).
struct ConflictBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "conflicts",
        abstract: "Leaf inserts into a wide document vs a fresh one, and _revs_diff of 8k/16k/32k revisions.")

    @Option(help: "Leaves inserted and timed.") var leaves = 1000
    @Option(help: "Leaves the wide document holds before the timed inserts.") var existing = 10_000
    @Option(help: "Leaves per transaction (a _bulk_docs request or a replicated batch).") var batch = 100
    @Option(help: "Sizes of the _revs_diff requests.") var revsDiff: [Int] = [8192, 16384, 32768]
    @Flag(help: "Skip the _revs_diff part (it starts a ferry serve process).") var storeOnly = false
    @Option(help: "Directory for scratch data.") var scratch = NSTemporaryDirectory()

    func run() async throws {
        let root = (scratch as NSString).appendingPathComponent("ferry-conflicts-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        print("conflicts: \(leaves) replicated leaves (new_edits=false) in transactions of \(batch), into a fresh document and into one with \(existing) leaves")
        let store = try DocumentStore.open(directory: "\(root)/store")
        let fresh = try timeLeaves(store, doc: "fresh", from: 0, count: leaves)
        _ = try timeLeaves(store, doc: "wide", from: 0, count: existing)
        let wide = try timeLeaves(store, doc: "wide", from: existing, count: leaves)
        print(String(format: "fresh document        %8.3f s  (%.0f leaves/s)", fresh, Double(leaves) / fresh))
        print(String(format: "document of %6d     %8.3f s  (%.0f leaves/s)", existing, wide, Double(leaves) / wide))
        print(String(format: "ratio wide/fresh      %8.2f  (a per-insert cost independent of width keeps it near 1)", wide / fresh))
        let single = try timeLeaves(store, doc: "wide", from: existing + leaves, count: 100, batch: 1)
        print(String(format: "one leaf per transaction into the wide document: %.2f ms each", single * 1000 / 100))

        let tree = try store.revisionTree(try DocumentID("wide"))!
        var storeTimes: [Double] = []
        for n in revsDiff {
            let asked = (0..<n).map { RevisionID.compute(parent: tree.revisions[0].id, deleted: false, canonicalBody: Array("{\"x\":\($0)}".utf8)) }
            let t0 = ContinuousClock.now
            let answer = try store.revsDiff([DocumentID("wide"): asked])
            storeTimes.append((ContinuousClock.now - t0).seconds)
            guard answer[try DocumentID("wide")]?.missing.count == n else { throw BenchError("store revsDiff lost revisions") }
        }
        printDoublings("store revsDiff (native protocol)", storeTimes)
        if storeOnly { return }

        let ferry = NetBench.ferryBinary()
        let clientID = try NetBench.capture(ferry, ["--data", "\(root)/client", "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let node = try await CouchAPIBench.startNode(ferry, data: "\(root)/node", trust: clientID)
        defer { kill(node.pid, SIGKILL); _ = NetBench.reap(node.pid) }
        let db = node.couchURL + node.db
        let headers = node.headers + [("Content-Type", "application/json")]
        let put = try await BenchHTTPClient.shared.request("PUT", db + "/target", headers: headers, body: Array("{\"a\":1}".utf8))
        guard put.status == 201 else { throw BenchError("PUT answered \(put.status)") }
        var httpTimes: [Double] = []
        for n in revsDiff {
            let revs = (0..<n).map { JSON.string("2-\(String(repeating: "0", count: 56))\(String(format: "%08x", $0))") }
            let body = JSON.object(["target": .array(revs)]).canonicalBytes
            let t0 = ContinuousClock.now
            let reply = try await BenchHTTPClient.shared.request("POST", db + "/_revs_diff", headers: headers, body: body)
            httpTimes.append((ContinuousClock.now - t0).seconds)
            guard reply.status == 200 else { throw BenchError("_revs_diff answered \(reply.status): \(String(decoding: reply.body, as: UTF8.self))") }
        }
        printDoublings("CouchDB _revs_diff over HTTP", httpTimes)
    }

    /// Inserts `count` generation-2 leaves under one root, `batch` per transaction; returns seconds.
    func timeLeaves(_ store: DocumentStore, doc: String, from start: Int, count: Int, batch: Int? = nil) throws -> Double {
        let id = try DocumentID(doc)
        let rootBody = Array("{\"root\":true}".utf8)
        let rootRev = RevisionID.compute(parent: nil, deleted: false, canonicalBody: rootBody)
        if start == 0 {
            _ = try store.insertRevisions([IncomingRevision(id: id, revision: rootRev, history: [], deleted: false, body: ["root": true])])
        }
        let revisions = (start..<start + count).map { i -> IncomingRevision in
            let body: JSON = ["leaf": .int(Int64(i))]
            let rev = RevisionID.compute(parent: rootRev, deleted: false, canonicalBody: body.canonicalBytes)
            return IncomingRevision(id: id, revision: rev, history: [rootRev], deleted: false, body: body)
        }
        let size = batch ?? self.batch
        let t0 = ContinuousClock.now
        for start in stride(from: 0, to: revisions.count, by: size) {
            let outcomes = try store.insertRevisions(Array(revisions[start..<min(start + size, revisions.count)]), durability: .normal)
            for case .rejected(let error) in outcomes { throw BenchError("leaf rejected: \(error)") }
        }
        return (ContinuousClock.now - t0).seconds
    }

    func printDoublings(_ label: String, _ times: [Double]) {
        for (n, t) in zip(revsDiff, times) { print(String(format: "%@, %6d revisions: %8.3f s", label, n, t)) }
        let ratios = zip(times.dropFirst(), times).map { $0 / max($1, 1e-9) }
        print("\(label): time ratio per doubling \(ratios.map { String(format: "%.2f", $0) }.joined(separator: ", ")) (linear: 2, quadratic: 4)")
    }
}
