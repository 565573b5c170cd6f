import FerryCore
import FerryDiscovery
import FerryStore
import FerryTransport
import Foundation
import IntegrationHarness
import Testing

@testable import FerryNode
@testable import FerrySync

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A FerryNode run in-process with a scripted discovery; stopped by cancelling its task.
struct InProcessNode {
    let node: FerryNode
    let discovery: StaticDiscovery
    let task: Task<Void, any Error>
    let ready: FerryNode.Ready
    let directory: String

    static func start(
        _ configure: (inout NodeConfiguration) -> Void, peers: [DiscoveredPeer] = [],
        directory: String = NSTemporaryDirectory() + "ferry-node-\(UUID().uuidString)"
    ) async throws -> InProcessNode {
        var c = NodeConfiguration()
        c.port = 0
        c.adminPort = 0
        c.couch.port = 0
        c.interface = "127.0.0.1"
        c.name = "test"
        configure(&c)
        let dir = directory
        let node = try FerryNode(configuration: c, dataDirectory: dir)
        let discovery = StaticDiscovery(peers: peers)
        let (stream, continuation) = AsyncStream<FerryNode.Ready>.makeStream()
        let task = Task { try await node.run(discovery: discovery) { continuation.yield($0) } }
        var it = stream.makeAsyncIterator()
        guard let ready = await it.next() else { throw NodeError.badConfiguration("node never became ready") }
        return InProcessNode(node: node, discovery: discovery, task: task, ready: ready, directory: dir)
    }

    /// The node's admin API (the harness's client; this module has its own router-level `AdminClient`).
    var admin: IntegrationHarness.AdminClient { .init(base: ready.adminURL, host: nil, key: node.adminKey.value) }

    func get(_ path: String) async throws -> JSON { try JSON.parse(try await request("GET", path).text) }

    /// One admin request with the node's key (and a JSON body when given).
    func request(_ method: String, _ path: String, body: String? = nil, headers: [String: String] = [:]) async throws
        -> IntegrationHarness.AdminClient.Reply
    { try await admin.call(method, path, body: body, headers: headers) }

    /// Waits until `/peers` lists `peer` first.
    func waitUntilListedFirst(_ peer: String) async throws {
        try await waitUntil("the peer is listed") {
            guard case .array(let list)? = try await get("/peers")["peers"] else { return false }
            return list.first?["id"]?.stringValue == peer
        }
    }

    /// A route's body as text (`/metrics`).
    func text(_ path: String) async throws -> String { try await request("GET", path).text }

    func stop() async {
        task.cancel()
        _ = try? await task.value
        try? FileManager.default.removeItem(atPath: directory)
    }
}

