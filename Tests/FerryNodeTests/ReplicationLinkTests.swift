import FerryCore
import Foundation
import FerryStore
import FerrySync
import IntegrationHarness
import Logging
import Testing

@testable import FerryNode

/// A replicator whose connector fails with `failure` until `open` is set, then serves from `remote`.
final class Switchboard: Sendable {
    let open = Locked(false)
    let attempts = Locked(0)
    let failure: SyncError
    let responder: ReplicationResponder
    init(_ failure: SyncError, remote: DocumentStore) {
        self.failure = failure
        var quiet = Logger(label: "test")
        quiet.logLevel = .critical
        responder = ReplicationResponder(store: remote, logger: quiet)
    }

    var connector: Replicator.Connector {
        {
            self.attempts.withLock { $0 += 1 }
            if !self.open.withLock({ $0 }) { throw self.failure }
            let (client, server) = InMemoryEndpoint.pair()
            Task { await self.responder.serve(server) }
            return client
        }
    }
}

@Suite(.timeLimit(.minutes(5))) struct ReplicationLinkTests {
    func link(_ board: Switchboard, clock: ManualClock) throws -> ReplicationLink {
        var quiet = Logger(label: "test")
        quiet.logLevel = .critical
        var rc = ReplicatorConfiguration()
        rc.continuous = true
        rc.maxAttemptWait = .seconds(30)
        let replicator = Replicator(store: try DocumentStore.inMemory(), connector: board.connector, configuration: rc, clock: clock, logger: quiet)
        return ReplicationLink(url: "wss://peer/ferry/sync", peerID: "peer", policy: nil, replicator: replicator, clock: clock, logger: quiet)
    }

    @Test func redialEndsTheRestartWaitAfterAPermanentErrorAtOnce() async throws {
        let clock = ManualClock()
        let board = Switchboard(.forbidden("not yet"), remote: try DocumentStore.inMemory())
        let link = try link(board, clock: clock)
        link.start()
        try await yieldUntil("the link waits to restart") {
            board.attempts.withLock { $0 } == 1 && clock.pendingDeadlines == [ReplicationLink.restartWait]
        }
        board.open.withLock { $0 = true }
        link.redial()  // the clock never moves
        try await yieldUntil("the replication is up") { link.replicator.status.activity == .idle }
        #expect(board.attempts.withLock { $0 } == 2)
        link.stop()
        await link.wait()
    }

    @Test func redialEndsTheReplicatorsBackoffAtOnce() async throws {
        let clock = ManualClock()
        let board = Switchboard(.disconnected("connection refused"), remote: try DocumentStore.inMemory())
        let link = try link(board, clock: clock)
        link.start()
        for n in 1...8 {
            try await yieldUntil("attempt \(n) waits") { board.attempts.withLock { $0 } == n && clock.pendingDeadlines.count == 1 }
            if n < 8 { clock.advance(by: clock.pendingDeadlines[0] - clock.now.offset) }
        }
        board.open.withLock { $0 = true }
        link.redial()
        try await yieldUntil("the replication is up") { link.replicator.status.activity == .idle }
        #expect(board.attempts.withLock { $0 } == 9)
        link.stop()
        await link.wait()
    }

    @Test func aReplicationStoppedByShutdownIsNotRestartedOrLoggedAsAnError() async throws {
        let clock = ManualClock()
        let board = Switchboard(.forbidden("x"), remote: try DocumentStore.inMemory())
        board.open.withLock { $0 = true }
        let link = try link(board, clock: clock)
        link.start()
        try await yieldUntil("the replication is up") { link.replicator.status.activity == .idle }
        // What graceful shutdown does to the replicator (the link itself is not stopped).
        link.replicator.stop()
        let finished = Locked(false)
        Task {
            await link.wait()
            finished.withLock { $0 = true }
        }
        try await yieldUntil("the link ends or waits to restart") {
            finished.withLock { $0 } || clock.pendingDeadlines.contains(ReplicationLink.restartWait)
        }
        #expect(finished.withLock { $0 }, "the link waits to restart a replication that shutdown stopped")
        #expect(board.attempts.withLock { $0 } == 1)
        link.stop()
    }
}

@Suite(.timeLimit(.minutes(5))) struct TrustChangeTests {
    /// A peer manager over a node that is not running (links dial a closed port and retry).
    func manager() throws -> (PeerManager, FerryNode, String) { try idlePeerManager() }

    @Test func trustingADiscoveredPeerDialsItAndAChangedPolicyStartsANewLinkWithIt() async throws {
        let (manager, node, dir) = try manager()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let other = String(repeating: "f", count: 64)  // higher than any real ID: this node dials
        manager.handle(.appeared(peer(other, port: 1)))
        func link() -> ReplicationLink? { manager.state.withLock { $0.peers[other]?.link } }
        #expect(link() == nil)  // not trusted: listed, not dialled
        try node.trust.add(.init(nodeID: other, name: nil, policy: .trusted, source: .api))
        manager.trustChanged()
        let first = try #require(link())
        #expect(first.policy == .trusted)
        // An update that leaves the policy as it is: the link stays (and is only told to redial).
        _ = try node.trust.update(other, .init(name: .some("renamed")))
        manager.trustChanged()
        #expect(link() === first)
        // A new policy: what the peer may write here changes at once, with a new link.
        let readOnly = PeerPolicy(read: .all, write: .none, mayDelete: false)
        _ = try node.trust.update(other, .init(read: .all, write: AccessRule.none, mayDelete: false))
        manager.trustChanged()
        let second = try #require(link())
        #expect(second !== first && second.policy == readOnly)
        // The replicator's policy also admits signed membership entries (validated instead).
        #expect(second.replicator.configuration.remotePolicy == ReplicationFactory.carryingMembership(readOnly))
        // No longer trusted: no link.
        try node.trust.remove(other)
        manager.trustChanged()
        #expect(link() == nil)
        await manager.stopAll()
    }
}

/// A peer manager over a node on loopback with ephemeral ports and no discovery that is not
/// running (its links dial closed ports and retry), the node, and its data directory.
func idlePeerManager(_ configure: (inout NodeConfiguration) -> Void = { _ in }) throws -> (PeerManager, FerryNode, String) {
    var c = NodeConfiguration()
    c.port = 0
    c.adminPort = 0
    c.couch.port = 0
    c.interface = "127.0.0.1"
    c.discovery = false
    configure(&c)
    let dir = NSTemporaryDirectory() + "ferry-node-\(UUID().uuidString)"
    let node = try FerryNode(configuration: c, dataDirectory: dir)
    var quiet = Logger(label: "test")
    quiet.logLevel = .critical
    return (node.makeParts(discovery: nil, logger: quiet).manager, node, dir)
}
