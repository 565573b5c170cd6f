import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import Testing
@testable import FerrySync

/// Coverage never claims a revision its store lacks: relays a sender skipped hold it back
/// until they are held (`CoverageHold`), on the wire both ways.
@Suite struct CoverageHoldTests {
    /// A revision as any store makes it for this body (no parent): the same ID everywhere.
    func revision(_ id: String, _ n: Int64) throws -> RevisionID {
        try DocumentStore.inMemory().put(docID(id), body: ["v": .int(n)])
    }

    @Test func coverageStaysBelowASkippedRelayUntilTheStoreHoldsIt() throws {
        let store = try DocumentStore.inMemory()
        var hold = CoverageHold()
        hold.note([SkippedRelay(sequence: 5, id: docID("x"), revision: try revision("x", 1))], lostFrom: nil)
        #expect(try hold.coverable(through: 9, store: store) == 4)
        #expect(!hold.isClear)
        _ = try store.put(docID("x"), body: ["v": 1])
        #expect(try hold.coverable(through: 9, store: store) == 9)
        #expect(hold.isClear)
    }

    @Test func aDescendantOfTheSkippedRevisionCountsAsHoldingIt() throws {
        let store = try DocumentStore.inMemory()
        let first = try store.put(docID("x"), body: ["v": 1])
        _ = try store.put(docID("x"), body: ["v": 2], parent: first)
        var hold = CoverageHold()
        hold.note([SkippedRelay(sequence: 3, id: docID("x"), revision: first)], lostFrom: nil)
        #expect(try hold.coverable(through: 8, store: store) == 8)
    }

    @Test func unreportedSkipsHoldCoverageBelowWhereTheyStartedForTheLinksLife() throws {
        let store = try DocumentStore.inMemory()
        var hold = CoverageHold()
        hold.note([], lostFrom: 7)
        #expect(try hold.coverable(through: 20, store: store) == 6)
        hold.note([], lostFrom: 12)
        #expect(try hold.coverable(through: 30, store: store) == 6)
        #expect(!hold.isClear)
    }

    @Test func skipReportsCrossTheWireAndAMalformedEntryCountsAsLost() throws {
        let rev = try revision("x", 1)
        var reply = ChangesReply(changes: [], lastSeq: 9, caughtUp: true)
        reply.skipped = [SkippedRelay(sequence: 4, id: docID("x"), revision: rev)]
        let read = try ChangesReply(reply.json)
        #expect(read.skipped == reply.skipped)
        #expect(!read.skipsLost)
        var set = SetCheckpointRequest(id: "k", value: ["seq": 9], direction: .push)
        set.skipped = reply.skipped
        set.skipsLost = true
        let back = try SetCheckpointRequest(set.json)
        #expect(back.skipped == reply.skipped)
        #expect(back.skipsLost)
        let malformed: JSON = ["changes": [], "lastSeq": 9, "skipped": [[4, "x"]]]
        #expect(try ChangesReply(malformed).skipsLost)
        // Nothing skipped: nothing on the wire.
        #expect(ChangesReply(changes: [], lastSeq: 1, caughtUp: false).json["skipped"] == nil)
    }

    @Test func aPushersSkippedRelaysHoldItsCoverageAndTheTakeOverUntilHeld() async throws {
        let j = try JoinNode("j")
        let (remote, connection) = try await PushCatchUpTests().open(
            j.link(), coverage: CoverageSnapshot(sequence: 10, databases: ["other-db": 100]))
        _ = try await remote.checkpoint("k", direction: .push)
        let skipped = SkippedRelay(sequence: 7, id: docID("x"), revision: try revision("x", 1))
        try await remote.putCheckpoint("k", value: ["seq": 12], direction: .push, caughtUp: true, skipped: [skipped], skipsLost: false)
        // The pusher left x out (its sender delivers it): this node lacks it, so neither its
        // coverage of the pusher's feed nor the pusher's stated coverage may count it.
        #expect(try Coverage.of("pusher-db", in: j.store) == 6)
        #expect(try Coverage.of("other-db", in: j.store) == nil)
        _ = try j.store.put(docID("x"), body: ["v": 1])
        try await remote.putCheckpoint("k", value: ["seq": 13], direction: .push, caughtUp: true)
        #expect(try Coverage.of("pusher-db", in: j.store) == 13)
        #expect(try Coverage.of("other-db", in: j.store) == 100)
        await connection.close()
    }

    @Test func aPusherThatDoesNotReportSkipsLeavesNoCoverage() async throws {
        let j = try JoinNode("j")
        let connection = Connection(endpoint: try await j.link().connector())
        connection.start()
        let older = SyncProtocol.features.filter { $0 != SyncProtocol.skipReportsFeature }
        let remote = try await FerryRemote.open(
            connection, nodeID: "pusher", localDatabase: "pusher-db", inlineWanted: false, features: older,
            coverage: CoverageSnapshot(sequence: 3, databases: ["other-db": 100]))
        _ = try await remote.checkpoint("k", direction: .push)
        try await remote.putCheckpoint("k", value: ["seq": 3], direction: .push, caughtUp: true)
        #expect(try Coverage.of("pusher-db", in: j.store) == nil)
        #expect(try Coverage.of("other-db", in: j.store) == nil)
        await connection.close()
    }
}

