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
    /// `ward`, when given, is set on every document written (for meshes under rules).
    func writeAndFlush(_ net: MeshNetwork, on node: Int, ward: String? = nil) async throws -> (DocumentID, RevisionID) {
        let id = docID("marked")
        let wardField: [String: JSON] = ward.map { ["ward": .string($0)] } ?? [:]
        let rev = try net.nodes[node].store.put(id, body: .object(["fill": .string(Self.marker)].merging(wardField) { $1 }))
        try await waitUntil("the write everywhere", timeout: 20, every: .milliseconds(2)) { try net.everyoneHas(id, rev) }
        var flushes: [(DocumentID, RevisionID)] = []
        for (i, n) in net.nodes.enumerated() where i != node {
            let f = docID("flush-\(i)")
            flushes.append((f, try n.store.put(f, body: .object(["from": .int(Int64(i))].merging(wardField) { $1 }))))
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

    /// The author's deliveries to the target are lost while their link stays up; the relay
    /// skipped the target. Author 0: the relay (1) dials the target (2) and offers again by
    /// revsDiff; author 2: the target (0) dials the relay, whose changes feed offers again.
    @Test(arguments: [(0, 2), (2, 0)])
    func aSkipIsOfferedAgainWhenTheTargetsLinkToTheSenderGoes(author: Int, target: Int) async throws {
        let net = try MeshNetwork(count: 3, marker: Self.marker)
        for i in 0..<3 { for j in (i + 1)..<3 { net.connect(i, j) } }
        try await net.viewsSettled()
        let body = Array(Self.marker.utf8)
        net.muted.set(.init(author, target)) { bytes in bytes.count >= body.count && contains(Self.marker, in: bytes) }
        let id = docID("marked")
        let rev = try net.nodes[author].store.put(id, body: ["fill": .string(Self.marker)])
        let (relay, lacking) = (net.nodes[1], net.nodes[target])
        // The relay got it from the author and skipped the target, which reports a link to the author.
        try await waitUntil("the relay skips the target", timeout: 20, every: .milliseconds(2)) {
            try relay.store.document(id)?.revision == rev && relay.mesh.ledger.rememberedSkips(for: lacking.id) == 1
        }
        #expect(try lacking.store.document(id) == nil)
        // The author's link to the target goes: the target's next heartbeat no longer lists
        // the author, and the relay offers the write again.
        await net.disconnect(author, target)
        try await waitUntil("the target gets the write from the relay", timeout: 20, every: .milliseconds(2)) {
            try lacking.store.document(id)?.revision == rev
        }
        #expect(relay.mesh.ledger.rememberedSkips(for: lacking.id) == 0)
        await net.stopAll()
    }

    /// Policies under one version of the group's access rules, as `GroupAccess.restrict` makes
    /// them: a peer with no wards (`nil`) reads, writes and deletes everything (a supervisor),
    /// the others read and write the wards they are given, by a selector on `ward`.
    static func wardPolicies(version: @escaping @Sendable (Int) -> String = { _ in "v1" }, wards: @escaping @Sendable (Int) -> [String]?)
        -> @Sendable (Int, Int) -> PeerPolicy
    {
        { judge, peer in
            let grant = wards(peer).map { w in
                AccessGrant(clauses: [try! AccessClause(selector: ["ward": ["$in": .array(w.map(JSON.string))]])])
            }
            return PeerPolicy(
                read: AccessRule.all.restricted(by: grant), write: AccessRule.all.restricted(by: grant), mayDelete: true,
                groupRules: GroupRulesApplied(version: version(judge), unnarrowed: true))
        }
    }

    @Test func aMeshWhoseLinksFollowTheSameGroupRulesDoesNotRelay() async throws {
        // Node 0 supervises; the others read and write both wards through a selector, so no
        // link is full, but every half follows the same rules.
        let net = try MeshNetwork(count: 4, marker: Self.marker, policy: Self.wardPolicies { $0 == 0 ? nil : ["a", "b"] })
        for i in 0..<4 { for j in (i + 1)..<4 { net.connect(i, j) } }
        try await net.viewsSettled()
        _ = try await writeAndFlush(net, on: 1, ward: "a")
        #expect(net.tally.marked == 3)
        await net.stopAll()
    }

    @Test func aNodeJudgingByOtherRulesNeitherLinksNorIsSkipped() async throws {
        // Node 3 holds another version of the rules: no link of its counts, and the write
        // reaches it relayed as well as from its author.
        let net = try MeshNetwork(
            count: 4, marker: Self.marker, policy: Self.wardPolicies(version: { $0 == 3 ? "v2" : "v1" }) { $0 == 0 ? nil : ["a", "b"] })
        for i in 0..<4 { for j in (i + 1)..<4 { net.connect(i, j) } }
        let ids = net.nodes.map(\.id)
        try await waitUntil("the views settle", timeout: 20, every: .milliseconds(2)) {
            (0..<3).allSatisfy { i in net.nodes[i].mesh.view.localLinks == Set(ids[0..<3]).subtracting([ids[i]]) }
                && net.nodes[3].mesh.view.localLinks.isEmpty
                && (0..<3).allSatisfy { i in net.nodes[i].mesh.view.links(of: ids[3]) == [] }
        }
        _ = try await writeAndFlush(net, on: 1, ward: "a")
        #expect(net.tally.marked > 3)
        await net.stopAll()
    }

    @Test func aRestrictedReaderIsNeverNamedADocumentItMayNotRead() async throws {
        // Node 3 supervises; 0 and 1 read ward a, 2 ward b, all linked under the same rules.
        // Node 3 gets 2's ward-b write, and 0 and 1 report links to 2: the relay is not
        // skipped for them (which would name it in a skip report), it is dropped.
        let net = try MeshNetwork(count: 4, marker: "hidden-b", policy: Self.wardPolicies { [0: ["a"], 1: ["a"], 2: ["b"]][$0] })
        for i in 0..<4 { for j in (i + 1)..<4 { net.connect(i, j) } }
        try await net.viewsSettled()
        let hidden = docID("hidden-b")
        let rev = try net.nodes[2].store.put(hidden, body: ["ward": "b"])
        try await waitUntil("the supervisor has it", timeout: 20, every: .milliseconds(2)) { try net.nodes[3].store.document(hidden)?.revision == rev }
        // A later ward-a write of the supervisor's reaching 0 and 1: its feed to them passed the hidden one.
        let later = docID("later-a")
        let laterRev = try net.nodes[3].store.put(later, body: ["ward": "a"])
        try await waitUntil("the ward-a stations have the later write", timeout: 20, every: .milliseconds(2)) {
            try [0, 1].allSatisfy { try net.nodes[$0].store.document(later)?.revision == laterRev }
        }
        #expect(try net.nodes[0].store.document(hidden) == nil)
        #expect(try net.nodes[1].store.document(hidden) == nil)
        #expect(Set(net.tally.markedOn.keys) == [MeshNetwork.Pair(2, 3)])
        await net.stopAll()
    }

    @Test func aReportIsReliedOnOnlyUnderTheSameRules() throws {
        let relay = MeshRelay()
        let held = PeerHeldRevisions()
        relay.peerReported("target", links: ["sender"], rules: "v1")
        let rev = try RevisionID("1-" + String(repeating: "c", count: 64))
        for d in ["a", "b", "c"] { relay.ledger.recordReceived(docID(d), rev, from: "sender") }
        #expect(relay.skipsRelay(of: docID("a"), leaves: [rev], to: "target", peerHeld: held, rules: "v1"))
        #expect(!relay.skipsRelay(of: docID("b"), leaves: [rev], to: "target", peerHeld: held, rules: "v2"))
        #expect(!relay.skipsRelay(of: docID("b"), leaves: [rev], to: "target", peerHeld: held))
        // The target now judges by other rules: what was skipped on its links is due again.
        relay.peerReported("target", links: ["sender"], rules: "v2")
        #expect(relay.ledger.takeReoffers(for: "target") == [docID("a")])
        #expect(relay.skipsRelay(of: docID("c"), leaves: [rev], to: "target", peerHeld: held, rules: "v2"))
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
