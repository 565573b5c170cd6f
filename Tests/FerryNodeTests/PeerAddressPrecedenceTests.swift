import FerryCore
import FerryDiscovery
import FerrySync
import Foundation
import Logging
import Testing

@testable import FerryNode

/// Where a peer is dialled when its static URL, DNS-SD and its signed address record disagree:
/// a peer manager over a node that is not running (its links dial closed ports and retry).
@Suite(.serialized, .timeLimit(.minutes(5))) struct PeerAddressPrecedenceTests {
    func manager(_ configure: (inout NodeConfiguration) -> Void = { _ in }) throws -> (PeerManager, FerryNode, String) {
        try idlePeerManager(configure)
    }

    func url(_ port: Int) -> String { "wss://127.0.0.1:\(port)/ferry/sync" }

    func linkURL(_ manager: PeerManager, _ id: String) -> String? { manager.state.withLock { $0.peers[id]?.link?.url } }

    @Test func aMembersNewerAddressRecordIsDialledBeforeItsStaticURL() async throws {
        // Lower than any real ID: as a member it would dial this node, but a static peer is dialled anyway.
        let lower = String(repeating: "0", count: 64)
        let (manager, _, dir) = try manager {
            $0.peers = [.init(url: url(4985), nodeID: lower)]
            $0.trust = [.init(nodeID: lower)]
        }
        defer { try? FileManager.default.removeItem(atPath: dir) }
        manager.addStaticPeers()
        #expect(linkURL(manager, lower) == url(4985))
        // This node joins the group: the member's entry says where it listened then.
        manager.memberAddressesChanged([lower: url(4985)])
        #expect(linkURL(manager, lower) == url(4985))
        // It moves, and its signed address record says so.
        manager.memberAddressesChanged([lower: url(4995)])
        #expect(linkURL(manager, lower) == url(4995))
        #expect(manager.dialCandidates(lower) == [url(4995), url(4985)])
        await manager.stopAll()
    }

    @Test func discoveryNeverOverridesANewerRecordWithAnOlderPort() async throws {
        let other = String(repeating: "f", count: 64)  // higher than any real ID: this node dials
        let (manager, _, dir) = try manager { $0.trust = [.init(nodeID: other)] }
        defer { try? FileManager.default.removeItem(atPath: dir) }
        manager.handle(.appeared(peer(other, port: 1111)))
        manager.memberAddressesChanged([other: url(1111)])
        #expect(linkURL(manager, other) == url(1111))
        // It restarts on 2222 and its record arrives while DNS-SD still holds 1111.
        manager.memberAddressesChanged([other: url(2222)])
        #expect(linkURL(manager, other) == url(2222))
        // A cached answer hands back the old port: the record's is still dialled first.
        manager.handle(.disappeared(instance: peer(other, port: 1111).instance))
        manager.handle(.appeared(peer(other, port: 1111)))
        #expect(linkURL(manager, other) == url(2222))
        #expect(manager.dialCandidates(other) == [url(2222), url(1111)])
        // DNS-SD sees it somewhere no record named yet: the freshest evidence, dialled first.
        manager.handle(.appeared(peer(other, port: 3333)))
        #expect(linkURL(manager, other) == url(3333))
        #expect(manager.dialCandidates(other) == [url(3333), url(2222)])
        await manager.stopAll()
    }

    @Test func aPeerThatWentAwayFromDNSSDIsDialledWhereItsRecordSaysFirst() async throws {
        let other = String(repeating: "f", count: 64)
        let (manager, _, dir) = try manager { $0.trust = [.init(nodeID: other)] }
        defer { try? FileManager.default.removeItem(atPath: dir) }
        manager.memberAddressesChanged([other: url(2222)])
        manager.handle(.appeared(peer(other, port: 1111)))
        #expect(linkURL(manager, other) == url(1111))
        manager.handle(.disappeared(instance: peer(other, port: 1111).instance))
        #expect(linkURL(manager, other) == url(2222))
        #expect(manager.dialCandidates(other) == [url(2222), url(1111)])
        await manager.stopAll()
    }

    @Test func aMemberListsEveryOtherMemberOfflineWhetherOrNotItDialsThem() async throws {
        let lower = String(repeating: "0", count: 64)  // it dials this node, not the other way
        let higher = String(repeating: "f", count: 64)
        let (manager, _, dir) = try manager { $0.trust = [.init(nodeID: lower), .init(nodeID: higher)] }
        defer { try? FileManager.default.removeItem(atPath: dir) }
        manager.memberAddressesChanged([lower: url(4985), higher: url(4986)])
        let listed = Dictionary(uniqueKeysWithValues: manager.peers.map { ($0.nodeID, $0) })
        let l = try #require(listed[lower], "a member that dials this node is listed before it connects")
        #expect(!l.connected && !l.dialled && l.sources.contains(.group) && l.url == nil)
        let h = try #require(listed[higher])
        #expect(!h.connected && h.dialled && h.sources.contains(.group))
        await manager.stopAll()
    }

    @Test func aMemberThatLeftIsNoLongerListedUnlessKnownOtherwise() async throws {
        let lower = String(repeating: "0", count: 64)
        let higher = String(repeating: "f", count: 64)
        let (manager, _, dir) = try manager { $0.trust = [.init(nodeID: lower), .init(nodeID: higher)] }
        defer { try? FileManager.default.removeItem(atPath: dir) }
        manager.memberAddressesChanged([lower: url(4985), higher: url(4986)])
        manager.handle(.appeared(peer(higher, port: 4987)))
        manager.memberAddressesChanged([:])
        let listed = Dictionary(uniqueKeysWithValues: manager.peers.map { ($0.nodeID, $0) })
        #expect(listed[lower] == nil)
        // DNS-SD still sees the other: listed, and dialled there.
        #expect(listed[higher]?.sources == [.dnsSD] && listed[higher]?.url == "wss://127.0.0.1:4987/ferry/sync")
        await manager.stopAll()
    }

    @Test func aFailedDialFallsBackToTheNextCandidateAndEveryCandidateIsPinned() async throws {
        let (manager, node, dir) = try manager()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let b = try await InProcessNode.start { $0.trust = [.init(nodeID: node.identity.nodeID)] }
        let closed = url(1)  // nothing listens there: refused at once
        let connect = manager.dialler(url: closed, peerID: b.ready.nodeID, candidates: { [closed, b.ready.url] })
        let endpoint = try await connect()
        await endpoint.close(error: nil)
        // The same URLs for another ID: no candidate is that node, so the dial fails.
        let other = String(repeating: "e", count: 64)
        let wrong = manager.dialler(url: closed, peerID: other, candidates: { [closed, b.ready.url] })
        await #expect(throws: (any Error).self) { _ = try await wrong() }
        await b.stop()
    }
}
