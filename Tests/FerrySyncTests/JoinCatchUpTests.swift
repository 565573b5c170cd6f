import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// A joining node fetches each revision once: one link at a time catches it up (the
/// catch-up gate), and the others start from the coverage it leaves (floors).
@Suite(.timeLimit(.minutes(5))) struct JoinCatchUpTests {
    /// Three nodes holding the same 500 documents, settled so each covers the others' feeds.
    func settledTrio(documents: Int = 500) async throws -> [JoinNode] {
        let nodes = try ["a", "b", "c"].map { try JoinNode($0) }
        try writeDocuments(nodes[0].store, prefix: "doc", count: documents)
        await settle(nodes)
        for n in nodes { #expect(try digest(n.store) == digest(nodes[0].store)) }
        return nodes
    }

    @Test func aJoiningNodePullsEachRevisionOnceAndOnlyOneLinkListsTheFeed() async throws {
        let holders = try await settledTrio()
        // Settling recorded complete coverage: each node holds the others' feeds to their ends.
        for n in holders {
            for other in holders where other.name != n.name {
                #expect(try n.coverage(of: other) == other.store.lastChangeSequence)
            }
        }
        let joiner = try JoinNode("j")
        let links = holders.map { joiner.replicator(to: $0, direction: .pull) }
        await runTogether(links)
        #expect(try digest(joiner.store) == digest(holders[0].store))
        #expect(links.map { $0.summary.pulled }.reduce(0, +) == 500)
        #expect(joiner.metrics.duplicates == 0)
        // Whichever link caught up first listed the 500 changes; the others started at their tips.
        #expect(links.map { $0.status.total }.sorted() == [0, 0, 500])
        #expect(joiner.gate.snapshot.holder == nil)
    }

    @Test func withoutTheGateEveryLinkListsTheWholeFeed() async throws {
        // The baseline the gate improves on (and proof the counts above can differ).
        let holders = try await settledTrio(documents: 200)
        let joiner = try JoinNode("j")
        let links = holders.map { joiner.replicator(to: $0, direction: .pull, gated: false) }
        await runTogether(links)
        #expect(try digest(joiner.store) == digest(holders[0].store))
        #expect(links.map { $0.status.total } == [200, 200, 200])
    }

    @Test func aPeerThatDialsTheJoinerWaitsItsTurnAndPushesOnlyPastWhatTheJoinerHolds() async throws {
        let holders = try await settledTrio()
        let joiner = try JoinNode("j")
        // a dials the joiner (push to its responder); the joiner dials b and c.
        let inbound = holders[0].replicator(to: joiner, direction: .pushAndPull)
        let outbound = holders.dropFirst().map { joiner.replicator(to: $0, direction: .pull) }
        await runTogether([inbound] + outbound)
        #expect(try digest(joiner.store) == digest(holders[0].store))
        #expect(inbound.summary.pushed + outbound.map { $0.summary.pulled }.reduce(0, +) == 500)
        #expect(joiner.metrics.duplicates == 0)
        #expect(joiner.gate.snapshot.holder == nil)
    }

    @Test func aPeerWithWritesPastTheSnapshotStillDeliversThem() async throws {
        let holders = try await settledTrio()
        // b writes after the others last saw its feed: a's coverage of b stops before these.
        try writeDocuments(holders[1].store, prefix: "late", count: 20)
        let joiner = try JoinNode("j")
        let fromA = joiner.replicator(to: holders[0], direction: .pull)
        await fromA.run()
        #expect(fromA.summary.pulled == 500)
        let fromB = joiner.replicator(to: holders[1], direction: .pull)
        let fromC = joiner.replicator(to: holders[2], direction: .pull)
        await runTogether([fromB, fromC])
        #expect(fromB.summary.pulled == 20)
        #expect(fromB.status.total == 20)
        #expect(fromC.status.total == 0)
        #expect(try digest(joiner.store) == digest(holders[1].store))
    }

    @Test func coverageFromARestrictedIntakeIsNotPassedOn() async throws {
        let a = try JoinNode("a")
        let d = try JoinNode("d")
        try writeDocuments(d.store, prefix: "pub", count: 30)
        try writeDocuments(d.store, prefix: "secret", count: 10)
        // a may only take pub-* from d: its coverage of d is incomplete, so it records none.
        await a.sync(with: d, direction: .pull) { $0.remotePolicy = PeerPolicy(write: AccessRule(idPrefixes: ["pub-"])) }
        #expect(try a.store.documentCount == 30)
        #expect(try a.coverage(of: d) == nil)
        let joiner = try JoinNode("j")
        await joiner.sync(with: a, direction: .pull)
        #expect(try joiner.coverage(of: d) == nil)
        let fromD = await joiner.sync(with: d, direction: .pull)
        #expect(fromD.summary.pulled == 10)
        #expect(try joiner.store.documentCount == 40)
    }

    @Test func aPullFilterKeepsCoverageFromBeingRecorded() async throws {
        let a = try JoinNode("a")
        let d = try JoinNode("d")
        try writeDocuments(d.store, prefix: "doc", count: 10)
        await a.sync(with: d, direction: .pull) { $0.pullFilter = RevisionFilter(name: "all") { _ in true } }
        #expect(try a.store.documentCount == 10)
        #expect(try a.coverage(of: d) == nil)
        await a.sync(with: d, direction: .pull)
        #expect(try a.coverage(of: d) == d.store.lastChangeSequence)
    }

    @Test func aPullThatLeavesNoCoverageNeitherWaitsForNorTakesTheLease() async throws {
        let d = try JoinNode("d")
        try writeDocuments(d.store, prefix: "doc", count: 10)
        let joiner = try JoinNode("j")
        let held = joiner.gate.ticket(label: "another link")
        try await joiner.gate.acquire(held)
        // Filtered: it would leave no coverage behind, so it runs beside the holder.
        let filtered = await joiner.sync(with: d, direction: .pull) { $0.pullFilter = RevisionFilter(name: "all") { _ in true } }
        #expect(filtered.summary.pulled == 10)
        #expect(joiner.gate.snapshot.holder == "another link")
        joiner.gate.release(held)
    }

    @Test func whenTheHoldersLinkFailsTheNextWaiterCatchesTheJoinerUp() async throws {
        let holders = try await settledTrio(documents: 300)
        let joiner = try JoinNode("j")
        // The link to a takes the lease, then stalls until another link waits, then fails for
        // good in the middle of its catch-up.
        let sent = Counter()
        let gate = joiner.gate
        let stallThenFail: @Sendable (Int) -> (client: InMemoryEndpoint.Faults, server: InMemoryEndpoint.Faults) = { _ in
            let deliver: @Sendable ([UInt8]) async -> [[UInt8]] = { bytes in
                if sent.increment() >= 3 { while gate.snapshot.waiting == 0 { await Task.yield() } }
                return [bytes]
            }
            return (.init(failAfterMessages: 4, deliver: deliver), .init())
        }
        let failing = joiner.replicator(to: holders[0], direction: .pull, faults: stallThenFail) {
            $0.maxAttempts = 1
            $0.batchSize = 50
            $0.maxRevisionsPerRequest = 10
        }
        failing.start()
        while joiner.gate.snapshot.holder == nil { await Task.yield() }
        let waiter = joiner.replicator(to: holders[1], direction: .pull)
        await runTogether([waiter])
        await failing.waitUntilStopped()
        #expect(failing.status.error != nil)
        #expect(try digest(joiner.store) == digest(holders[1].store))
        #expect(joiner.gate.snapshot.holder == nil)
        #expect(joiner.metrics.duplicates == 0)
    }

    @Test func aLyingHoldsFloorOnlyKeepsDocumentsFromTheLiar() async throws {
        let p = try JoinNode("p")
        let liar = try JoinNode("liar")
        let honest = try JoinNode("honest")
        try writeDocuments(p.store, prefix: "doc", count: 25)
        // The liar claims it holds p's whole feed and more.
        try liar.store.putLocalDocument(Coverage.localID(p.store.uuid), body: ["seq": 1_000_000])
        let toLiar = await p.sync(with: liar, direction: .push)
        let toHonest = await p.sync(with: honest, direction: .push)
        #expect(toLiar.summary.pushed == 0)
        #expect(try liar.store.documentCount == 0)
        #expect(toHonest.summary.pushed == 25)
        #expect(try digest(honest.store) == digest(p.store))
        // The liar's own pull starts at its own claim too; p and the honest peer are untouched.
        await liar.sync(with: p, direction: .pull)
        #expect(try liar.store.documentCount == 0)
        #expect(try p.store.documentCount == 25)
    }

    @Test func aLaterLinkStartsFromCoverageTakenOverEarlier() async throws {
        let holders = try await settledTrio(documents: 100)
        let joiner = try JoinNode("j")
        await joiner.sync(with: holders[0], direction: .pull)
        // Its pull checkpoints with b and c do not exist, but its coverage of their feeds does.
        let fromB = await joiner.sync(with: holders[1], direction: .pull)
        #expect(fromB.status.total == 0)
        #expect(try joiner.coverage(of: holders[2]) == holders[2].store.lastChangeSequence)
    }
}

/// The responder's side, driven message by message as a pushing peer would.
@Suite struct PushCatchUpTests {
    func open(_ link: Link, coverage: CoverageSnapshot?) async throws -> (FerryRemote, Connection) {
        let connection = Connection(endpoint: try await link.connector())
        connection.start()
        let remote = try await FerryRemote.open(
            connection, nodeID: "pusher", localDatabase: "pusher-db", inlineWanted: false, coverage: coverage)
        return (remote, connection)
    }

    @Test func aPushersCoverageIsTakenOverOnlyOnceItsPushReachedItsFeedsEnd() async throws {
        let j = try JoinNode("j")
        let (remote, connection) = try await open(j.link(), coverage: CoverageSnapshot(sequence: 10, databases: ["other-db": 100]))
        // A write that names no direction (an older peer) records nothing.
        try await remote.putLocalDocument("k", value: ["seq": 4])
        #expect(try Coverage.of("pusher-db", in: j.store) == nil)
        let first = try await remote.checkpoint("k", direction: .push)
        #expect(first.value?["seq"]?.intValue == 4)
        #expect(first.holds == nil)
        #expect(j.gate.snapshot.holder != nil)
        try await remote.putCheckpoint("k", value: ["seq": 6], direction: .push, caughtUp: false)
        #expect(try Coverage.of("pusher-db", in: j.store) == 6)
        #expect(j.gate.snapshot.holder != nil)
        // Past the feed's end as hello stated it: the lease passes on, but the push has not
        // reached the feed's end now, so nothing is taken over yet.
        try await remote.putCheckpoint("k", value: ["seq": 10], direction: .push, caughtUp: false)
        #expect(j.gate.snapshot.holder == nil)
        #expect(try Coverage.of("other-db", in: j.store) == nil)
        try await remote.putCheckpoint("k", value: ["seq": 12], direction: .push, caughtUp: true)
        #expect(try Coverage.of("other-db", in: j.store) == 100)
        #expect(try Coverage.of("pusher-db", in: j.store) == 12)
        // A later push starts from what this node holds.
        #expect(try await remote.checkpoint("k", direction: .push).holds == 12)
        await connection.close()
    }

    @Test func aPushIntakeThatRefusesDeletionsRecordsNoCoverage() async throws {
        let j = try JoinNode("j")
        let (remote, connection) = try await open(
            j.link(policy: PeerPolicy(mayDelete: false)), coverage: CoverageSnapshot(sequence: 3, databases: ["other-db": 100]))
        _ = try await remote.checkpoint("k", direction: .push)
        try await remote.putCheckpoint("k", value: ["seq": 3], direction: .push, caughtUp: true)
        #expect(try Coverage.of("pusher-db", in: j.store) == nil)
        #expect(try Coverage.of("other-db", in: j.store) == nil)
        #expect(j.gate.snapshot.holder == nil)
        await connection.close()
    }

    @Test func aPushingPeerThatStatesNoCoverageNeitherWaitsNorIsCovered() async throws {
        let j = try JoinNode("j")
        let held = j.gate.ticket(label: "another link")
        try await j.gate.acquire(held)
        let (remote, connection) = try await open(j.link(), coverage: nil)
        // Answered at once although another link holds the lease.
        _ = try await remote.checkpoint("k", direction: .push)
        try await remote.putCheckpoint("k", value: ["seq": 3], direction: .push, caughtUp: true)
        #expect(try Coverage.of("pusher-db", in: j.store) == nil)
        #expect(j.gate.snapshot.holder == "another link")
        j.gate.release(held)
        await connection.close()
    }

    @Test func aPusherWaitingForItsTurnLeavesTheLineWhenItsSessionEnds() async throws {
        let j = try JoinNode("j")
        let held = j.gate.ticket(label: "another link")
        try await j.gate.acquire(held)
        let (remote, connection) = try await open(j.link(), coverage: CoverageSnapshot(sequence: 3, databases: [:]))
        let asking = Task { try await remote.checkpoint("k", direction: .push) }
        while j.gate.snapshot.waiting == 0 { await Task.yield() }
        await connection.close()
        _ = try? await asking.value
        while j.gate.snapshot.waiting != 0 { await Task.yield() }
        j.gate.release(held)
        #expect(j.gate.snapshot.holder == nil)
    }
}

/// The lease itself: one holder, arrival order, and no holder left behind by a link that ends.
@Suite struct CatchUpGateTests {
    @Test func theLeasePassesToTheNextWaiterWhenTheHolderReleases() async throws {
        let gate = CatchUpGate()
        let first = gate.ticket(label: "first")
        let second = gate.ticket(label: "second")
        try await gate.acquire(first)
        let waiting = Task { try await gate.acquire(second) }
        while gate.snapshot.waiting == 0 { await Task.yield() }
        #expect(gate.snapshot.holder == "first")
        gate.release(first)  // the holder's link failed
        try await waiting.value
        #expect(gate.snapshot.holder == "second")
        gate.release(second)
        #expect(gate.snapshot.holder == nil)
    }

    @Test func aWaiterWhoseLinkEndsLeavesTheQueue() async throws {
        let gate = CatchUpGate()
        let holder = gate.ticket(label: "holder")
        let leaving = gate.ticket(label: "leaving")
        let next = gate.ticket(label: "next")
        try await gate.acquire(holder)
        let leaver = Task { try await gate.acquire(leaving) }
        while gate.snapshot.waiting < 1 { await Task.yield() }
        let nextWait = Task { try await gate.acquire(next) }
        while gate.snapshot.waiting < 2 { await Task.yield() }
        leaver.cancel()
        await #expect(throws: CancellationError.self) { try await leaver.value }
        #expect(gate.snapshot.waiting == 1)
        gate.release(holder)
        try await nextWait.value
        #expect(gate.snapshot.holder == "next")
        gate.release(next)
    }

    @Test func aTicketReleasedBeforeItsWaitNeverTakesTheLease() async throws {
        let gate = CatchUpGate()
        let ticket = gate.ticket(label: "gone")
        gate.release(ticket)
        await #expect(throws: CancellationError.self) { try await gate.acquire(ticket) }
        #expect(gate.snapshot.holder == nil)
        gate.release(ticket)  // idempotent
        let other = gate.ticket(label: "other")
        try await gate.acquire(other)
        #expect(gate.snapshot.holder == "other")
    }
}

/// The optional properties of hello and checkpoint messages.
@Suite struct JoinMessageTests {
    @Test func helloCarriesCoverageBothWaysAndOmitsItWhenAbsent() throws {
        let snapshot = CoverageSnapshot(sequence: 42, databases: ["db-1": 7, "db-2": 40])
        let request = HelloRequest(nodeID: "n", database: "d", protocols: [1], features: [], coverage: snapshot)
        #expect(try HelloRequest(request.json).coverage == snapshot)
        let reply = HelloReply(nodeID: "n", database: "d", protocolVersion: 1, features: [], allowPush: true, allowPull: true, coverage: snapshot)
        #expect(try HelloReply(reply.json).coverage == snapshot)
        let old = HelloRequest(nodeID: "n", database: "d", protocols: [1], features: [])
        #expect(old.json.objectValue?.keys.contains("coverage") == false)
        #expect(try HelloRequest(old.json).coverage == nil)
    }

    @Test func malformedCoverageIsIgnoredNotTrusted() throws {
        for bad: JSON in [["seq": -1, "dbs": [:]], ["seq": 3], ["seq": 3, "dbs": ["x": "y"]], ["seq": 3, "dbs": ["": 1]], "nope"] {
            let o: JSON = ["nodeID": "n", "protocol": [1], "coverage": bad]
            #expect(try HelloRequest(o).coverage == nil)
        }
    }

    @Test func checkpointRequestsCarryADirectionAndRepliesAFloor() throws {
        let get = GetCheckpointRequest(id: "k", direction: .push)
        #expect(try GetCheckpointRequest(get.json).direction == .push)
        #expect(try GetCheckpointRequest(["id": "k"]).direction == nil)
        #expect(throws: SyncError.self) { try GetCheckpointRequest(["id": "k", "direction": "sideways"]) }
        let set = SetCheckpointRequest(id: "k", value: ["seq": 3], direction: .pull)
        #expect(try SetCheckpointRequest(set.json).direction == .pull)
        #expect(try SetCheckpointRequest(set.json).caughtUp == false)
        #expect(try SetCheckpointRequest(SetCheckpointRequest(id: "k", value: [:], direction: .push, caughtUp: true).json).caughtUp)
        #expect(CheckpointValue(CheckpointValue(value: nil, holds: 9).json).holds == 9)
        #expect(CheckpointValue(["value": ["seq": 1]]).holds == nil)
    }
}
