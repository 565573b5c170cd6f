import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// A node joining a converged group on loopback: real `ferry serve` processes, static peers
/// and manual trust. It must fetch each revision once (one link catches it up, the others
/// start near their tips), not once per peer.
@Suite(.serialized, .timeLimit(.minutes(10))) struct JoinScenarios {
    /// Four converged nodes hold 2,000 documents of about 1 KiB; a fifth joins trusting all
    /// four (`FERRY_IT_JOIN_MEMBERS` and `FERRY_IT_JOIN_DOCS` change both numbers; with many
    /// members the joiner's relays of what it receives, answered "exists" by every other
    /// member, exceed the bytes bound until relays are announced before their bodies). It reaches an equal digest; its duplicates stay within 1 % of the documents,
    /// and it receives at most 1.3 times the bytes a node pulling the same data from a single
    /// peer receives (measured in the same run).
    @Test func aFifthNodeJoiningFourFetchesEachRevisionOnce() async throws {
        let env = ProcessInfo.processInfo.environment
        let documents = Int(env["FERRY_IT_JOIN_DOCS"] ?? "") ?? 2_000
        let memberCount = max(2, Int(env["FERRY_IT_JOIN_MEMBERS"] ?? "") ?? 4)
        let cluster = Cluster("join")
        defer { cluster.cleanUp() }
        let members = (1...memberCount).map { cluster.add("m\($0)") }
        let single = cluster.add("single")
        let joiner = cluster.add("joiner")
        let ids = try await cluster.ids(members + [single, joiner])
        let memberIDs = Array(ids.prefix(memberCount))
        let config = cluster.root + "/config.json"
        try #"{"discovery":{"enabled":false}}"#.write(toFile: config, atomically: true, encoding: .utf8)

        // The same import on every member gives the same revisions: converged without traffic.
        let ndjson = cluster.root + "/docs.ndjson"
        let pad = String(repeating: "x", count: 960)
        var text = ""
        for i in 0..<documents { text += #"{"_id":"doc-\#(String(format: "%05d", i))","i":\#(i),"pad":"\#(pad)"}"# + "\n" }
        try text.write(toFile: ndjson, atomically: false, encoding: .utf8)
        for m in members {
            let imported = try await Ferry.run(["--data", m.dataDirectory, "import", ndjson])
            #expect(imported.status == 0, "\(imported.stderr)")
        }
        // A mesh: member i trusts everyone and dials every member after it.
        for (i, m) in members.enumerated().reversed() {
            var args = ["--config", config]
            for (j, id) in ids.enumerated() where j != i { args += ["--trust", id] }
            for j in (i + 1)..<members.count { args += ["--peer", "\(members[j].url)#\(memberIDs[j])"] }
            try await m.start(args)
        }
        // Settled: every member is connected to the three others and every link it dialled is idle.
        try await waitUntil("the members' links are up and idle", timeout: 120) {
            for m in members {
                let peers = try await m.admin.get("/peers")["peers"]?.items ?? []
                let up = peers.filter { $0["connected"] == true }
                guard up.count == memberCount - 1 else { return false }
                for p in up where p["dialled"] == true {
                    guard p["replication"]?["activity"]?.stringValue == "idle" else { return false }
                }
            }
            return true
        }
        try await cluster.awaitConvergence(among: members)

        // The baseline: a node that pulls the same data from one peer only.
        try await single.start(["--config", config, "--trust", memberIDs[0], "--peer", "\(members[0].url)#\(memberIDs[0])"])
        try await cluster.awaitConvergence(among: [members[0], single], timeout: 120)
        try await waitUntilIdle(single)
        let baseline = try await single.admin.metric("ferry_bytes_received_total")
        #expect(await single.stop() == 0)

        // The joiner dials all four at once.
        let started = Date()
        var args = ["--config", config]
        for (m, id) in zip(members, memberIDs) { args += ["--trust", id, "--peer", "\(m.url)#\(id)"] }
        try await joiner.start(args)
        try await cluster.awaitConvergence(among: members + [joiner], timeout: 120)
        let seconds = Date().timeIntervalSince(started)
        try await waitUntilIdle(joiner)
        let received = try await joiner.admin.metric("ferry_bytes_received_total")
        let duplicates = try await joiner.admin.metric("ferry_documents_duplicate_total")
        let figures = "joined in \(String(format: "%.2f", seconds)) s; received \(Int(received)) B vs \(Int(baseline)) B from one peer "
            + "(\(String(format: "%.2f", received / max(baseline, 1)))x); \(Int(duplicates)) duplicates"
        print("JoinScenarios: \(figures)")
        #expect(duplicates <= Double(documents) / 100, "\(figures)")
        #expect(received <= 1.3 * baseline, "\(figures)")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// Waits until every link `node` dialled is idle (caught up both ways).
    func waitUntilIdle(_ node: Node) async throws {
        try await waitUntil("\(node.name)'s links are idle", timeout: 60) {
            let peers = try await node.admin.get("/peers")["peers"]?.items ?? []
            return peers.filter { $0["dialled"] == true }.allSatisfy { $0["replication"]?["activity"]?.stringValue == "idle" }
        }
    }
}
