import ArgumentParser
import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging

/// P3: bytes on the wire when one field of an 8 KiB document changes, with deltas vs with
/// the full document (the same replication with deltas off), both measured in the same run.
struct DeltaBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delta", abstract: "P3: replication bytes for a one-field change of an 8 KiB document, delta vs full (target <= 0.05).")

    @Option(help: "Document size in bytes.") var size = 8192
    @Option(help: "Runs (each changes a different field).") var runs = 3
    @Option(help: "Also record the figure in this JSON report.") var report: String?

    func run() async throws {
        print("delta: one field of a ~\(size)-byte document changes; replication bytes (both directions, whole session) with deltas vs without")
        var results: [(value: Double, baseline: Double?, ratio: Double)] = []
        for run in 0..<runs {
            let withDelta = try await updateBytes(deltas: true, field: run)
            let full = try await updateBytes(deltas: false, field: run)
            results.append((Double(withDelta), Double(full), Double(withDelta) / Double(full)))
            print(String(format: "run %d: delta %d bytes, full %d bytes, ratio %.3f", run + 1, withDelta, full, Double(withDelta) / Double(full)))
        }
        let ratio = Stats(results.map(\.ratio))
        let holds = ratio.median <= 0.05
        print(String(format: "ratio delta/full   %9.3f (min %.3f, max %.3f)  target <= 0.05  %@", ratio.median, ratio.min, ratio.max, holds ? "HOLDS" : "MISSES"))
        if let report {
            try BenchReport.record([
                Figure(
                    id: "P3", name: "Delta savings: bytes for a one-field change of an 8 KiB document, relative to the full document",
                    value: Stats(results.map(\.value)).median, unit: "bytes", baseline: Stats(results.compactMap(\.baseline)).median,
                    ratio: ratio.median, target: "<= 0.05", holds: holds, runs: results)
            ], in: report)
        }
    }

    /// Replicates the document once, changes one field, and returns the bytes of the
    /// second (update) replication.
    func updateBytes(deltas: Bool, field: Int) async throws -> Int {
        let source = try DocumentStore.inMemory()
        let target = try DocumentStore.inMemory()
        var fields: [String: JSON] = [:]
        var i = 0
        while JSON.object(fields).canonicalBytes.count < size - 80 {
            fields["field\(i)"] = .string(String(repeating: Character(UnicodeScalar(97 + i % 26)!), count: 100))
            i += 1
        }
        let id = try DocumentID("big")
        let rev = try source.put(id, body: .object(fields))
        _ = try await pull(source, into: target, deltas: deltas)
        fields["field\(field)"] = .string("changed in run \(field)")
        try source.put(id, body: .object(fields), parent: rev)
        let summary = try await pull(source, into: target, deltas: deltas)
        guard try target.document(id)?.body == .object(fields) else { throw BenchError("the update did not arrive") }
        return summary.bytesSent + summary.bytesReceived
    }

    func pull(_ source: DocumentStore, into target: DocumentStore, deltas: Bool) async throws -> ReplicationSummary {
        var config = ReplicatorConfiguration()
        config.direction = .pull
        config.deltas = deltas
        let replicator = inMemoryReplicator(from: source, into: target, config)
        await replicator.run()
        if let error = replicator.status.error { throw BenchError("replication failed: \(error)") }
        return replicator.summary
    }
}
