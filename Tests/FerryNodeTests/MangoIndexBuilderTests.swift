import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import ServiceLifecycle
import Testing

@testable import FerryNode

/// The index builder service fills indexes whenever the store has such work: woken by this
/// process's commits, or by its clock for other processes' commits; it stops gracefully.
@Suite struct MangoIndexBuilderTests {
    /// A design document defining one JSON index on `field`, in CouchDB's shape.
    static func designDocument(index name: String, field: String) -> JSON {
        [
            "language": "query",
            "views": .object([
                name: [
                    "map": ["fields": .object([field: "asc"]), "partial_filter_selector": [:]],
                    "reduce": "_count",
                    "options": ["def": ["fields": .array([.string(field)])]],
                ]
            ]),
        ]
    }

    static let ddoc = try! DocumentID("_design/q", allowReserved: true)

    static func isReady(_ store: DocumentStore) -> Bool {
        guard let indexes = try? store.mangoIndexes(), !indexes.isEmpty else { return false }
        return indexes.allSatisfy { $0.state == .ready }
    }

    @Test func theBuilderFillsAnIndexOverStoredDocumentsAndLogsItsStartAndEnd() async throws {
        let store = try DocumentStore.inMemory()
        for i in 0..<45 { try store.put(try DocumentID("d\(i)"), body: ["n": .int(Int64(i))]) }
        try store.put(Self.ddoc, body: Self.designDocument(index: "by-n", field: "n"))
        let clock = ManualClock()
        let log = CapturedLog()
        let builder = MangoIndexBuilder(store: store, clock: clock, batchSize: 10, logger: log.logger)
        let running = Task { try await builder.run() }
        defer { running.cancel() }
        try await yieldUntil("the index is ready") { Self.isReady(store) }
        let index = try #require(try store.mangoIndexes().first)
        let found = try store.scan(.index(id: index.id), range: .all, descending: false, after: nil, limit: 100)
        #expect(found.map(\.id.rawValue) == (0..<45).map { "d\($0)" })
        try await yieldUntil("the end is logged") { log.all.contains { $0.message == "index ready" } }
        let start = try #require(log.all.first { $0.message == "building index" })
        #expect(start.metadata["ddoc"] == "_design/q")
        #expect(start.metadata["name"] == "by-n")
        #expect(start.metadata["total"] == "46")
        running.cancel()
        try await running.value
    }

    @Test func aCommitWakesTheIdleBuilder() async throws {
        let store = try DocumentStore.inMemory()
        let clock = ManualClock()
        let builder = MangoIndexBuilder(store: store, clock: clock, pollInterval: .seconds(5), logger: Logger(label: "test"))
        let running = Task { try await builder.run() }
        defer { running.cancel() }
        try await yieldUntil("the builder waits") { store.commitWaiters > 0 && clock.pendingDeadlines == [.seconds(5)] }
        try store.put(try DocumentID("a"), body: ["n": 1])
        try store.put(Self.ddoc, body: Self.designDocument(index: "by-n", field: "n"))
        // No clock tick: the commit alone wakes it.
        try await yieldUntil("the index is ready") { Self.isReady(store) }
        #expect(clock.now.offset == .zero)
        running.cancel()
        try await running.value
    }

    @Test func aTickFindsAnIndexDefinedByAnotherProcess() async throws {
        let dir = NSTemporaryDirectory() + "ferry-index-builder-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try DocumentStore.open(directory: dir)
        // Another opening of the same database stands for another process: its commits do not
        // reach this store's waiters.
        let other = try DocumentStore.open(directory: dir)
        try store.put(try DocumentID("a"), body: ["n": 1])
        let clock = ManualClock()
        let builder = MangoIndexBuilder(store: store, clock: clock, pollInterval: .seconds(5), logger: Logger(label: "test"))
        let running = Task { try await builder.run() }
        defer { running.cancel() }
        try await yieldUntil("the builder waits") { store.commitWaiters > 0 && clock.pendingDeadlines == [.seconds(5)] }
        try other.put(Self.ddoc, body: Self.designDocument(index: "by-n", field: "n"))
        #expect(!Self.isReady(store))
        clock.advance(by: .seconds(5))
        try await yieldUntil("the index is ready") { Self.isReady(store) }
        running.cancel()
        try await running.value
    }

    @Test func progressIsLoggedAtMostOncePerInterval() throws {
        let store = try DocumentStore.inMemory()
        for i in 0..<30 { try store.put(try DocumentID("d\(i)"), body: ["n": .int(Int64(i))]) }
        try store.put(Self.ddoc, body: Self.designDocument(index: "by-n", field: "n"))
        let clock = ManualClock()
        let log = CapturedLog()
        var progress = MangoIndexBuilder<ManualClock>.ProgressLog(logger: log.logger, interval: .seconds(5), clock: clock)
        progress.starting(try store.mangoIndexes())
        var steps = 0
        while true {
            let step = try store.buildMangoIndexes(maxDocuments: 4)
            progress.record(step, store: store)
            steps += 1
            if step.work == 0 { break }
            if steps % 2 == 0 { clock.advance(by: .seconds(3)) }
        }
        let messages = log.all.map(\.message)
        #expect(messages.first == "building index")
        #expect(messages.last == "index ready")
        #expect(messages.filter { $0 == "building index" }.count == 1)
        // 3 s per two steps and one log per 5 s: a progress line every fourth step at most.
        let lines = messages.filter { $0 == "index build progress" }.count
        #expect(lines >= 1 && lines <= steps / 4 + 1)
        let line = try #require(log.all.first { $0.message == "index build progress" })
        #expect(line.metadata["total"] == "31" && line.metadata["done"] != nil)
    }

    @Test func aGracefulShutdownStopsTheBuilder() async throws {
        let store = try DocumentStore.inMemory()
        let clock = ManualClock()
        let builder = MangoIndexBuilder(store: store, clock: clock, logger: Logger(label: "test"))
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(services: [.init(service: builder)], logger: Logger(label: "test")))
        let running = Task { try await group.run() }
        try await yieldUntil("the builder waits") { store.commitWaiters > 0 && clock.pendingDeadlines.count == 1 }
        await group.triggerGracefulShutdown()
        try await running.value
        #expect(store.commitWaiters == 0)
    }
}
