import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Synchronization
import Testing
@testable import FerrySync

/// Relay suppression over in-memory meshes of continuous replicators: a write costs one
/// delivery per peer, partial meshes still relay, and a skip relying on a link that goes is
/// made good by offering the revision again.
@Suite(.timeLimit(.minutes(2))) struct RelaySuppressionTests {
    static let marker = String(repeating: "M", count: 600)

    /// Writes on `node`, then a local write on every other node: each relay of the first
    /// write would have gone out before that node's own write reached anyone.
    func writeAndFlush(_ net: MeshNetwork, on node: Int) async throws -> (DocumentID, RevisionID) {
        let id = docID("marked")
        let rev = try net.nodes[node].store.put(id, body: ["fill": .string(Self.marker)])
        try await waitUntil("the write everywhere", timeout: 20, every: .milliseconds(2)) { try net.everyoneHas(id, rev) }
        var flushes: [(DocumentID, RevisionID)] = []
        for (i, n) in net.nodes.enumerated() where i != node {
            let f = docID("flush-\(i)")
            flushes.append((f, try n.store.put(f, body: ["from": .int(Int64(i))])))
        }
        try await waitUntil("the flushes everywhere", timeout: 20, every: .milliseconds(2)) {
            try flushes.allSatisfy { try net.everyoneHas($0.0, $0.1) }
        }
        return (id, rev)
    }

    @Test func aWriteInAFullMeshCrossesEachLinkOnceAndIsNotRelayed() async throws {
        let net = try MeshNetwork(count: 4, marker: Self.marker)
        for i in 0..<4 { for j in (i + 1)..<4 { net.connect(i, j) } }
        try await net.viewsSettled()
        _ = try await writeAndFlush(net, on: 0)
        // Only the author's three deliveries carry the body; no relay does, not even one
        // answered "exists".
        #expect(net.tally.marked == 3)
        await net.stopAll()
    }

    @Test func withoutAMeshViewTheSameWriteIsRelayed() async throws {
        // The control for the test above: with views unknown nothing is skipped.
        let net = try MeshNetwork(count: 4, marker: Self.marker)
        for i in 0..<4 { for j in (i + 1)..<4 { net.connect(i, j) } }
        try await net.viewsSettled()
        for node in net.nodes { for other in net.nodes where other !== node { node.mesh.view.connectionClosed(other.id) } }
        _ = try await writeAndFlush(net, on: 0)
        #expect(net.tally.marked > 3)
        await net.stopAll()
    }

    @Test func aLineOfThreeNodesRelaysThroughTheMiddle() async throws {
        let net = try MeshNetwork(count: 3, marker: Self.marker)
        net.connect(0, 1)
        net.connect(1, 2)
        try await net.viewsSettled()
        _ = try await writeAndFlush(net, on: 0)
        #expect(net.tally.marked == 2)
        #expect(net.nodes[1].mesh.ledger.rememberedSkips(for: net.nodes[2].id) == 0)
        await net.stopAll()
    }

    @Test func aSkipIsOfferedAgainWhenTheTargetsLinkToTheSenderGoes() async throws {
        let net = try MeshNetwork(count: 3, marker: Self.marker)
        for i in 0..<3 { for j in (i + 1)..<3 { net.connect(i, j) } }
        try await net.viewsSettled()
        // Node 0's deliveries to node 2 are lost, though the link stays up.
        let body = Array(Self.marker.utf8)
        net.muted.set(.init(0, 2)) { bytes in bytes.count >= body.count && contains(Self.marker, in: bytes) }
        let id = docID("marked")
        let rev = try net.nodes[0].store.put(id, body: ["fill": .string(Self.marker)])
        let (one, two) = (net.nodes[1], net.nodes[2])
        // Node 1 got it from node 0 and skipped node 2, which reports a link to node 0.
        try await waitUntil("node 1 skips node 2", timeout: 20, every: .milliseconds(2)) {
            try one.store.document(id)?.revision == rev && one.mesh.ledger.rememberedSkips(for: two.id) == 1
        }
        #expect(try two.store.document(id) == nil)
        // The link 0–2 goes: node 2's next heartbeat no longer lists node 0, and node 1 offers the write again.
        await net.disconnect(0, 2)
        try await waitUntil("node 2 gets the write from node 1", timeout: 20, every: .milliseconds(2)) {
            try two.store.document(id)?.revision == rev
        }
        #expect(one.mesh.ledger.rememberedSkips(for: two.id) == 0)
        await net.stopAll()
    }

    @Test func aFullSkipMemoryStopsSkippingRatherThanLosingARevision() async throws {
        var limits = RelayLedger.Limits()
        limits.skipCapacity = 1
        let relay = MeshRelay(limits: limits)
        let held = PeerHeldRevisions()
        relay.peerReported("target", links: ["sender"])
        let (a, b) = (docID("a"), docID("b"))
        let rev = try RevisionID("1-" + String(repeating: "a", count: 64))
        relay.ledger.recordReceived(a, rev, from: "sender")
        relay.ledger.recordReceived(b, rev, from: "sender")
        #expect(relay.skipsRelay(of: a, leaves: [rev], to: "target", peerHeld: held))
        #expect(!relay.skipsRelay(of: b, leaves: [rev], to: "target", peerHeld: held))
        // Unknown senders, unknown views and the target's own revisions.
        #expect(!relay.skipsRelay(of: docID("c"), leaves: [rev], to: "target", peerHeld: held))
        #expect(!relay.skipsRelay(of: a, leaves: [rev], to: "stranger", peerHeld: held))
        relay.ledger.recordReceived(docID("d"), rev, from: "target")
        #expect(relay.skipsRelay(of: docID("d"), leaves: [rev], to: "target", peerHeld: held))
        // The link goes: the skipped document is due again.
        relay.peerReported("target", links: [])
        #expect(relay.ledger.takeReoffers(for: "target") == [a])
    }

    @Test func theSenderLedgerForgetsTheOldestBeyondItsCapacity() throws {
        var limits = RelayLedger.Limits()
        limits.receivedCapacity = 3
        let relay = MeshRelay(limits: limits)
        let rev = try RevisionID("1-" + String(repeating: "b", count: 64))
        for i in 0..<5 { relay.ledger.recordReceived(docID("d\(i)"), rev, from: "s\(i)") }
        #expect(relay.ledger.sender(of: docID("d0"), rev) == nil)
        #expect(relay.ledger.sender(of: docID("d1"), rev) == nil)
        #expect(relay.ledger.sender(of: docID("d4"), rev) == "s4")
    }
}
