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
        print("delta: one field of a ~\(size)-byte document changes; replication bytes (both directions) with deltas vs without")
        var results: [(value: Double, baseline: Double?, ratio: Double)] = []
        var sessions: [Double] = []
        var checkpointWrites: [Int] = []
        for run in 0..<runs {
            let (withDelta, checkpoint) = try await steadyStateBytes(deltas: true, field: run)
            let (full, _) = try await steadyStateBytes(deltas: false, field: run)
            checkpointWrites.append(checkpoint)
            results.append((Double(withDelta), Double(full), Double(withDelta) / Double(full)))
            // The same change as a one-shot sync of its own (hello, checkpoints and all).
            let sessionDelta = try await updateBytes(deltas: true, field: run)
            let sessionFull = try await updateBytes(deltas: false, field: run)
            sessions.append(Double(sessionDelta) / Double(sessionFull))
            print(String(format: "run %d: continuous sync: delta %d bytes, full %d bytes, ratio %.3f; one-shot sync of just this change: %d vs %d bytes, ratio %.3f",
                run + 1, withDelta, full, Double(withDelta) / Double(full), sessionDelta, sessionFull, sessions.last!))
        }
        let ratio = Stats(results.map(\.ratio))
        let holds = ratio.median <= 0.05
        print(String(format: "ratio delta/full, continuous sync   %9.3f (min %.3f, max %.3f)  target <= 0.05  %@", ratio.median, ratio.min, ratio.max, holds ? "HOLDS" : "MISSES"))
        print(String(format: "ratio delta/full, one-shot session  %9.3f (session set-up included; for reference)", Stats(sessions).median))
        print("the peer's copy of the checkpoint is written once per deferral (5 s by default), not per change: \(checkpointWrites.max() ?? 0) bytes, measured after each run's change")
        if let report {
            try BenchReport.record([
                Figure(
                    id: "P3", name: "Delta savings: bytes for a one-field change of an 8 KiB document in continuous sync, relative to the full document",
                    value: Stats(results.map(\.value)).median, unit: "bytes", baseline: Stats(results.compactMap(\.baseline)).median,
                    ratio: ratio.median, target: "<= 0.05", holds: holds, runs: results)
            ], in: report)
        }
    }

    /// A continuous pull that has already delivered the document; returns the bytes that
    /// crossed the connection (both directions) for one changed field, from the change
    /// until the replicator is idle again and its byte count stays put.
    /// Also returns the bytes of the deferred write of the peer's checkpoint copy that follows.
    func steadyStateBytes(deltas: Bool, field: Int) async throws -> (change: Int, checkpoint: Int) {
        let source = try DocumentStore.inMemory()
        let target = try DocumentStore.inMemory()
        var fields = bigDocument()
        let id = try DocumentID("big")
        let rev = try source.put(id, body: .object(fields))
        var config = ReplicatorConfiguration()
        config.direction = .pull
        config.continuous = true
        config.deltas = deltas
        // Shorter than the default 5 s only to keep the run short: the bytes are the same.
        config.remoteCheckpointDelay = .seconds(1)
        // The summary counts a connection's bytes when it closes; this one stays open, so
        // the endpoint itself counts.
        let counted = ByteCounter()
        let replicator = inMemoryReplicator(from: source, into: target, config) { CountingEndpoint($0, bytes: counted) }
        let running = Task { await replicator.run() }
        defer { replicator.stop() }
        func settled(at revision: RevisionID) async throws -> Int {
            let deadline = ContinuousClock.now + .seconds(30)
            var last = -1
            var stableSince = ContinuousClock.now
            while ContinuousClock.now < deadline {
                let bytes = counted.total.withLock { $0 }
                if bytes != last { last = bytes; stableSince = ContinuousClock.now }
                if try target.document(id)?.revision == revision, replicator.status.activity == .idle,
                    ContinuousClock.now - stableSince >= .milliseconds(200)
                {
                    return bytes
                }
                try await Task.sleep(for: .milliseconds(10))
            }
            throw BenchError("continuous replication did not settle")
        }
        let before = try await settled(at: rev)
        fields["field\(field)"] = .string("changed in run \(field)")
        let updated = try source.put(id, body: .object(fields), parent: rev)
        let after = try await settled(at: updated)
        // The deferred checkpoint write: the next change of the byte count, then quiet again.
        let deadline = ContinuousClock.now + .seconds(10)
        while counted.total.withLock({ $0 }) == after && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        let checkpoint = try await settled(at: updated) - after
        replicator.stop()
        await running.value
        return (after - before, checkpoint)
    }

    func bigDocument() -> [String: JSON] {
        var fields: [String: JSON] = [:]
        var i = 0
        while JSON.object(fields).canonicalBytes.count < size - 80 {
            fields["field\(i)"] = .string(String(repeating: Character(UnicodeScalar(97 + i % 26)!), count: 100))
            i += 1
        }
        return fields
    }

    /// Replicates the document once, changes one field, and returns the bytes of the
    /// second (update) replication.
    func updateBytes(deltas: Bool, field: Int) async throws -> Int {
        let source = try DocumentStore.inMemory()
        let target = try DocumentStore.inMemory()
        var fields = bigDocument()
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

/// A message endpoint that adds the size of every message sent and received to `bytes`.
final class CountingEndpoint: MessageEndpoint {
    let inner: any MessageEndpoint
    let bytes: ByteCounter
    let incoming: AsyncThrowingStream<[UInt8], any Error>
    var transport: EndpointTransport { inner.transport }

    init(_ inner: any MessageEndpoint, bytes: ByteCounter) {
        self.inner = inner
        self.bytes = bytes
        let (stream, continuation) = AsyncThrowingStream.makeStream(of: [UInt8].self, throwing: (any Error).self)
        incoming = stream
        // Unowned: forwards the inner endpoint's messages and ends with its stream.
        Task {
            do {
                for try await m in inner.incoming {
                    bytes.total.withLock { $0 += m.count }
                    continuation.yield(m)
                }
                continuation.finish()
            } catch {
                continuation.finish(throwing: error)
            }
        }
    }

    func send(_ message: [UInt8]) async throws(SyncError) {
        bytes.total.withLock { $0 += message.count }
        try await inner.send(message)
    }

    func close(error: SyncError?) async { await inner.close(error: error) }
}

/// A running byte total shared between tasks.
final class ByteCounter: Sendable {
    let total = Locked(0)
}
