import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import IntegrationHarness
import Testing

@testable import FerryNode

/// The node wires one mesh view and relay ledger into all its links: over pinned TLS, each
/// node learns its peers' links from their heartbeats, and a write in a full mesh of three
/// is delivered by its author and not relayed.
@Suite(.serialized, .timeLimit(.minutes(5))) struct MeshLinkTests {
    @Test func nodesInAFullMeshLearnEachOthersLinksAndDoNotRelayAWrite() async throws {
        let dirs = (0..<3).map { _ in NSTemporaryDirectory() + "ferry-node-\(UUID().uuidString)" }
        var ids: [String] = []
        for (i, dir) in dirs.enumerated() {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            ids.append(try NodeIdentity.loadOrCreate(directory: dir, name: "n\(i)").nodeID)
        }
        // n0 dials n1 and n2, n1 dials n2: one link per pair.
        var nodes: [InProcessNode] = []
        for i in (0..<3).reversed() {
            let later = nodes.map { NodeConfiguration.StaticPeer(url: $0.ready.url, nodeID: $0.ready.nodeID) }
            let trusted = ids.enumerated().filter { $0.offset != i }.map { NodeConfiguration.TrustEntry(nodeID: $0.element, name: "n\($0.offset)") }
            nodes.insert(
                try await InProcessNode.start(
                    {
                        $0.peers = later
                        $0.trust = trusted
                        $0.discovery = false
                    }, directory: dirs[i]), at: 0)
        }
        let (n0, n1, n2) = (nodes[0], nodes[1], nodes[2])
        try await waitUntil("every node knows every link", timeout: 30, every: .milliseconds(20)) {
            for (i, n) in nodes.enumerated() {
                let others = Set(ids.enumerated().filter { $0.offset != i }.map(\.element))
                guard n.node.mesh.view.localLinks == others else { return false }
                for (j, other) in ids.enumerated() where j != i {
                    let theirs = Set(ids.enumerated().filter { $0.offset != j }.map(\.element))
                    guard n.node.mesh.view.links(of: other) == theirs else { return false }
                }
            }
            return true
        }
        let id = try DocumentID("written")
        let rev = try n0.node.store.put(id, body: ["v": 1])
        try await waitUntil("the write everywhere", timeout: 30, every: .milliseconds(20)) {
            try n1.node.store.document(id)?.revision == rev && n2.node.store.document(id)?.revision == rev
        }
        // Each got it from n0, and did not pass it on to the other, which is linked to n0.
        #expect(n1.node.mesh.ledger.sender(of: id, rev) == ids[0])
        #expect(n2.node.mesh.ledger.sender(of: id, rev) == ids[0])
        try await waitUntil("n1 skipped n2 and n2 skipped n1", timeout: 30, every: .milliseconds(20)) {
            n1.node.mesh.ledger.rememberedSkips(for: ids[2]) == 1 && n2.node.mesh.ledger.rememberedSkips(for: ids[1]) == 1
        }
        for n in nodes { await n.stop() }
    }
}
