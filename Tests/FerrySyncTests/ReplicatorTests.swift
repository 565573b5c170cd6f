import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

@Suite(.timeLimit(.minutes(10))) struct ReplicatorTests {
    @Test func pushAndPullOneShotConvergesBothWays() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        for i in 0..<30 { try a.put(docID("a\(i)"), body: ["n": .int(Int64(i))]) }
        for i in 0..<20 { try b.put(docID("b\(i)"), body: ["n": .int(Int64(i))]) }
        let r = await sync(a, b)
        #expect(r.status.activity == .stopped)
        #expect(r.status.error == nil)
        #expect(try digest(a) == digest(b))
        #expect(try a.documentCount == 50)
        #expect(r.summary.pushed == 30)
        #expect(r.summary.pulled == 20)
    }

    @Test func pushOnlyAndPullOnlyMoveOneWay() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try a.put(docID("from-a"), body: [:])
        try b.put(docID("from-b"), body: [:])
        await sync(a, b, direction: .push)
        #expect(try b.document(docID("from-a")) != nil)
        #expect(try a.document(docID("from-b")) == nil)
        await sync(a, b, direction: .pull)
        #expect(try a.document(docID("from-b")) != nil)
    }

    @Test func aSecondRunTransfersNothingAndAResetReexaminesWithoutInserting() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        for i in 0..<10 { try a.put(docID("d\(i)"), body: ["n": .int(Int64(i))]) }
        try b.put(docID("from-b"), body: [:])
        await sync(a, b)
        let second = await sync(a, b)
        #expect(second.summary.pushed == 0 && second.summary.pulled == 0)
        // Push-only runs count exactly what they examine.
        let push1 = await sync(a, b, direction: .push)
        #expect(push1.status.total == 0)
        try a.put(docID("new"), body: [:])
        let push2 = await sync(a, b, direction: .push)
        #expect(push2.summary.pushed == 1)
        #expect(push2.status.total == 1)
        let seqB = try b.lastSequence
        let reset = await sync(a, b, direction: .push) { $0.resetCheckpoint = true }
        #expect(reset.status.total == 12)  // every local document re-examined
        #expect(reset.summary.pushed == 0)
        #expect(try b.lastSequence == seqB)
    }

    @Test func continuousReplicationDeliversNewWritesAndStops() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        var config = ReplicatorConfiguration()
        config.continuous = true
        config.heartbeat = .seconds(5)
        let link = Link(to: b)
        let r = Replicator(store: a, connector: link.connector, configuration: config)
        let events = r.documentEvents()
        r.start()
        try a.put(docID("pushed"), body: ["v": 1])
        try b.put(docID("pulled"), body: ["v": 2])
        var seen = Set<String>()
        for await e in events {
            seen.insert("\(e.direction.rawValue):\(e.id)")
            if seen == ["push:pushed", "pull:pulled"] { break }
        }
        #expect(try b.document(docID("pushed")) != nil)
        #expect(try a.document(docID("pulled")) != nil)
        r.stop()
        await r.waitUntilStopped()
        #expect(r.status.activity == .stopped)
        #expect(r.status.error == nil)
    }

    @Test func statusChangesStreamReportsBusyThenStopped() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try a.put(docID("x"), body: [:])
        let link = Link(to: b)
        let r = Replicator(store: a, connector: link.connector)
        let statuses = r.statusChanges()
        let collector = Task { await statuses.reduce(into: [ReplicatorStatus.Activity]()) { $0.append($1.activity) } }
        await r.run()
        let seen = await collector.value
        #expect(seen.first == .connecting)
        #expect(seen.contains(.busy))
        #expect(seen.last == .stopped)
        #expect(r.status.completed == r.status.total)
    }

    @Test func aConflictShowsTheSameWinnerAndConflictsOnBothSides() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let base = try a.put(docID("doc"), body: ["v": 0])
        await sync(a, b)
        try a.put(docID("doc"), body: ["v": "a"], parent: base)
        try b.put(docID("doc"), body: ["v": "b"], parent: base)
        let r = await sync(a, b)
        #expect(r.summary.conflicts == 1)
        let da = try #require(try a.document(docID("doc")))
        let db = try #require(try b.document(docID("doc")))
        #expect(da.revision == db.revision)
        #expect(da.conflicts == db.conflicts)
        #expect(da.conflicts.count == 1)
    }

    @Test func deletesPropagateThroughAFilterThatRoutesOnKeptProperties() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let ordersOnly = RevisionFilter(name: "orders") { $0.body["type"] == "order" }
        let r1 = try a.put(docID("o1"), body: ["type": "order"])
        let n1 = try a.put(docID("n1"), body: ["type": "note"])
        await sync(a, b, direction: .push) { $0.pushFilter = ordersOnly }
        #expect(try b.document(docID("o1")) != nil)
        #expect(try b.document(docID("n1")) == nil)
        try a.delete(docID("o1"), revision: r1, keepProperties: true)
        try a.delete(docID("n1"), revision: n1, keepProperties: true)
        await sync(a, b, direction: .push) { $0.pushFilter = ordersOnly }
        #expect(try b.document(docID("o1"))?.deleted == true)
        #expect(try b.document(docID("n1")) == nil)
        // The pull filter routes the same way.
        let c = try DocumentStore.inMemory()
        let pulled = await sync(c, a, direction: .pull) { $0.pullFilter = ordersOnly }
        #expect(try c.document(docID("o1"))?.deleted == true)
        #expect(try c.document(docID("n1")) == nil)
        #expect(pulled.summary.rejected == 1)
    }

    @Test func deltasAreUsedWhenSmallerAndCounted() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let big = String(repeating: "lorem ipsum ", count: 600)
        var rev = try a.put(docID("big"), body: ["text": .string(big), "n": 0])
        await sync(a, b)
        rev = try a.put(docID("big"), body: ["text": .string(big), "n": 1], parent: rev)
        let push = await sync(a, b, direction: .push)
        #expect(push.summary.deltasSent == 1)
        #expect(try b.document(docID("big"))?.body["n"] == 1)
        try b.put(docID("big"), body: ["text": .string(big), "n": 2], parent: rev)
        let pull = await sync(a, b, direction: .pull)
        #expect(pull.summary.deltasReceived == 1)
        #expect(pull.summary.bytesReceived < big.utf8.count)
        #expect(try a.document(docID("big"))?.body["n"] == 2)
        // With deltas off, the full body travels.
        try a.put(docID("big"), body: ["text": .string(big), "n": 3], parent: try a.document(docID("big"))!.revision)
        let full = await sync(a, b, direction: .push) { $0.deltas = false }
        #expect(full.summary.deltasSent == 0)
        #expect(full.summary.bytesSent > big.utf8.count)
    }

    @Test func aCorruptedDeltaFallsBackToTheFullBody() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let big = String(repeating: "x", count: 4000)
        let rev = try b.put(docID("d"), body: ["text": .string(big), "n": 0])
        await sync(a, b)
        try b.put(docID("d"), body: ["text": .string(big), "n": 1], parent: rev)
        var link = Link(to: b)
        // The server's replies have every delta's "n" changed: the digest check catches it.
        link.faults = { _ in
            (.init(), .init(deliver: { bytes in
                guard var m = try? Message(decoding: bytes), contains("deltaBase", in: m.body) else { return [bytes] }
                m.body = replacing("\"n\":1", with: "\"n\":7", in: m.body)
                return [m.encoded()]
            }))
        }
        var config = ReplicatorConfiguration()
        config.direction = .pull
        let r = Replicator(store: a, connector: link.connector, configuration: config, clock: ImmediateClock())
        await r.run()
        #expect(r.status.error == nil)
        #expect(r.summary.deltasReceived >= 1)
        #expect(r.summary.rejected == 0)
        #expect(try a.document(docID("d"))?.body["n"] == 1)
    }

    @Test func blobsAreSentOnceAndOnlyWhenMissing() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let content = Array(repeating: UInt8(7), count: 50_000)
        let ref = try a.blobs.put(content)
        try a.put(docID("p1"), body: ["photo": ref.json])
        try a.put(docID("p2"), body: ["photo": ref.json, "copy": true])
        let push = await sync(a, b, direction: .push)
        #expect(push.summary.blobsSent == 1)
        #expect(try b.blobs.get(ref.digest) == content)
        #expect(try b.documentCount == 2)
        try a.put(docID("p3"), body: ["photo": ref.json, "third": true])
        let again = await sync(a, b, direction: .push)
        #expect(again.summary.blobsSent == 0)
        #expect(again.summary.bytesSent < 10_000)
        // Pulling fetches the blob before inserting the document.
        let c = try DocumentStore.inMemory()
        let pull = await sync(c, a, direction: .pull)
        #expect(pull.summary.blobsReceived == 1)
        #expect(try c.blobs.get(ref.digest) == content)
    }

    @Test func readOnlyRefusesPushWithAPermanentError() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try a.put(docID("x"), body: [:])
        var options = ReplicationResponder.Options()
        options.readOnly = true
        let r = await sync(a, b, direction: .push, responder: options)
        #expect(r.status.activity == .stopped)
        #expect(r.status.error?.code == "forbidden")
        #expect(r.status.error?.isTransient == false)
        #expect(try b.documentCount == 0)
        // Pull from a read-only peer still works.
        try b.put(docID("y"), body: [:])
        let pull = await sync(a, b, direction: .pull, responder: options)
        #expect(pull.status.error == nil)
        #expect(try a.document(docID("y")) != nil)
    }

    @Test func aTransientFailureRetriesAndCompletes() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        for i in 0..<300 { try a.put(docID("d\(i)"), body: ["n": .int(Int64(i))]) }
        var link = Link(to: b)
        // The first two connections break after a few messages.
        link.faults = { attempt in
            attempt <= 2 ? (.init(failAfterMessages: 6), .init()) : (.init(), .init())
        }
        var config = ReplicatorConfiguration()
        config.batchSize = 50
        let r = Replicator(store: a, connector: link.connector, configuration: config, clock: ImmediateClock())
        await r.run()
        #expect(r.status.error == nil)
        #expect(link.attempts.current == 3)
        #expect(try digest(a) == digest(b))
    }

    @Test func aPermanentFailureStopsWithTheError() async throws {
        let a = try DocumentStore.inMemory()
        let r = Replicator(
            store: a, connector: { throw SyncError(.other("unknown_peer"), message: "certificate not pinned", isTransient: false) },
            clock: ImmediateClock())
        await r.run()
        #expect(r.status.activity == .stopped)
        #expect(r.status.error?.code == "unknown_peer")
        // A transient failure that never clears gives up after maxAttempts.
        let attempts = Counter()
        var config = ReplicatorConfiguration()
        config.maxAttempts = 4
        let flaky = Replicator(
            store: a, connector: { attempts.increment(); throw SyncError.disconnected("refused") }, configuration: config,
            clock: ImmediateClock())
        await flaky.run()
        #expect(attempts.current == 4)
        #expect(flaky.status.error?.code == "disconnected")
    }

    @Test func pendingDocumentsAreCorrectBeforeAndAfterAPush() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try a.put(docID("p1"), body: [:])
        try a.put(docID("p2"), body: [:])
        var config = ReplicatorConfiguration()
        config.direction = .push
        let link = Link(to: b)
        let r = Replicator(store: a, connector: link.connector, configuration: config, clock: ImmediateClock())
        #expect(try r.pendingDocumentIDs() == [docID("p1"), docID("p2")])
        await r.run()
        #expect(try r.pendingDocumentIDs().isEmpty)
        try a.put(docID("p3"), body: [:])
        #expect(try r.isDocumentPending(docID("p3")))
        #expect(try !r.isDocumentPending(docID("p1")))
    }

    @Test func aPullOfManyPagesOfManyChunksStoresEachRevisionOnceInTheSourcesOrder() async throws {
        // Pages of 7 changes in chunks of 2: the next page is planned, and its first chunks
        // fetched and judged, while the previous page is still being inserted.
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        for i in 0..<60 { try a.put(docID(String(format: "d%02d", i)), body: ["n": .int(Int64(i)), "secret": .bool(i % 13 == 5)]) }
        let noSecrets = RevisionFilter(name: "no-secrets") { $0.body["secret"] != true }
        let r = await sync(b, a, direction: .pull) {
            $0.batchSize = 7
            $0.maxRevisionsPerRequest = 2
            $0.pullFilter = noSecrets
        }
        #expect(r.status.error == nil)
        let refused = (0..<60).filter { $0 % 13 == 5 }.count
        #expect(r.summary.pulled == 60 - refused)
        #expect(r.summary.rejected == refused)
        // Stored in the order the source's feed listed them, each once.
        let pulledOrder = try b.changes(since: 0, limit: 100).map(\.id.rawValue)
        let sourceOrder = try a.changes(since: 0, limit: 100).map(\.id.rawValue).filter { id in
            !(Int(id.dropFirst()).map { $0 % 13 == 5 } ?? false)
        }
        #expect(pulledOrder == sourceOrder)
        #expect(try b.lastSequence == UInt64(60 - refused))
        // A second run finds nothing to do: the checkpoint covers every page.
        let again = await sync(b, a, direction: .pull) {
            $0.batchSize = 7
            $0.maxRevisionsPerRequest = 2
            $0.pullFilter = noSecrets
        }
        #expect(again.summary.pulled == 0 && again.status.total == 0)
    }

    @Test func documentIDsLimitWhatIsReplicated() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        for id in ["keep1", "keep2", "skip"] { try a.put(docID(id), body: [:]) }
        await sync(a, b) { $0.documentIDs = [docID("keep1"), docID("keep2")] }
        #expect(try b.allDocuments().map(\.id.rawValue) == ["keep1", "keep2"])
    }
}