func peer(_ id: String, port: Int, instance: String? = nil) -> DiscoveredPeer {
    DiscoveredPeer(
        instance: instance ?? "peer-\(id.prefix(4))", nodeID: id, group: "ferry", protocolVersion: 1, host: "h.local",
        addresses: ["127.0.0.1"], port: port, source: .dnsSD)
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct PeerManagerTests {
    @Test func trustOnFirstUsePinsOnlyTheFirstPeerSeen() async throws {
        let first = String(repeating: "e", count: 64)
        let second = String(repeating: "d", count: 64)
        let n = try await InProcessNode.start({ $0.trustMode = .tofu }, peers: [peer(first, port: 1)])
        try await waitUntil("the first peer is pinned") { n.node.trust.entry(first)?.source == .tofu }
        n.discovery.report(.appeared(peer(second, port: 2)))
        try await waitUntil("the second peer is listed") {
            guard case .array(let list)? = try await n.get("/peers")["peers"] else { return false }
            return list.contains { $0["id"]?.stringValue == second }
        }
        #expect(!n.node.trust.isTrusted(second))
        let trust = try await n.get("/trust")
        #expect(trust["trusted"] == .array([n.node.trust.entry(first)!.json]))
        await n.stop()
    }

    @Test func withoutTOFUDiscoveredPeersAreListedButNotTrustedOrDialled() async throws {
        let other = String(repeating: "f", count: 64)
        let n = try await InProcessNode.start({ _ in }, peers: [peer(other, port: 1)])
        try await n.waitUntilListedFirst(other)
        let p = try await n.get("/peers")["peers"]
        guard case .array(let list)? = p else { return }
        #expect(list[0]["trusted"] == false && list[0]["dialled"] == false && list[0]["url"] == nil)
        #expect(n.node.trust.entries.isEmpty)
        await n.stop()
    }

    @Test func aDiscoveredPeerIsNamedByItsNodeNameNotItsInstanceName() async throws {
        let first = String(repeating: "e", count: 64)
        let other = String(repeating: "d", count: 64)
        let n = try await InProcessNode.start({ $0.trustMode = .tofu }, peers: [
            peer(first, port: 1, instance: DiscoveredPeer.instanceName(nodeName: "av-q", nodeID: first)),
            peer(other, port: 2, instance: "renamed after a clash"),
        ])
        func listed() async throws -> [JSON] {
            guard case .array(let list)? = try await n.get("/peers")["peers"] else { return [] }
            return list
        }
        try await waitUntil("both peers are listed") { try await listed().count == 2 }
        let listed = try await listed()
        #expect(listed.first { $0["id"]?.stringValue == first }?["name"] == "av-q")
        #expect(listed.first { $0["id"]?.stringValue == other }?["name"] == "renamed after a clash")
        // Trusted on first use, it is saved under that name too.
        #expect(n.node.trust.entry(first)?.name == "av-q")
        await n.stop()
    }

    @Test func peersSayWhetherDiscoveryWorksAndWhyNot() async throws {
        let n = try await InProcessNode.start({ _ in })
        try await waitUntil("discovery is on") { try await n.get("/peers")["discovery"]?["state"] == "on" }
        n.discovery.report(.unavailable(reason: "no avahi-daemon"))
        try await waitUntil("discovery is unavailable") { try await n.get("/peers")["discovery"]?["state"] == "unavailable" }
        #expect(try await n.get("/peers")["discovery"]?["reason"] == "no avahi-daemon")
        await n.stop()
    }

    @Test func theDigestOfAPeerThatIsNotConnectedIsUnknownNotEqualOrDifferent() async throws {
        let other = String(repeating: "f", count: 64)
        let n = try await InProcessNode.start({ _ in }, peers: [peer(other, port: 1)])
        try await n.waitUntilListedFirst(other)
        n.node.digests.refresh()
        try await waitUntil("this node's digest is known") { n.node.digests.current() != nil }
        // A report from before the peer went away: stale, whatever it says.
        n.node.digests.peerReported(other, digest: n.node.digests.current())
        #expect(n.node.digests.matches(other) == true)
        guard case .array(let list)? = try await n.get("/peers")["peers"] else { throw NodeError.badConfiguration("no peers") }
        #expect(list.first?["connected"] == false)
        #expect(list.first?["digestMatches"] == .null)
        await n.stop()
    }

    @Test func aPeerThatMovesIsDialledAtItsNewAddress() async throws {
        let other = String(repeating: "f", count: 64)  // higher than any real ID: this node dials
        let n = try await InProcessNode.start({ $0.trust = [.init(nodeID: other)] }, peers: [peer(other, port: 1111)])
        func url() async throws -> String? {
            guard case .array(let list)? = try await n.get("/peers")["peers"] else { return nil }
            return list.first?["url"]?.stringValue
        }
        try await waitUntil("dialling the first address") { try await url() == "wss://127.0.0.1:1111/ferry/sync" }
        n.discovery.report(.appeared(peer(other, port: 2222)))
        try await waitUntil("dialling the new address") { try await url() == "wss://127.0.0.1:2222/ferry/sync" }
        await n.stop()
    }

    @Test func theHigherIDWaitsForTheLowerToDial() async throws {
        let lower = String(repeating: "0", count: 64)  // lower than any real ID: it dials, not us
        let n = try await InProcessNode.start({ $0.trust = [.init(nodeID: lower)] }, peers: [peer(lower, port: 1111)])
        try await waitUntil("the peer is listed") {
            guard case .array(let list)? = try await n.get("/peers")["peers"] else { return false }
            return list.first?["trusted"] == true
        }
        guard case .array(let list)? = try await n.get("/peers")["peers"] else { return }
        #expect(list[0]["dialled"] == false)
        await n.stop()
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct NodePolicyTests {
    @Test func theConfiguredPullFilterRejectsIncomingRevisionsAndCountsThem() async throws {
        let dirA = NSTemporaryDirectory() + "ferry-node-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dirA, withIntermediateDirectories: true)
        let idA = try NodeIdentity.loadOrCreate(directory: dirA, name: "a").nodeID
        let b = try await InProcessNode.start({ $0.trust = [.init(nodeID: idA)]; $0.discovery = false })
        _ = try b.node.store.put(try DocumentID("typed"), body: ["type": "note"])
        _ = try b.node.store.put(try DocumentID("untyped"), body: ["text": "no type"])
        var rule = DocumentRule()
        rule.required = ["type": "string"]
        let a = try await InProcessNode.start(
            {
                $0.peers = [.init(url: b.ready.url, nodeID: b.ready.nodeID)]
                $0.pullFilter = rule
                $0.discovery = false
            }, directory: dirA)
        try await waitUntil("the typed document arrives") { try a.node.store.document(try DocumentID("typed")) != nil }
        try await waitUntil("the rejection is counted") {
            let text = try await a.request("GET", "/metrics").text
            return text.split(separator: "\n").contains {
                $0.hasPrefix("ferry_documents_rejected_total{") && $0.contains(#"reason="filter""#) && $0.contains(#"direction="pull""#)
                    && (Double($0.split(separator: " ").last ?? "") ?? 0) > 0
            }
        }
        #expect(try a.node.store.document(try DocumentID("untyped")) == nil)
        await a.stop()
        await b.stop()
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct TrustRevocationTests {
    @Test func aPeerWhoseTrustIsRevokedWhileConnectedIsDisconnectedAndGetsNothingMore() async throws {
        let dirA = NSTemporaryDirectory() + "ferry-node-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dirA, withIntermediateDirectories: true)
        let idA = try NodeIdentity.loadOrCreate(directory: dirA, name: "a").nodeID
        let b = try await InProcessNode.start({ $0.discovery = false })
        try b.node.trust.add(.init(nodeID: idA, name: "a", policy: .trusted, source: .api))
        let a = try await InProcessNode.start(
            {
                $0.peers = [.init(url: b.ready.url, nodeID: b.ready.nodeID)]
                $0.discovery = false
            }, directory: dirA)
        _ = try a.node.store.put(try DocumentID("before"), body: [:])
        try await waitUntil("before arrives at B") { try b.node.store.document(try DocumentID("before")) != nil }
        // Revoke while A is connected: B closes A's live connection at once (and refuses
        // its next handshake), so nothing more flows either way.
        try await waitUntil("A's link is up") {
            guard case .array(let list)? = try await a.get("/peers")["peers"] else { return false }
            return list.first?["connected"] == true
        }
        try b.node.trust.remove(idA)
        try await waitUntil("B has closed A's connection") {
            guard case .array(let list)? = try await a.get("/peers")["peers"] else { return false }
            return list.first?["connected"] == false
        }
        _ = try a.node.store.put(try DocumentID("after"), body: [:])
        _ = try b.node.store.put(try DocumentID("secret"), body: [:])
        #expect(try b.node.store.document(try DocumentID("after")) == nil)
        #expect(try a.node.store.document(try DocumentID("secret")) == nil)
        await a.stop()
        await b.stop()
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct InboundPeerTests {
    @Test func aPeerThatDialledThisNodeIsListedInboundWithALiveStatusAndCounted() async throws {
        let dirA = NSTemporaryDirectory() + "ferry-node-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dirA, withIntermediateDirectories: true)
        let idA = try NodeIdentity.loadOrCreate(directory: dirA, name: "a").nodeID
        // B trusts A but knows no address of it: A dials, B only answers.
        let b = try await InProcessNode.start({ $0.trust = [.init(nodeID: idA, name: "tablet")]; $0.discovery = false })
        let a = try await InProcessNode.start(
            {
                $0.peers = [.init(url: b.ready.url, nodeID: b.ready.nodeID)]
                $0.discovery = false
            }, directory: dirA)
        func aOnB() async throws -> JSON? {
            guard case .array(let list)? = try await b.get("/peers")["peers"] else { return nil }
            return list.first { $0["id"]?.stringValue == idA }
        }
        try await waitUntil("B lists A as connected inbound") { try await aOnB()?["direction"] == "inbound" }
        let listed = try #require(try await aOnB())
        #expect(listed["connected"] == true && listed["dialled"] == false && listed["trusted"] == true)
        #expect(listed["source"] == "inbound" && listed["name"] == "tablet")
        #expect(listed["replication"]?["direction"] == "inbound")
        #expect(listed["replication"]?["activity"]?.stringValue == "idle" || listed["replication"]?["activity"]?.stringValue == "busy")
        // A's side: the link it dialled, outbound.
        guard case .array(let onA)? = try await a.get("/peers")["peers"] else { throw NodeError.badConfiguration("no peers list") }
        let bOnA = onA.first
        #expect(bOnA?["direction"] == "outbound" && bOnA?["replication"]?["direction"] == "outbound")
        // The counters move while the connection lives.
        let before = try #require(listed["replication"]?["bytesReceived"]?.intValue)
        _ = try a.node.store.put(try DocumentID("live"), body: ["v": 1])
        try await waitUntil("B counts A's push while connected") {
            let r = try await aOnB()?["replication"]
            return (r?["bytesReceived"]?.intValue ?? 0) > before && (r?["pulled"]?.intValue ?? 0) >= 1
        }
        #expect(try await aOnB()?["connected"] == true)
        let metrics = try await b.text("/metrics")
        #expect(metrics.split(separator: "\n").contains { $0 == "ferry_connected_peers 1" || $0 == "ferry_connected_peers 1.0" }, "\(metrics)")
        await a.stop()
        // A closed cleanly and is unlisted; or (a slow machine) B's watchdog saw it fall
        // silent first, and then B keeps it listed, not connected, while it is trusted.
        try await waitUntil("B no longer lists A as connected once it has gone") {
            guard let entry = try await aOnB() else { return true }
            return entry["connected"] == false
        }
        await b.stop()
    }
}
