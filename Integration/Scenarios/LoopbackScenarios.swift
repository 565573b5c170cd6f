import FerryCore
import FerrySync
import Foundation
import IntegrationHarness
import Testing

/// Scenarios 1–3 on this machine's loopback: real `ferry serve` processes.
@Suite(.serialized, .timeLimit(.minutes(10))) struct LoopbackScenarios {
    /// 1. Two nodes: one-shot and continuous sync; documents, deletes, conflicts and blobs
    /// all arrive, and the digests match.
    @Test func twoNodesSyncDocumentsDeletesConflictsAndBlobs() async throws {
        let cluster = Cluster("two")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        let (idA, idB) = (try await a.id, try await b.id)
        // Before any link: the same document edited differently on both sides (a conflict),
        // a blob on A, a document deleted on B.
        try await a.start(["--trust", idB])
        try await b.start(["--trust", idA])
        try await a.admin.put("shared", #"{"by":"a"}"#)
        try await b.admin.put("shared", #"{"by":"b"}"#)
        let blobFile = cluster.root + "/photo.bin"
        try Data((0..<70_000).map { UInt8($0 % 251) }).write(to: URL(fileURLWithPath: blobFile))
        let blob = try await Ferry.run(["--data", a.dataDirectory, "blob", "put", blobFile, "--json"])
        #expect(blob.status == 0, "\(blob.stderr)")
        let ref = blob.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try await a.admin.put("with-blob", #"{"photo":\#(ref)}"#)
        let doomed = try await b.admin.put("doomed", "{}")
        let deleted = try await b.admin.call("DELETE", "/docs/doomed?rev=\(doomed)")
        #expect(deleted.status == 200)
        for i in 0..<200 { try await a.admin.put("a-\(i)", #"{"i":\#(i)}"#) }

        // One-shot: B pulls and pushes once through `ferry sync` while A serves.
        _ = await b.stop()
        let once = try await Ferry.run(["--data", b.dataDirectory, "sync", a.url, "--pin", idA, "--json"])
        #expect(once.status == 0, "\(once.stderr)")
        let summary = try JSON.parse(once.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect((summary["pulled"]?.intValue ?? 0) >= 202)
        #expect(summary["blobsReceived"]?.intValue == 1)

        // Continuous: B serves again with A as its peer; new edits on either side arrive.
        try await b.restart(["--trust", idA, "--peer", "\(a.url)#\(idA)"])
        try await cluster.awaitConvergence()
        try await a.admin.put("later-a", "{}")
        try await b.admin.put("later-b", "{}")
        try await cluster.awaitConvergence()
        for node in [a, b] {
            let shared = try await node.admin.get("/docs/shared?conflicts=true")
            #expect(shared["_conflicts"]?.count == 1, "\(node.name) lost the conflict: \(shared)")
            #expect(try await node.admin.call("GET", "/docs/doomed").json["_deleted"] == true)
            #expect(try await node.admin.get("/")["docCount"]?.intValue == 204)
        }
        let fetched = cluster.root + "/fetched.bin"
        let digest = try JSON.parse(ref)["digest"]?.stringValue ?? ""
        let get = try await Ferry.run(["--data", b.dataDirectory, "blob", "get", digest, "-o", fetched])
        #expect(get.status == 0, "\(get.stderr)")
        #expect(FileManager.default.contentsEqual(atPath: fetched, andPath: blobFile))
        await finish(cluster)
    }

    /// 2. Five-node mesh: concurrent random writes, updates, deletes and conflicting edits;
    /// after quiescing every digest is equal. Under deletesWin, lastWriteWins and merge no
    /// conflicts remain and the node stops writing (no resolver storm).
    @Test(.serialized, arguments: ["keepConflicts", "deletesWin", "lastWriteWins", "merge"])
    func fiveNodeMeshConvergesUnderConcurrentEdits(policy: String) async throws {
        let cluster = Cluster("mesh-\(policy)")
        defer { cluster.cleanUp() }
        let nodes = (1...5).map { cluster.add("n\($0)") }
        let ids = try await cluster.ids(nodes)
        let config = cluster.root + "/config.json"
        try #"{"discovery":{"enabled":false},"conflicts":{"default":"\#(policy)"}}"#.write(toFile: config, atomically: true, encoding: .utf8)
        // Each pair has one link: node i dials every node after it.
        for (i, node) in nodes.enumerated().reversed() {
            var args = ["--config", config]
            for (j, id) in ids.enumerated() where j != i { args += ["--trust", id] }
            for j in (i + 1)..<nodes.count { args += ["--peer", "\(nodes[j].url)#\(ids[j])"] }
            try await node.start(args)
        }
        var rng = SystemRandomNumberGenerator()
        // About 400 operations spread over the nodes, on 40 shared document IDs.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for node in nodes {
                group.addTask {
                    var local = SystemRandomNumberGenerator()
                    for step in 0..<80 {
                        let id = "doc-\(Int.random(in: 0..<40, using: &local))"
                        let current = try await node.admin.call("GET", "/docs/\(id)")
                        let rev = current.status == 200 && current.json["_deleted"] != true ? current.json["_rev"]?.stringValue : nil
                        switch Int.random(in: 0..<10, using: &local) {
                        case 0..<6:  // update (or create), from this node's view: conflicts when views differ
                            _ = try await node.admin.call(
                                "PUT", "/docs/\(id)\(rev.map { "?rev=\($0)" } ?? "")",
                                body: #"{"by":"\#(node.name)","step":\#(step),"f\#(step % 3)":\#(step)}"#)
                        case 6..<8:
                            if let rev { _ = try await node.admin.call("DELETE", "/docs/\(id)?rev=\(rev)") }
                        default:
                            _ = try await node.admin.call("PUT", "/docs/\(node.name)-\(step)", body: #"{"n":\#(step)}"#)
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        _ = rng.next()
        try await cluster.awaitConvergence(timeout: 120)
        // Quiesced: nothing writes any more (a resolver storm would keep sequences moving).
        var sequences: [Int64] = []
        for n in nodes { sequences.append(try await n.admin.get("/")["lastSequence"]?.intValue ?? -1) }
        try await cluster.awaitConvergence(timeout: 30)
        for (n, before) in zip(nodes, sequences) {
            let info = try await n.admin.get("/")
            #expect(info["lastSequence"]?.intValue == before, "\(n.name) kept writing after convergence")
            if policy != "keepConflicts" {
                #expect(info["conflictedCount"]?.intValue == 0, "\(n.name) still has conflicts under \(policy)")
            }
        }
        await finish(cluster, allowing: expectedRefusals)
    }

    /// 3. Crash and resume: the receiving node is killed with SIGKILL at 10 random points of
    /// a 100k-document pull; each restart resumes from its checkpoint, re-transferring at
    /// most one batch (counted in ferry_documents_duplicate_total), and in the end every
    /// document is there and integrity_check is ok.
    @Test func aPullKilledAtTenRandomPointsResumesAndCompletes() async throws {
        let total = Int(ProcessInfo.processInfo.environment["FERRY_IT_CRASH_DOCS"] ?? "") ?? 100_000
        let cluster = Cluster("crash")
        defer { cluster.cleanUp() }
        let source = cluster.add("source")
        let receiver = cluster.add("receiver")
        let (idS, idR) = (try await source.id, try await receiver.id)
        let ndjson = cluster.root + "/docs.ndjson"
        let pad = String(repeating: "x", count: 960)
        var text = ""
        text.reserveCapacity(total * 1000)
        for i in 0..<total { text += #"{"_id":"doc-\#(String(format: "%06d", i))","i":\#(i),"pad":"\#(pad)"}"# + "\n" }
        try text.write(toFile: ndjson, atomically: false, encoding: .utf8)
        let imported = try await Ferry.run(["--data", source.dataDirectory, "import", ndjson])
        #expect(imported.status == 0, "\(imported.stderr)")
        try await source.start(["--trust", idR])
        let peerArgs = ["--peer", "\(source.url)#\(idS)"]
        try await receiver.start(peerArgs)
        var points = (0..<10).map { _ in Int.random(in: 1..<(total - total / 20)) }.sorted()
        let batch = ReplicatorConfiguration().batchSize
        var kills = 0
        while let point = points.first {
            points.removeFirst()
            var count = 0
            try await waitUntil("receiver reaches \(point) documents", timeout: 120) {
                count = Int(try await receiver.admin.get("/")["docCount"]?.intValue ?? 0)
                return count >= point || count >= total
            }
            if count >= total { break }
            #expect(await receiver.kill() == 128 + SIGKILL)
            kills += 1
            try await receiver.restart(peerArgs)
            // A restarted node counts from zero: what it re-received is what it already had.
            try await waitUntil("the resumed pull moves on", timeout: 60) {
                (try await receiver.admin.get("/")["docCount"]?.intValue ?? 0) > count || count >= total
            }
            let duplicates = try await receiver.admin.metric("ferry_documents_duplicate_total")
            #expect(duplicates <= Double(batch), "kill \(kills) at \(count): \(Int(duplicates)) documents re-transferred")
        }
        try await waitUntil("every document arrives", timeout: 300) {
            try await receiver.admin.get("/")["docCount"]?.intValue == Int64(total)
        }
        #expect(kills >= 5, "the pull finished before most kill points (\(kills) kills)")
        try await cluster.awaitConvergence()
        _ = await receiver.stop()
        let check = try await Ferry.run(["--data", receiver.dataDirectory, "check", "--json"])
        #expect(check.stdout.contains(#""ok":true"#), "\(check.stdout)\(check.stderr)")
        await finish(cluster, allowing: expectedRefusals)
    }
}
