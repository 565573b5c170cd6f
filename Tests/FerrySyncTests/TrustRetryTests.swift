import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import Testing
@testable import FerrySync

/// The refusal a transport reports when the peer's listener does not trust this node.
let notTrusted = SyncError(domain: "transport", .notTrustedByPeer, message: "refused by the peer", isTransient: false)

/// A connector that fails with `failure` until `open` is set, then connects to `link`.
final class Gate: Sendable {
    let open = Locked(false)
    let attempts = Locked(0)
    let failure: SyncError
    init(_ failure: SyncError) { self.failure = failure }

    func connector(_ link: Link) -> Replicator.Connector {
        let inner = link.connector
        return {
            self.attempts.withLock { $0 += 1 }
            if !self.open.withLock({ $0 }) { throw self.failure }
            return try await inner()
        }
    }
}

/// A logger that prints nothing but critical lines.
func quietReplicatorLogger() -> Logger {
    var l = Logger(label: "ferry.sync.replicator")
    l.logLevel = .critical
    return l
}

@Suite(.timeLimit(.minutes(5))) struct TrustRetryTests {
    @Test func aContinuousReplicationRefusedAsNotTrustedRetriesWithinSecondsAndConnectsOnceTrusted() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try a.put(docID("note-1"), body: ["text": "from a"])
        let clock = ManualClock()
        let gate = Gate(notTrusted)
        var config = ReplicatorConfiguration()
        config.continuous = true
        config.maxAttemptWait = .seconds(30)
        let r = Replicator(
            store: a, connector: gate.connector(Link(to: b, clock: clock, quiet: true)), configuration: config, clock: clock,
            logger: quietReplicatorLogger())
        r.start()
        // Refused again and again: every wait stays within the short cap, however long it lasts.
        for n in 1...8 {
            try await yieldUntil("refusal \(n) waits") { gate.attempts.withLock { $0 } == n && clock.pendingDeadlines.count == 1 }
            let wait = clock.pendingDeadlines[0] - clock.now.offset
            #expect(wait <= config.maxNotTrustedRetryWait, "refusal \(n) waits \(wait)")
            #expect(wait > .zero)
            #expect(r.status.activity == .offline)
            #expect(r.status.error?.kind == .notTrustedByPeer)
            clock.advance(by: wait)
        }
        // The peer's operator trusts this node: the next attempt gets through.
        try await yieldUntil("refusal 9 waits") { gate.attempts.withLock { $0 } == 9 && clock.pendingDeadlines.count == 1 }
        gate.open.withLock { $0 = true }
        clock.advance(by: config.maxNotTrustedRetryWait)
        try await yieldUntil("note-1 arrives") { (try? b.document(docID("note-1"))) != nil }
        r.stop()
        await r.waitUntilStopped()
    }

    @Test func aOneShotReplicationRefusedAsNotTrustedStopsAtOnceWithThePermanentError() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let gate = Gate(notTrusted)
        let r = Replicator(store: a, connector: gate.connector(Link(to: b, quiet: true)), clock: ManualClock(), logger: quietReplicatorLogger())
        await r.run()
        #expect(gate.attempts.withLock { $0 } == 1)
        #expect(r.status.activity == .stopped)
        #expect(r.status.error?.isNotTrustedByPeer == true)
    }

    @Test func retryNowEndsABackoffWaitAtOnceAndResetsIt() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let clock = ManualClock()
        let gate = Gate(.disconnected("connection refused"))
        var config = ReplicatorConfiguration()
        config.continuous = true
        config.maxAttemptWait = .seconds(30)
        let r = Replicator(
            store: a, connector: gate.connector(Link(to: b, clock: clock, quiet: true)), configuration: config, clock: clock,
            logger: quietReplicatorLogger())
        r.start()
        // Let the backoff grow to its cap.
        for n in 1...10 {
            try await yieldUntil("attempt \(n) waits") { gate.attempts.withLock { $0 } == n && clock.pendingDeadlines.count == 1 }
            if n < 10 { clock.advance(by: clock.pendingDeadlines[0] - clock.now.offset) }
        }
        #expect(clock.pendingDeadlines[0] - clock.now.offset >= .seconds(15))
        gate.open.withLock { $0 = true }
        r.retryNow()  // without advancing the clock
        try await yieldUntil("the replicator connects") { r.status.activity == .idle }
        #expect(gate.attempts.withLock { $0 } == 11)
        r.stop()
        await r.waitUntilStopped()
    }

    @Test func aLiveConnectionsTrafficCountsWhileItIsUpNotOnlyWhenItCloses() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try a.put(docID("x"), body: ["v": 1])
        var config = ReplicatorConfiguration()
        config.continuous = true
        // One clock for both sides: the responder's watchdog must not close the link while
        // the replicator, whose heartbeats run on the same clock, idles.
        let clock = ManualClock()
        let link = Link(to: b, clock: clock, quiet: true)
        let r = Replicator(store: a, connector: link.connector, configuration: config, clock: clock, logger: quietReplicatorLogger())
        r.start()
        try await yieldUntil("x is pushed and the link idles") { r.summary.pushed == 1 && r.status.activity == .idle }
        let first = r.summary
        #expect(first.bytesSent > 0 && first.bytesReceived > 0)
        try a.put(docID("y"), body: ["v": 2])
        try await yieldUntil("y is pushed") { r.summary.pushed == 2 }
        #expect(r.summary.bytesSent > first.bytesSent)
        // The responder's side of the same connection counts live too.
        let session = try #require(link.responder.sessions.first)
        #expect(session.summary.pulled == 2)
        #expect(session.summary.bytesReceived > 0 && session.summary.bytesSent > 0)
        r.stop()
        await r.waitUntilStopped()
        // Closing moves the traffic into the totals without counting it twice.
        #expect(r.summary.bytesSent >= first.bytesSent)
        try await yieldUntil("the session ends") { link.responder.sessions.isEmpty }
    }

    @Test func theResponderListsEachSessionWithItsProvenPeerID() async throws {
        let b = try DocumentStore.inMemory()
        var quiet = Logger(label: "quiet")
        quiet.logLevel = .critical
        let responder = ReplicationResponder(store: b, logger: quiet)
        let (client, server) = InMemoryEndpoint.pair()
        let serving = Task { await responder.serve(server, authenticatedPeer: "proven-id") }
        let connection = Connection(endpoint: client)
        connection.start()
        _ = try await connection.requestJSON(
            SyncProtocol.Profile.hello, ["nodeID": "claimed-id", "database": "x", "protocol": [1], "features": []])
        let sessions = responder.sessions
        #expect(sessions.count == 1)
        #expect(sessions.first?.peerID == "proven-id" && sessions.first?.authenticated == true)
        await connection.close()
        await serving.value
        #expect(responder.sessions.isEmpty)
    }
}