/// Anti-entropy: a full link left idle while the two nodes hold different documents
/// compares digests and reconciles, whatever put it in that state.
@Suite(.timeLimit(.minutes(3))) struct AntiEntropyTests {
    /// Fast settings for tests: heartbeats every 100 ms, a difference acted on after 300 ms.
    static func fast(_ config: inout ReplicatorConfiguration) {
        config.wiring.liveness.interval = .milliseconds(100)
        // Generous: a loaded test machine must not drop the link for silence.
        config.wiring.liveness.deadAfter = .seconds(30)
        config.wiring.antiEntropy.checkInterval = .milliseconds(100)
        config.wiring.antiEntropy.settle = .milliseconds(300)
    }

    /// `a` dials `b` (push and pull, continuous), each with its digests; the floors claim
    /// each side already holds the other's whole feed, so neither loop sends anything.
    func frozenPair(aDocs: Int, bDocs: Int, antiEntropy: Bool = true) throws -> (JoinNode, JoinNode, Replicator) {
        let a = try JoinNode("a")
        let b = try JoinNode("b")
        try writeDocuments(a.store, prefix: "a", count: aDocs, size: 900)
        try writeDocuments(b.store, prefix: "b", count: bDocs)
        // The state a wrong coverage leaves: each claims to hold the other's feed to its end.
        try Coverage.raise(b.store.uuid, to: b.store.lastChangeSequence, in: a.store)
        try Coverage.raise(a.store.uuid, to: a.store.lastChangeSequence, in: b.store)
        var options = ReplicationResponder.Options()
        options.nodeID = "b"
        options.liveness.interval = .milliseconds(100)
        options.liveness.deadAfter = .seconds(30)
        options.digests = MeshDigests(store: b.store, minInterval: .milliseconds(50))
        let link = Link(to: b.store, options: options, quiet: true)
        var config = ReplicatorConfiguration()
        config.wiring.nodeID = "a"
        config.continuous = true
        config.wiring.metrics = a.metrics.sync
        config.wiring.digests = MeshDigests(store: a.store, minInterval: .milliseconds(50))
        config.wiring.antiEntropy.enabled = antiEntropy
        Self.fast(&config)
        var quiet = Logger(label: "ferry.antientropy")
        quiet.logLevel = .critical
        let r = Replicator(store: a.store, connector: link.connector, configuration: config, logger: quiet)
        return (a, b, r)
    }

    @Test func aLinkIdleWithDifferentDigestsReconcilesBothWays() async throws {
        let (a, b, r) = try frozenPair(aDocs: 3000, bDocs: 20)
        let start = ContinuousClock.now
        r.start()
        try await waitUntil("a reconciliation", timeout: 120, every: .milliseconds(5)) { a.metrics["ferry_reconciliations_total"] >= 1 }
        let noticed = ContinuousClock.now - start
        try await waitUntil("a and b converge", timeout: 120, every: .milliseconds(20)) {
            try b.store.info().documentCount == 3020 && a.store.info().documentCount == 3020
        }
        let healed = ContinuousClock.now - start - noticed
        #expect(try digest(a.store) == digest(b.store))
        print(
            "anti-entropy: a frozen link noticed after \(noticed) (settle 300 ms, heartbeats 100 ms), then healed 3,000 missing documents one way and 20 the other in \(healed) (debug build)")
        r.stop()
        await r.waitUntilStopped()
    }

    @Test func withoutAntiEntropyTheFrozenLinkStaysApart() async throws {
        // The baseline: the state above does not heal by itself, so the test above can fail.
        let (a, b, r) = try frozenPair(aDocs: 50, bDocs: 5, antiEntropy: false)
        r.start()
        try await waitUntil("the link is up and idle", timeout: 30, every: .milliseconds(20)) { r.status.activity == .idle }
        // Heartbeats and digests flow; several settle periods pass with nothing moving.
        try await Task.sleep(for: .seconds(1))
        #expect(try digest(a.store) != digest(b.store))
        #expect(a.metrics["ferry_reconciliations_total"] == 0)
        r.stop()
        await r.waitUntilStopped()
    }

    @Test func peersWithEqualDigestsNeverReconcile() async throws {
        let (a, b, r) = try frozenPair(aDocs: 0, bDocs: 0)
        try writeDocuments(a.store, prefix: "late", count: 30)
        r.start()
        try await waitUntil("a and b converge", timeout: 30, every: .milliseconds(20)) { try digest(a.store) == digest(b.store) }
        try await waitUntil("b's digest reaches a", timeout: 30, every: .milliseconds(20)) {
            r.configuration.wiring.digests?.matches("b") == true
        }
        #expect(a.metrics["ferry_reconciliations_total"] == 0)
        r.stop()
        await r.waitUntilStopped()
    }
}
