import CoreMetrics
import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import Testing

@testable import FerryNode

/// The running node's blob collector: every interval of its clock it deletes the blobs no
/// stored revision refers to, once their grace period is over, and keeps the rest.
@Suite struct BlobCollectorTests {
    @Test func theCollectorDeletesUnreferencedBlobsEachIntervalAndKeepsReferencedOnes() async throws {
        let dir = NSTemporaryDirectory() + "ferry-blob-collector-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try DocumentStore.open(directory: dir)
        let referenced = try store.blobs.put(Array("referenced".utf8))
        try store.put(try DocumentID("d"), body: ["f": referenced.json])
        let orphan = try store.blobs.put(Array(repeating: 7, count: 5000))
        let clock = ManualClock()
        let metrics = NodeMetrics()
        let collector = BlobCollector(
            store: store, clock: clock, interval: .seconds(60), grace: .zero,
            collectedBytes: Counter(label: "ferry_blobs_collected_bytes_total", factory: metrics.factory),
            logger: Logger(label: "test"))
        let running = Task { try await collector.run() }
        defer { running.cancel() }
        try await yieldUntil("the collector sleeps") { !clock.pendingDeadlines.isEmpty }
        #expect(store.blobs.length(orphan.digest) != nil)  // nothing runs before the first interval
        clock.advance(by: .seconds(60))
        try await yieldUntil("the orphan is collected") { store.blobs.length(orphan.digest) == nil }
        #expect(store.blobs.length(referenced.digest) != nil)
        try await yieldUntil("the bytes are counted") {
            metrics.registry.emitToString().contains("ferry_blobs_collected_bytes_total 5000")
        }
        // The next pass comes one interval later.
        let again = try store.blobs.put(Array("another orphan".utf8))
        try await yieldUntil("the collector sleeps again") { !clock.pendingDeadlines.isEmpty }
        #expect(store.blobs.length(again.digest) != nil)
        clock.advance(by: .seconds(60))
        try await yieldUntil("the second orphan is collected") { store.blobs.length(again.digest) == nil }
        running.cancel()
        try await running.value
    }

    @Test func collectionIsConfiguredAndCanBeTurnedOff() throws {
        var reader = ConfigReader(file: "ferry.json")
        let c = try reader.read(["blobCollection": ["intervalSeconds": 0, "graceSeconds": 5]])
        #expect(c.blobCollection.intervalSeconds == 0)
        #expect(c.blobCollection.graceSeconds == 5)
        #expect(NodeConfiguration().blobCollection.intervalSeconds == 3600)
        #expect(throws: ConfigError.self) { _ = try reader.read(["blobCollection": ["every": 5]]) }
    }
}