@Suite(.timeLimit(.minutes(5))) struct PeerTextInLogsTests {
    static let forged = "x\n2026-11-24T04:00:00+0000 critical ferry.node : forged\u{1B}[2J"

    func expectClean(_ log: CapturedLog, mentioning needle: String) {
        let lines = log.lines
        #expect(lines.contains { $0.contains(needle) }, "\(lines)")
        for line in lines {
            #expect(!line.contains("\n") && !line.contains("\u{1B}"), "raw peer text in: \(line)")
        }
    }

    @Test func aPeersRequestProfileAndClaimedIDAreEscapedInTheResponderLog() async throws {
        let log = CapturedLog()
        let responder = ReplicationResponder(store: try DocumentStore.inMemory(), logger: log.logger)
        let session = ResponderSession(responder: responder, authenticatedPeer: nil)
        let hello = (["nodeID": .string(Self.forged), "protocol": [1]] as JSON).canonicalBytes
        _ = await session.handle(Message(kind: .request, number: 1, properties: [("Profile", SyncProtocol.Profile.hello)], body: hello))
        _ = await session.handle(Message(kind: .request, number: 2, properties: [("Profile", Self.forged)], body: []))
        expectClean(log, mentioning: #"forged\u{1B}[2J"#)
    }

    @Test func aPeersErrorReasonIsEscapedInTheReplicatorLog() async throws {
        let log = CapturedLog()
        let gate = Gate(SyncError(.forbidden, message: Self.forged, isTransient: false))
        let r = Replicator(
            store: try DocumentStore.inMemory(), connector: gate.connector(Link(to: try DocumentStore.inMemory(), quiet: true)),
            clock: ManualClock(), logger: log.logger)
        await r.run()
        expectClean(log, mentioning: #"forged\u{1B}[2J"#)
    }
}
