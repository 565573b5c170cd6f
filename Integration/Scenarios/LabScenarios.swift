import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Scenarios 4 and 5 in the LAN lab: hosts as network namespaces on one bridge, each with
/// its own avahi-daemon, nodes finding each other over real mDNS.
@Suite(
    .serialized, .timeLimit(.minutes(20)),
    .enabled(if: mustRunEverything, "the LAN lab needs root, `ip netns` and avahi-daemon (as root and in CI it always runs)"))
struct LabScenarios {
    /// Starts one trusting node per host, each trusting `trusted`.
    func startNodes(_ cluster: Cluster, _ lab: Lab, count: Int, trusting: (Int) -> [String], group: String) async throws -> [Node] {
        var nodes: [Node] = []
        for i in 0..<count {
            let node = cluster.add("node\(i + 1)", host: lab.hosts[i])
            nodes.append(node)
        }
        let ids = try await cluster.ids(nodes)
        for (i, node) in nodes.enumerated() {
            var args = ["--discovery", "--group", group, "--interface", "0.0.0.0"]
            for id in trusting(i).isEmpty ? ids.enumerated().filter({ $0.offset != i }).map(\.element) : trusting(i) {
                args += ["--trust", id]
            }
            try await node.start(args)
        }
        return nodes
    }

    /// 5. Discovery across hosts: three mutually trusting nodes with no --peer find each
    /// other over mDNS and converge; a fourth nobody trusts is listed but exchanges nothing;
    /// avahi-browse on one host lists the others' services with their node IDs.
    @Test func nodesOnThreeHostsDiscoverEachOtherAndIgnoreAnUntrustedFourth() async throws {
        try await withLab(4, "discovery across hosts") { lab in
            let cluster = Cluster("lab-discovery")
            defer { cluster.cleanUp() }
            let trusted = try await startNodes(cluster, lab, count: 3, trusting: { _ in [] }, group: "lab")
            let stranger = cluster.add("stranger", host: lab.hosts[3])
            let trustedIDs = try await cluster.ids(trusted)
            try await stranger.start(["--discovery", "--group", "lab", "--interface", "0.0.0.0"] + trustedIDs.flatMap { ["--trust", $0] })
            for (i, n) in trusted.enumerated() { try await n.admin.put("from-\(i + 1)", #"{"host":"h\#(i + 1)"}"#) }
            try await stranger.admin.put("from-stranger", "{}")
            try await cluster.awaitConvergence(among: trusted, timeout: 90)
            for n in trusted {
                #expect(try await n.admin.get("/")["docCount"]?.intValue == 3)
                #expect(try await n.admin.call("GET", "/docs/from-stranger").status == 404)
            }
            #expect(try await stranger.admin.get("/")["docCount"]?.intValue == 1)
            let strangerID = try await stranger.id
            try await waitUntil("node1 lists the stranger as untrusted", timeout: 60) {
                let peers = try await trusted[0].admin.get("/peers")["peers"]?.items ?? []
                return peers.contains { $0["id"]?.stringValue == strangerID && $0["trusted"] == false }
            }
            let peers = try await trusted[0].admin.get("/peers")["peers"]?.items ?? []
            for (i, id) in trustedIDs.enumerated().dropFirst() {
                let p = peers.first { $0["id"]?.stringValue == id }
                #expect(p?["trusted"] == true && p?["source"] == "dns-sd", "node1's view of node\(i + 1): \(String(describing: p))")
                #expect(p?["addresses"]?.items.first?.stringValue == lab.hosts[i].address)
            }
            let browse = try await lab.run(lab.hosts[0], ["avahi-browse", "-rpt", "_ferry._tcp"])
            for (i, id) in (trustedIDs + [strangerID]).enumerated().dropFirst() {
                #expect(browse.stdout.contains("id=\(id)"), "avahi-browse on h1 lacks node\(i + 1): \(browse.stdout)")
                #expect(browse.stdout.contains(lab.hosts[i].address))
            }
            await finish(cluster, allowing: expectedRefusals)
        }
    }

    /// 4. Partition and heal: three hosts; one is cut off, both sides edit (including the
    /// same document), the cable comes back, and all converge with the conflict kept.
    @Test func aPartitionedHostConvergesAfterHealing() async throws {
        try await withLab(3, "partition and heal") { lab in
            let cluster = Cluster("lab-partition")
            defer { cluster.cleanUp() }
            let nodes = try await startNodes(cluster, lab, count: 3, trusting: { _ in [] }, group: "part")
            try await nodes[0].admin.put("shared", #"{"v":0}"#)
            try await cluster.awaitConvergence(timeout: 90)
            let base = try await nodes[0].admin.get("/docs/shared")["_rev"]?.stringValue
            try await lab.partition(lab.hosts[2])
            // Both sides edit while cut off, including the same document.
            try await nodes[0].admin.put("shared", #"{"v":"majority"}"#, rev: base)
            try await nodes[2].admin.put("shared", #"{"v":"island"}"#, rev: base)
            try await nodes[1].admin.put("majority-only", "{}")
            try await nodes[2].admin.put("island-only", "{}")
            try await cluster.awaitConvergence(among: [nodes[0], nodes[1]], timeout: 60)
            #expect(try await nodes[0].admin.call("GET", "/docs/island-only").status == 404)
            try await lab.heal(lab.hosts[2])
            try await cluster.awaitConvergence(timeout: 180)
            for n in nodes {
                #expect(try await n.admin.call("GET", "/docs/island-only").status == 200)
                #expect(try await n.admin.call("GET", "/docs/majority-only").status == 200)
                #expect(try await n.admin.get("/docs/shared?conflicts=true")["_conflicts"]?.count == 1)
            }
            await finish(cluster, allowing: expectedRefusals + ["replication offline"])
        }
    }
}
