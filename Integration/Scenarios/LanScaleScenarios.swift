import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// A LAN of a dozen hosts (`FERRY_LAN_HOSTS`, default 12): enrolment with one invitation and
/// one join per node, a node joining a group that holds 10,000 documents, and a host whose
/// cable is pulled and put back. Figures (times, bytes per write) belong to `ferry-bench
/// lan`; here the bounds are generous and the counts exact. Part of `LabScenarios`, whose
/// tests run one at a time: they share the one lab.
extension LabScenarios {
    static let hostCount = ProcessInfo.processInfo.environment["FERRY_LAN_HOSTS"].flatMap(Int.init).map { max(4, $0) } ?? 12
    static let documentCount = 10_000

    @Test func aDozenHostsEnrolInTwoCommandsPerNodeAndAJoinerPullsEachRevisionOnce() async throws {
        let k = Self.hostCount
        try await withLab(k, "a LAN of \(k) hosts") { lab in
            let cluster = Cluster("lan-scale")
            defer { cluster.cleanUp() }
            let nodes = (0..<k).map { cluster.add("node\($0 + 1)", host: lab.hosts[$0]) }
            let members = Array(nodes.dropLast())
            let joiner = nodes[k - 1]

            // The same 10,000 documents of about 1 KiB imported on every member: the same
            // edits make the same revision IDs, so the members start converged.
            let dump = cluster.root + "/docs.ndjson"
            let dataBytes = try DocumentFixtures.writeKiBDocuments(Self.documentCount, to: dump)
            for n in members {
                let r = try await Ferry.run(["--data", n.dataDirectory, "import", dump])
                #expect(r.status == 0, "import on \(n.name): \(r.stderr)")
            }
            let serve = ["--discovery", "--group", "dozen", "--interface", "0.0.0.0"]
            for n in members { try await n.start(serve) }

            // Enrolment: each new node takes one `ferry join`, and node1 one `ferry invite` for it.
            var commands = 0
            for n in members.dropFirst() {
                try await enrol(n, through: nodes[0], commands: &commands)
            }
            let memberIDs = try await cluster.ids(members)
            for (i, n) in members.enumerated() {
                let others = Set(memberIDs.enumerated().filter { $0.offset != i }.map(\.element))
                try await waitUntil("\(n.name) is linked to the other \(others.count) members", timeout: 180) {
                    try await connectedTrustedPeers(n).isSuperset(of: others)
                }
            }
            try await cluster.awaitConvergence(among: members, timeout: 120)

            // A node joins the group that holds the documents.
            try await joiner.start(serve)
            try await enrol(joiner, through: nodes[0], commands: &commands)
            #expect(commands == 2 * (k - 1), "enrolling \(k) nodes took \(commands) commands")
            try await cluster.awaitConvergence(timeout: 300)
            let duplicates = try await joiner.admin.metric("ferry_documents_duplicate_total")
            let received = try await joiner.admin.metric("ferry_bytes_received_total")
            // The documents and the group's membership entries, on the joiner as on node1.
            #expect(try await joiner.admin.get("/")["docCount"] == (try await nodes[0].admin.get("/")["docCount"]))
            #expect(duplicates <= Double(Self.documentCount) / 100, "the joiner received \(Int(duplicates)) revisions it already had")
            // Alone this is about 1.25× (per-document metadata; Benchmarks/README.md, P8); under a
            // parallel test run up to 1.4× was seen. Pulling from every member would be 11×.
            #expect(received <= 1.5 * Double(dataBytes), "the joiner received \(Int(received)) bytes for \(dataBytes) bytes of documents")

            // A write anywhere reaches everyone.
            try await nodes[k / 2].admin.put("after-join", #"{"from":"the middle"}"#)
            try await cluster.awaitConvergence(timeout: 120)

            // The joiner's cable is pulled: every member sees it offline, both sides write,
            // the cable comes back and all converge.
            let joinerID = try await joiner.id
            try await lab.partition(lab.hosts[k - 1])
            for n in members {
                try await waitUntil("\(n.name) shows the cut-off joiner offline", timeout: 60) {
                    !(try await connectedTrustedPeers(n).contains(joinerID))
                }
            }
            try await nodes[0].admin.put("while-cut-majority", "{}")
            try await joiner.admin.put("while-cut-island", "{}")
            try await lab.heal(lab.hosts[k - 1])
            try await cluster.awaitConvergence(timeout: 180)
            for n in [nodes[0], joiner] {
                #expect(try await n.admin.call("GET", "/docs/while-cut-majority").status == 200)
                #expect(try await n.admin.call("GET", "/docs/while-cut-island").status == 200)
            }
            await finish(cluster, allowing: expectedRefusals + ["replication offline", "went silent"])
        }
    }

    /// `ferry invite` on `inviter`, then `ferry join CODE` on `node`; counts both.
    func enrol(_ node: Node, through inviter: Node, commands: inout Int) async throws {
        let invite = try await Ferry.run(["--data", inviter.dataDirectory, "invite"], host: inviter.host)
        commands += 1
        guard invite.status == 0, let code = invite.stdout.split(whereSeparator: \.isWhitespace).first(where: { $0.hasPrefix("ferry1-") })
        else { throw HarnessError("ferry invite on \(inviter.name) gave no code: \(invite.stdout) \(invite.stderr)") }
        let join = try await Ferry.run(["--data", node.dataDirectory, "join", String(code)], host: node.host)
        commands += 1
        guard join.status == 0 else { throw HarnessError("ferry join on \(node.name) failed: \(join.stdout) \(join.stderr)") }
    }
}

/// The IDs of the trusted peers a node lists as connected.
func connectedTrustedPeers(_ node: Node) async throws -> Set<String> {
    let peers = try await node.admin.get("/peers")["peers"]?.items ?? []
    return Set(peers.filter { $0["trusted"] == true && $0["connected"] == true }.compactMap { $0["id"]?.stringValue })
}
