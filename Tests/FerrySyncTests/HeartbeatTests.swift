import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import Testing
@testable import FerrySync

/// Two connections over an in-memory pair whose links can be cut, with a count of the
/// heartbeats each side receives.
final class HeartbeatPair: Sendable {
    let clock = ManualClock()
    let cut = Switch()
    let heartbeatsToA = Counter()
    let heartbeatsToB = Counter()
    let a: Connection
    let b: Connection

    init() {
        let cut = self.cut
        func deliver(_ counter: Counter) -> @Sendable ([UInt8]) async -> [[UInt8]] {
            { bytes in
                if cut.isOn { return [] }
                if (try? Message(decoding: bytes))?.profile == SyncProtocol.Profile.heartbeat { counter.increment() }
                return [bytes]
            }
        }
        let (ea, eb) = InMemoryEndpoint.pair(faultsA: .init(deliver: deliver(heartbeatsToB)), faultsB: .init(deliver: deliver(heartbeatsToA)))
        a = Connection(endpoint: ea)
        b = Connection(endpoint: eb, handler: { request in Message(kind: .response, number: request.number) })
        a.start()
        b.start()
    }

    func plan(_ peer: String) -> LivenessPlan {
        var quiet = Logger(label: "ferry.test")
        quiet.logLevel = .critical
        return LivenessPlan(settings: Liveness(), clock: clock, logger: quiet, peerID: peer, mesh: nil, localFull: false)
    }

    func startBoth() {
        a.startLiveness(plan("b"))
        b.startLiveness(plan("a"))
    }

    /// Waits until both watchdogs sleep (or their connections closed) with the clock at its current time.
    func settled() async throws {
        try await yieldUntil("both watchdogs wait") {
            let now = clock.now.offset
            let sleeping = clock.pendingDeadlines.filter { $0 > now }.count
            let closed = [a, b].filter { $0.closeReason != nil }.count
            return sleeping + closed >= 2
        }
    }
}

/// A flag tests flip while tasks read it.
final class Switch: Sendable {
    private let value = Locked(false)
    var isOn: Bool { value.withLock { $0 } }
    func turn(on: Bool) { value.withLock { $0 = on } }
}