import ServiceLifecycle
import Logging

@Suite(.timeLimit(.minutes(10))) struct ReplicatorServiceTests {
    @Test func gracefulShutdownOfAServiceGroupStopsAContinuousReplicator() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        var config = ReplicatorConfiguration()
        config.continuous = true
        let r = Replicator(store: a, connector: Link(to: b).connector, configuration: config)
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let group = ServiceGroup(services: [r], logger: logger)
        let statuses = r.statusChanges()
        let running = Task { try await group.run() }
        try a.put(docID("x"), body: [:])
        for await s in statuses where s.activity == .idle && s.completed >= 1 { break }
        await group.triggerGracefulShutdown()
        try await running.value
        #expect(r.status.activity == .stopped)
        #expect(r.status.error == nil)
        #expect(try b.document(docID("x")) != nil)
    }
}

/// A pull's progress total is the whole feed's size from the first page on, when the other
/// side may tell it; a restricted reader is not told how much it may not see.
@Suite struct PullProgressTotalTests {
    static func source(_ n: Int) throws -> DocumentStore {
        let a = try DocumentStore.inMemory()
        for i in 0..<n { try a.put(docID("d\(i)"), body: ["i": .int(Int64(i))]) }
        return a
    }

    /// The largest total the replicator reported while it had completed at most one page.
    static func firstPageTotal(_ a: DocumentStore, options: ReplicationResponder.Options = .init()) async throws -> (Int, Replicator) {
        let b = try DocumentStore.inMemory()
        var configuration = ReplicatorConfiguration(direction: .pull)
        configuration.batchSize = 1000
        let r = Replicator(store: b, connector: Link(to: a, options: options).connector, configuration: configuration, clock: ImmediateClock())
        let updates = r.statusChanges()
        let watcher = Task {
            var seen = 0
            for await s in updates where s.completed < 1000 { seen = max(seen, s.total) }
            return seen
        }
        await r.run()
        return (await watcher.value, r)
    }

    @Test func theTotalIsTheWholeFeedFromTheFirstPage() async throws {
        let (total, r) = try await Self.firstPageTotal(try Self.source(2500))
        #expect(r.status.error == nil)
        #expect(total == 2500, "the first page said \(total)")
        #expect(r.status.completed == 2500 && r.status.total == 2500)
    }

    @Test func aRestrictedReaderIsToldNoTotal() async throws {
        let a = try Self.source(2500)
        var options = ReplicationResponder.Options()
        options.defaultPolicy = PeerPolicy(read: AccessRule(idPrefixes: ["d1"]), write: .none, mayDelete: false)
        let (total, r) = try await Self.firstPageTotal(a, options: options)
        #expect(r.status.error == nil)
        // Page by page: never the count of documents it may not read.
        #expect(total < 2500, "\(total)")
    }
}