@Suite(.timeLimit(.minutes(2))) struct HeartbeatTests {
    @Test func anIdleConnectionSendsAHeartbeatEachIntervalAndABusyOneSendsNone() async throws {
        let pair = HeartbeatPair()
        pair.startBoth()
        // The first heartbeat goes at once (it would carry the links).
        try await yieldUntil("first heartbeats") { pair.heartbeatsToA.current == 1 && pair.heartbeatsToB.current == 1 }
        try await pair.settled()
        for second in 1...3 {
            pair.clock.advance(by: .seconds(1))
            try await yieldUntil("heartbeat \(second + 1)") {
                pair.heartbeatsToA.current == second + 1 && pair.heartbeatsToB.current == second + 1
            }
            try await pair.settled()
        }
        // Busy: a request and its reply every half interval, for four intervals.
        for _ in 0..<8 {
            _ = try await pair.a.request("echo")
            pair.clock.advance(by: .milliseconds(500))
            try await pair.settled()
        }
        #expect(pair.heartbeatsToA.current == 4)
        #expect(pair.heartbeatsToB.current == 4)
        #expect(pair.a.closeReason == nil && pair.b.closeReason == nil)
    }

    @Test func silencePastTheLimitClosesBothSidesWithATransientPeerSilentError() async throws {
        let pair = HeartbeatPair()
        pair.startBoth()
        try await yieldUntil("first heartbeats") { pair.heartbeatsToA.current == 1 && pair.heartbeatsToB.current == 1 }
        try await pair.settled()
        pair.cut.turn(on: true)
        let waiting = Task { try await pair.a.request("never-answered") }
        for _ in 1...3 {
            pair.clock.advance(by: .seconds(1))
            try await pair.settled()
        }
        #expect(pair.a.closeReason == nil && pair.b.closeReason == nil)
        pair.clock.advance(by: .seconds(1))
        try await yieldUntil("both sides closed") { pair.a.closeReason != nil && pair.b.closeReason != nil }
        for side in [pair.a, pair.b] {
            let reason = try #require(side.closeReason)
            #expect(reason.kind == .peerSilent)
            #expect(reason.isTransient)
        }
        // A request waiting on the silent peer fails with the same error (the replicator retries it).
        await #expect(throws: SyncError.self) { _ = try await waiting.value }
        do { _ = try await waiting.value } catch { #expect(SyncError.from(error).kind == .peerSilent) }
    }

    @Test func aWatchdogWokenLateByAStarvedProcessGivesThePeerAnIntervalBeforeBlamingIt() async throws {
        let pair = HeartbeatPair()
        pair.startBoth()
        try await yieldUntil("first heartbeats") { pair.heartbeatsToA.current == 1 && pair.heartbeatsToB.current == 1 }
        try await pair.settled()
        pair.cut.turn(on: true)
        // One jump far past the limit: the watchdogs wake 10 s late, as in a process that got no CPU.
        pair.clock.advance(by: .seconds(10))
        try await pair.settled()
        #expect(pair.a.closeReason == nil && pair.b.closeReason == nil)
        // On time from now on, the silence still ends the link within the limit.
        for _ in 1...4 {
            pair.clock.advance(by: .seconds(1))
            try await pair.settled()
        }
        try await yieldUntil("both sides closed") { pair.a.closeReason != nil && pair.b.closeReason != nil }
        #expect(pair.a.closeReason?.kind == .peerSilent)
    }

    @Test func aMalformedHeartbeatClosesTheConnectionWithAProtocolError() async throws {
        let (ea, eb) = InMemoryEndpoint.pair()
        let b = Connection(endpoint: eb)
        b.start()
        b.armLiveness(HeartbeatPair().plan("a"))
        let bad = Message(
            kind: .request, number: 1, flags: Message.flagNoReply, properties: [("Profile", SyncProtocol.Profile.heartbeat)],
            body: Array(#"{"links":"everyone"}"#.utf8))
        try await ea.send(bad.encoded())
        try await yieldUntil("closed") { b.closeReason != nil }
        #expect(b.closeReason?.code == "protocol_error")
    }

    @Test func aHalfFollowingTheGroupsRulesMakesALinkOnlyWithAHalfFollowingTheSameVersion() throws {
        func link(local: (full: Bool, rules: String?, grant: Bool), peer: HeartbeatMessage) throws -> Bool {
            var plan = HeartbeatPair().plan("b")
            (plan.localFull, plan.rules, plan.localGrant) = local
            var state = LivenessState(plan: plan)
            // As received: the peer's stated half, decoded from its wire form.
            let decoded = try HeartbeatMessage(body: peer.bytes)
            state.peerFull = decoded.full ?? false
            state.peerGrant = decoded.grant ? decoded.rules : nil
            return state.countsAsLink
        }
        func peer(full: Bool, rules: String?, grant: Bool) -> HeartbeatMessage {
            var m = HeartbeatMessage(links: [], full: full)
            (m.rules, m.grant) = (rules, grant)
            return m
        }
        #expect(try link(local: (true, nil, false), peer: peer(full: true, rules: nil, grant: false)))
        #expect(try link(local: (false, "v1", true), peer: peer(full: false, rules: "v1", grant: true)))
        // A supervisor's half is full and follows the rules.
        #expect(try link(local: (true, "v1", true), peer: peer(full: false, rules: "v1", grant: true)))
        #expect(try !link(local: (false, "v1", true), peer: peer(full: false, rules: "v2", grant: true)))
        #expect(try !link(local: (false, "v1", true), peer: peer(full: false, rules: "v1", grant: false)))
        #expect(try !link(local: (false, "v1", false), peer: peer(full: false, rules: "v1", grant: true)))
        #expect(try !link(local: (true, nil, false), peer: peer(full: false, rules: "v1", grant: true)))
        // A peer that predates rules in heartbeats says `full` alone.
        #expect(try !link(local: (false, "v1", true), peer: HeartbeatMessage(links: [], full: false)))
    }

    @Test func aWithdrawnLinkIsLeftOutOfOneHeartbeatAndWhatWasSkippedOnItIsOfferedAgain() async throws {
        // A has a link to S; B skipped relaying a revision to A because of it. A refuses a
        // revision from S and withdraws the link for one heartbeat.
        let pair = HeartbeatPair()
        let (meshA, meshB) = (MeshRelay(), MeshRelay())
        meshA.view.linkUp("s")
        func plan(_ peer: String, _ mesh: MeshRelay) -> LivenessPlan {
            var p = pair.plan(peer)
            p.mesh = mesh
            return p
        }
        pair.a.startLiveness(plan("b", meshA))
        pair.b.startLiveness(plan("a", meshB))
        try await yieldUntil("B knows A's links") { meshB.view.links(of: "a") == ["s"] }
        let rev = try RevisionID("1-" + String(repeating: "d", count: 64))
        meshB.ledger.recordReceived(docID("p"), rev, from: "s")
        #expect(meshB.relay(skips: docID("p"), rev, to: "a"))
        meshA.view.withdrawMomentarily("s")
        try await yieldUntil("the skip is due again") { meshB.ledger.hasReoffers(for: "a") }
        #expect(meshB.ledger.takeReoffers(for: "a") == [docID("p")])
        try await yieldUntil("the link is listed again") { meshB.view.links(of: "a") == ["s"] }
        // A peer it has no link to is not withdrawn: nothing is sent.
        meshA.view.withdrawMomentarily("stranger")
        #expect(meshA.view.withdrawals(after: 1).peers.isEmpty)
    }

    @Test(arguments: [#"{"rules":7}"#, #"{"rules":""}"#, #"{"grant":"yes"}"#])
    func aHeartbeatWithMalformedRulesIsAProtocolError(_ body: String) {
        #expect(throws: SyncError.self) { try HeartbeatMessage(body: Array(body.utf8)) }
    }

    /// A replicator's connection to a responder, and whether heartbeats run on it.
    func handshake(client: Liveness, responder: Liveness, clock: ManualClock) async throws -> (Connection, RemoteIdentity) {
        var options = ReplicationResponder.Options()
        options.liveness = responder
        let server = ReplicationResponder(store: try DocumentStore.inMemory(), options: options, clock: clock)
        let (ea, eb) = InMemoryEndpoint.pair()
        Task { await server.serve(eb) }
        let connection = Connection(endpoint: ea)
        connection.start()
        let remote = try await FerryRemote.open(
            connection, nodeID: "client", localDatabase: "db", inlineWanted: false, features: SyncProtocol.features(liveness: client))
        var config = ReplicatorConfiguration()
        config.wiring.liveness = client
        var quiet = Logger(label: "ferry.test")
        quiet.logLevel = .critical
        let context = ReplicationContext(store: try DocumentStore.inMemory(), configuration: config, clock: clock, logger: quiet)
        context.startLiveness(on: connection, remote: remote.identity)
        return (connection, remote.identity)
    }

    @Test func aPeerWithoutTheHeartbeatFeatureGetsNoWatchdogEitherWay() async throws {
        var off = Liveness()
        off.enabled = false
        for (client, responder) in [(off, Liveness()), (Liveness(), off)] {
            let clock = ManualClock()
            let (connection, identity) = try await handshake(client: client, responder: responder, clock: clock)
            #expect(!identity.heartbeat)
            #expect(!connection.heartbeatsRunning)
            // Long silence on an idle connection is no reason to close it.
            let received = connection.counters.withLock { $0.messagesReceived }
            for _ in 0..<10 { clock.advance(by: .seconds(1)) }
            for _ in 0..<1000 { await Task.yield() }
            #expect(connection.closeReason == nil)
            #expect(connection.counters.withLock { $0.messagesReceived } == received)
            await connection.close()
        }
        // Both offering: heartbeats run, and the responder's first one arrives.
        let clock = ManualClock()
        let (connection, identity) = try await handshake(client: Liveness(), responder: Liveness(), clock: clock)
        #expect(identity.heartbeat)
        #expect(connection.heartbeatsRunning)
        try await yieldUntil("the responder's first heartbeat") { connection.counters.withLock { $0.messagesReceived } >= 2 }
        await connection.close()
    }
}

extension MeshRelay {
    /// Whether this node skips relaying `rev` of `id` to `target` (recording the skip).
    func relay(skips id: DocumentID, _ rev: RevisionID, to target: String) -> Bool {
        skipsRelay(of: id, leaves: [rev], to: target, peerHeld: PeerHeldRevisions())
    }
}
