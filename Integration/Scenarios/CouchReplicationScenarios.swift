import FerryCore
import FerrySync
import Foundation
import IntegrationHarness
import Testing

/// Ferry's replicator speaking the CouchDB replication protocol, with real `ferry serve`
/// processes: a node replicates with another node's CouchDB API (both ways, one-shot and
/// continuous, filtered, with conflicts, deletes and attachments), resumes from its
/// checkpoint after either side is killed, and agrees with the reference Python replicator.
/// The other side is always a Ferry node's CouchDB listener: it speaks the same protocol as
/// Apache CouchDB, and runs here without one.
@Suite(.serialized, .timeLimit(.minutes(10))) struct CouchReplicationScenarios {
    /// A one-shot push-and-pull between node A and B's CouchDB API moves every document,
    /// a conflict (both leaves, one winner on both sides), a delete and attachments (bytes,
    /// digest and revpos); later edits (a deleted conflict leaf, an update that keeps its
    /// attachment as a stub) follow; a third run moves nothing but a new document.
    @Test func aOneShotReplicationMovesConflictsDeletesAndAttachmentsBothWays() async throws {
        let cluster = Cluster("couchrep-oneshot")
        defer { cluster.cleanUp() }
        let a = cluster.add("a"), b = cluster.add("b")
        try await a.start()
        try await b.start()
        let dbA = try await CouchDatabaseClient(a), dbB = try await CouchDatabaseClient(b)

        // Before any replication: documents on each side, the same document made on both
        // (a conflict once they meet), a deleted one, and attachments both ways.
        for i in 0..<20 {
            try await dbA.put("a-\(i)", ["from": "a", "i": .int(Int64(i))])
            try await dbB.put("b-\(i)", ["from": "b", "i": .int(Int64(i))])
        }
        try await dbA.put("clash", ["side": "a"])
        try await dbB.put("clash", ["side": "b"])
        try await dbB.delete("gone", rev: try await dbB.put("gone", ["v": 1]))
        let photoA = payload(1, 12_000), photoB = payload(2, 30_000)
        var photoRev = try await dbA.put("photo-a", ["kind": "photo"], attachments: ["a.txt": photoA])
        let bare = try await dbB.put("photo-b", ["kind": "photo"])
        // A standalone attachment upload (not inline), as CouchDB clients make them.
        let attached = try await dbB.client.call(
            "PUT", "/\(dbB.name)/photo-b/b.txt?rev=\(bare)", body: photoB, headers: ["Content-Type": "text/plain"])
        #expect(attached.status == 201, "\(attached.text)")

        let spec: JSON = [
            "id": "with-b", "url": .string(dbB.url), "direction": "pushAndPull", "continuous": false,
            "credentialsFile": .string(try b.couchCredentialsFile()),
        ]
        try await a.addReplication(spec)
        try await cluster.awaitConvergence(among: [a, b])
        var status = try await a.awaitReplication("with-b", "stopped") { $0["activity"] == "stopped" }
        print("one-shot: \(status.canonicalString)")
        #expect(status["error"] == .null, "\(status)")
        #expect(status["pushed"]?.intValue == 22 && status["pulled"]?.intValue == 23, "each revision moves once: \(status)")
        var snapshotA = try await dbA.snapshot(), snapshotB = try await dbB.snapshot()
        #expect(snapshotA == snapshotB, "\(snapshotDifferences(snapshotA, snapshotB))")
        for db in [dbA, dbB] {
            let clash = try await db.document("clash")
            #expect(clash["_conflicts"]?.count == 1, "\(db.node.name): \(clash)")
            #expect(try await !db.exists("gone"))
            #expect(try await db.attachment("photo-a", "a.txt") == photoA, "\(db.node.name)'s photo-a")
            #expect(try await db.attachment("photo-b", "b.txt") == photoB, "\(db.node.name)'s photo-b")
        }
        #expect(try await dbA.document("clash")["_rev"] == dbB.document("clash")["_rev"])

        // Later edits on both sides: B deletes one of A's documents and the losing leaf of
        // the conflict; A updates photo-a keeping its attachment (a stub) and deletes a B document.
        let clash = try await dbB.document("clash")
        let loser = clash["_conflicts"]?.items.first?.stringValue ?? ""
        try await dbB.delete("clash", rev: loser)
        try await dbB.delete("a-3", rev: try await dbB.document("a-3")["_rev"]?.stringValue ?? "")
        photoRev = try await dbA.call(
            "PUT", "/photo-a",
            body: ["kind": "photo", "v": 2, "_rev": .string(photoRev), "_attachments": ["a.txt": ["stub": true]]]
        ).json["rev"]?.stringValue ?? ""
        try await dbA.delete("b-4", rev: try await dbA.document("b-4")["_rev"]?.stringValue ?? "")
        try await a.removeReplication("with-b")
        try await a.addReplication(spec)
        try await cluster.awaitConvergence(among: [a, b])
        status = try await a.awaitReplication("with-b", "stopped") { $0["activity"] == "stopped" }
        print("second one-shot: \(status.canonicalString)")
        #expect(status["error"] == .null && status["pushed"]?.intValue == 2 && status["pulled"]?.intValue == 2, "\(status)")
        snapshotA = try await dbA.snapshot()
        snapshotB = try await dbB.snapshot()
        #expect(snapshotA == snapshotB, "\(snapshotDifferences(snapshotA, snapshotB))")
        for db in [dbA, dbB] {
            #expect(try await db.document("clash")["_conflicts"] == nil, "\(db.node.name) still shows the conflict")
            let photo = try await db.document("photo-a")
            #expect(photo["_rev"]?.stringValue == photoRev)
            #expect(photo["_attachments"]?["a.txt"]?["revpos"] == 1, "the attachment kept its revpos on \(db.node.name): \(photo)")
            #expect(try await db.attachment("photo-a", "a.txt") == photoA)
        }

        // A third run finds only what was written since: nothing else moves either way.
        try await dbB.put("sentinel", ["v": 1])
        try await a.removeReplication("with-b")
        try await a.addReplication(spec)
        status = try await a.awaitReplication("with-b", "stopped after pulling the sentinel") {
            $0["activity"] == "stopped" && ($0["pulled"]?.intValue ?? 0) >= 1
        }
        #expect(status["pushed"] == 0 && status["pulled"] == 1, "\(status)")
        let afterA = try await dbA.snapshot(), afterB = try await dbB.snapshot()
        #expect(afterA.filter { $0.key != "sentinel" } == snapshotA, "\(snapshotDifferences(afterA, snapshotA))")
        #expect(afterB.filter { $0.key != "sentinel" } == snapshotB, "\(snapshotDifferences(afterB, snapshotB))")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// A continuous push-and-pull carries each later write both ways as it happens: new
    /// documents, a delete, an attachment, and a conflict made on both sides at once (the
    /// same winner and leaves on both); once converged, neither side writes anything more.
    @Test func aContinuousReplicationCarriesEachLaterWriteBothWays() async throws {
        let cluster = Cluster("couchrep-live")
        defer { cluster.cleanUp() }
        let a = cluster.add("a"), b = cluster.add("b")
        try await a.start()
        try await b.start()
        let dbA = try await CouchDatabaseClient(a), dbB = try await CouchDatabaseClient(b)
        try await a.addReplication([
            "id": "live", "url": .string(dbB.url), "continuous": true, "credentialsFile": .string(try b.couchCredentialsFile()),
        ])
        try await a.awaitReplication("live", "went idle") { $0["activity"] == "idle" }

        try await dbA.put("from-a", ["v": 1])
        try await waitUntil("from-a reaches B") { try await dbB.exists("from-a") }
        let fromB = try await dbB.put("from-b", ["v": 1])
        try await waitUntil("from-b reaches A") { try await dbA.exists("from-b") }
        let scan = payload(3, 20_000)
        try await dbB.put("scan", ["kind": "scan"], attachments: ["scan.txt": scan])
        try await waitUntil("the scan reaches A") { try await dbA.exists("scan") }
        #expect(try await dbA.attachment("scan", "scan.txt") == scan)
        try await dbA.delete("from-b", rev: fromB)
        try await waitUntil("the delete reaches B") { try await !dbB.exists("from-b") }

        // A conflict made on both sides at once: two children of one base, stored as a
        // replicator stores them, so neither side can refuse its own.
        let base = try await dbA.put("shared", ["v": 0])
        try await waitUntil("shared reaches B") { try await dbB.exists("shared") }
        let baseHash = String(base.split(separator: "-")[1])
        async let left: Void = dbA.storeReplicated([child(of: "shared", baseHash, hash: String(repeating: "1a", count: 16), ["v": "a"])])
        async let right: Void = dbB.storeReplicated([child(of: "shared", baseHash, hash: String(repeating: "2b", count: 16), ["v": "b"])])
        _ = try await (left, right)
        try await cluster.awaitConvergence(among: [a, b])
        let sharedA = try await dbA.document("shared"), sharedB = try await dbB.document("shared")
        #expect(sharedA["_rev"] == sharedB["_rev"] && sharedA["_rev"]?.stringValue == "2-" + String(repeating: "2b", count: 16))
        #expect(sharedA["_conflicts"] == sharedB["_conflicts"] && sharedA["_conflicts"]?.count == 1, "\(sharedA)\n\(sharedB)")

        try await assertQuiescent([dbA, dbB], sentinelOn: dbB)
        let status = try await a.replication("live")["status"] ?? .null
        print("continuous: \(status.canonicalString)")
        #expect(status["error"] == .null && status["rejected"] == 0, "\(status)")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// Filtered replications: a one-shot pull by document IDs brings exactly those, and a
    /// one-shot push by document IDs sends exactly those; a continuous push-and-pull with
    /// a Mango selector brings only matching documents from B and sends only matching ones
    /// to B, before and after it has caught up.
    @Test func filteredReplicationsCarryOnlyTheNamedOrMatchingDocuments() async throws {
        let cluster = Cluster("couchrep-filter")
        defer { cluster.cleanUp() }
        let a = cluster.add("a"), b = cluster.add("b")
        try await a.start()
        try await b.start()
        let dbA = try await CouchDatabaseClient(a), dbB = try await CouchDatabaseClient(b)
        for i in 1...5 {
            try await dbB.put("order-\(i)", ["type": "order", "n": .int(Int64(i))])
            try await dbB.put("note-\(i)", ["type": "note", "n": .int(Int64(i))])
        }
        for id in ["keep-1", "keep-2", "other-1"] { try await dbB.put(id, ["type": "misc"]) }
        let credentials = JSON.string(try b.couchCredentialsFile())

        try await a.addReplication([
            "id": "by-id", "url": .string(dbB.url), "direction": "pull", "continuous": false, "credentialsFile": credentials,
            "documentIDs": ["keep-1", "keep-2"],
        ])
        var status = try await a.awaitReplication("by-id", "pulled both documents and stopped") {
            $0["activity"] == "stopped" && ($0["pulled"]?.intValue ?? 0) >= 2
        }
        #expect(status["pulled"] == 2 && status["error"] == .null, "\(status)")
        #expect(try await Set(dbA.snapshot().keys) == ["keep-1", "keep-2"])

        // The same the other way: a one-shot push of one named document of two.
        try await dbA.put("push-1", ["type": "misc"])
        try await dbA.put("push-2", ["type": "misc"])
        try await a.addReplication([
            "id": "push-by-id", "url": .string(dbB.url), "direction": "push", "continuous": false, "credentialsFile": credentials,
            "documentIDs": ["push-1"],
        ])
        status = try await a.awaitReplication("push-by-id", "pushed push-1 and stopped") {
            $0["activity"] == "stopped" && ($0["pushed"]?.intValue ?? 0) >= 1
        }
        #expect(status["pushed"] == 1 && status["error"] == .null, "\(status)")
        #expect(try await dbB.exists("push-1"))
        #expect(try await !dbB.exists("push-2"))

        try await a.addReplication([
            "id": "orders", "url": .string(dbB.url), "direction": "pushAndPull", "continuous": true, "credentialsFile": credentials,
            "selector": ["type": "order"],
        ])
        try await waitUntil("the five orders reach A") {
            try await a.admin.get("/")["docCount"]?.intValue == 9
        }
        // Written in this order, each pair is listed note first: when the order has
        // arrived, the note has been passed over.
        try await dbB.put("note-6", ["type": "note"])
        try await dbB.put("order-6", ["type": "order"])
        try await dbA.put("note-a", ["type": "note"])
        try await dbA.put("order-a", ["type": "order"])
        try await waitUntil("order-6 reaches A") { try await dbA.exists("order-6") }
        try await waitUntil("order-a reaches B") { try await dbB.exists("order-a") }
        let onA = try await dbA.snapshot().keys.sorted(), onB = try await dbB.snapshot().keys.sorted()
        #expect(onA == ["keep-1", "keep-2", "note-a"] + (1...6).map { "order-\($0)" } + ["order-a", "push-1", "push-2"], "\(onA)")
        #expect(!onB.contains("note-a") && !onB.contains("push-2") && onB.contains("order-a"), "\(onB)")
        status = try await a.replication("orders")["status"] ?? .null
        print("selector: \(status.canonicalString)")
        #expect(status["error"] == .null && status["pulled"] == 6 && status["pushed"] == 1, "\(status)")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// SIGKILL of the pulling node mid-way through a pull of thousands of documents: after
    /// its restart the replication resumes from its checkpoint, re-lists at most one batch
    /// of changes it had already stored, and fetches none of them again.
    @Test func aPullerKilledMidReplicationResumesFromItsCheckpoint() async throws {
        let total = Int(ProcessInfo.processInfo.environment["FERRY_IT_COUCH_KILL_DOCS"] ?? "") ?? 20_000
        let batch = ReplicatorConfiguration().batchSize
        let cluster = Cluster("couchrep-kill-puller")
        defer { cluster.cleanUp() }
        let a = cluster.add("a"), b = try await seededSource(cluster, documents: total)
        let dbB = try await CouchDatabaseClient(b)
        try await a.start()
        try await a.addReplication([
            "id": "pull", "url": .string(dbB.url), "direction": "pull", "continuous": true,
            "credentialsFile": .string(try b.couchCredentialsFile()),
        ])
        var seen = 0
        try await waitUntil("A stores \(total * 2 / 5) documents", timeout: 120, every: .milliseconds(20)) {
            seen = Int(try await a.admin.get("/")["docCount"]?.intValue ?? 0)
            return seen >= total * 2 / 5
        }
        #expect(seen < total, "the pull finished before the kill: raise FERRY_IT_COUCH_KILL_DOCS")
        #expect(await a.kill() == 128 + SIGKILL)
        let info = try await Ferry.run(["--data", a.dataDirectory, "info", "--json"])
        let stored = Int(try JSON.parse(info.stdout.trimmingCharacters(in: .whitespacesAndNewlines))["docCount"]?.intValue ?? -1)

        try await a.restart()
        try await waitUntil("every document reaches A", timeout: 120) {
            try await a.admin.get("/")["docCount"]?.intValue == Int64(total)
        }
        let status = try await a.replication("pull")["status"] ?? .null
        let listed = Int(status["total"]?.intValue ?? 0), pulled = Int(status["pulled"]?.intValue ?? 0)
        let duplicates = Int(try await a.admin.metric("ferry_documents_duplicate_total"))
        print("""
            puller killed: \(stored) of \(total) documents stored at the kill; after the restart \(listed) changes \
            listed (\(listed - (total - stored)) of them already stored), \(pulled) revisions fetched and stored, \
            \(duplicates) duplicates; batch \(batch)
            """)
        #expect(stored > batch, "too few documents stored before the kill to show a resume (\(stored))")
        #expect(listed - (total - stored) <= batch, "re-listed \(listed - (total - stored)) changes: more than one batch")
        #expect(listed < total, "the restarted pull started over (\(listed) changes listed)")
        #expect(pulled == total - stored && duplicates <= batch, "\(status)")
        try await cluster.awaitConvergence(among: [a, b])
        await finish(cluster, allowing: expectedRefusals)
    }

    /// SIGKILL of the node whose CouchDB API is being pulled from: the replication goes
    /// offline with a transient error, retries with backoff, and once the node runs again
    /// (on the same port) resumes from its checkpoint, re-listing at most one batch.
    @Test func aSourceKilledMidReplicationIsResumedFromTheCheckpoint() async throws {
        let total = Int(ProcessInfo.processInfo.environment["FERRY_IT_COUCH_KILL_DOCS"] ?? "") ?? 20_000
        let batch = ReplicatorConfiguration().batchSize
        let cluster = Cluster("couchrep-kill-source")
        defer { cluster.cleanUp() }
        let a = cluster.add("a"), b = try await seededSource(cluster, documents: total)
        let dbB = try await CouchDatabaseClient(b)
        guard let port = URLComponents(string: dbB.url)?.port else { throw HarnessError("no port in \(dbB.url)") }
        try await a.start()
        try await a.addReplication([
            "id": "pull", "url": .string(dbB.url), "direction": "pull", "continuous": true,
            "credentialsFile": .string(try b.couchCredentialsFile()),
        ])
        var seen = 0
        try await waitUntil("A stores \(total * 2 / 5) documents", timeout: 120, every: .milliseconds(20)) {
            seen = Int(try await a.admin.get("/")["docCount"]?.intValue ?? 0)
            return seen >= total * 2 / 5
        }
        #expect(seen < total, "the pull finished before the kill: raise FERRY_IT_COUCH_KILL_DOCS")
        #expect(await b.kill() == 128 + SIGKILL)
        let offline = try await a.awaitReplication("pull", "went offline") { $0["activity"] == "offline" }
        print("source killed at \(seen) of \(total) documents; the replication: \(offline.canonicalString)")
        // The later `--couch-port` wins over the harness's `--couch-port 0`: the same URL works again.
        try await b.restart(["--couch-port", String(port)])
        #expect(try await CouchDatabaseClient(b).url == dbB.url)
        try await waitUntil("every document reaches A", timeout: 120) {
            try await a.admin.get("/")["docCount"]?.intValue == Int64(total)
        }
        let status = try await a.awaitReplication("pull", "went idle") { $0["activity"] == "idle" }
        let listed = Int(status["total"]?.intValue ?? 0), pulled = Int(status["pulled"]?.intValue ?? 0)
        let duplicates = Int(try await a.admin.metric("ferry_documents_duplicate_total"))
        print("""
            source killed: \(pulled) revisions stored for \(total) documents, \(duplicates) fetched again; \
            \(listed - total) changes listed again after the reconnect (batch \(batch))
            """)
        // A page listed by the failed attempt and not finished is not counted (it is listed
        // again); what is counted twice was finished and then listed again from the checkpoint.
        #expect(listed - total <= batch && pulled == total && duplicates <= batch, "\(status)")
        #expect(status["error"] == .null, "the error outlived the recovery: \(status)")
        try await cluster.awaitConvergence(among: [a, b])
        await finish(cluster, allowing: expectedRefusals + ["replication offline", "Connection refused", "connection refused"])
    }

    /// The reference Python replicator (Integration/couch/refrep.py) and `ferry sync` with a
    /// CouchDB URL replicate one source (conflicts with both kinds of revision IDs, a deleted
    /// leaf, a deleted document, attachments on a winner and on a conflict leaf) into two
    /// fresh targets; the source and both targets agree on every winner, leaf, history and
    /// attachment, and a second `ferry sync` transfers nothing.
    @Test func theReferenceReplicatorAndFerrysAgreeOnEveryWinnerAndLeaf() async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        let cluster = Cluster("couchrep-refrep")
        defer { cluster.cleanUp() }
        let source = cluster.add("source"), byReference = cluster.add("by-reference"), byFerry = cluster.add("by-ferry")
        try await source.start()
        try await byReference.start()
        let src = try await CouchDatabaseClient(source)
        for i in 0..<30 { try await src.put("doc-\(i)", ["i": .int(Int64(i)), "even": .bool(i % 2 == 0)]) }
        // Three live leaves (one made here, two with CouchDB-made IDs) and a deleted one.
        let first = try await src.put("tree", ["v": 1])
        let firstHash = String(first.split(separator: "-")[1])
        try await src.put("tree", ["v": 2], rev: first)
        try await src.storeReplicated([
            child(of: "tree", firstHash, hash: String(repeating: "3c", count: 16), ["v": "couch-1"]),
            child(of: "tree", firstHash, hash: String(repeating: "4d", count: 16), ["v": "couch-2"],
                  attachments: ["leaf.txt": payload(4, 5_000)]),
            child(of: "tree", firstHash, hash: String(repeating: "5e", count: 16), [:], deleted: true),
        ])
        try await src.delete("doc-7", rev: try await src.document("doc-7")["_rev"]?.stringValue ?? "")
        let photo = payload(5, 40_000)
        let photoRev = try await src.put("photo", ["kind": "photo"], attachments: ["p.txt": photo])
        try await src.call("PUT", "/photo", body: ["kind": "photo", "v": 2, "_rev": .string(photoRev), "_attachments": ["p.txt": ["stub": true]]])

        // The reference replicator: source → by-reference.
        let refTarget = try await CouchDatabaseClient(byReference)
        var environment = ProcessInfo.processInfo.environment
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let reference = try await Shell.run(
            ["\(CouchSuite.directory)/refrep.py", try basicURL(source), src.name, try basicURL(byReference), refTarget.name],
            executable: python, environment: environment, timeout: 120)
        #expect(reference.status == 0, "refrep.py: \(reference.stdout)\(reference.stderr)")

        // Ferry's replicator: source → by-ferry's empty data directory, with `ferry sync`.
        let credentials = try source.couchCredentialsFile()
        let sync = ["--data", byFerry.dataDirectory, "sync", src.url, "--pull", "--credentials-file", credentials, "--json"]
        let once = try await Ferry.run(sync)
        #expect(once.status == 0, "ferry sync: \(once.stdout)\(once.stderr)")
        let summary = try JSON.parse(once.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        print("ferry sync: \(summary.canonicalString); refrep: \(reference.stdout)")
        // Each attachment's content counted once, as blob bytes: the leaf's 5,000 and the photo's 40,000.
        #expect(summary["blobsReceived"] == 2 && summary["blobBytesReceived"] == 45_000, "\(summary)")
        let again = try await Ferry.run(sync)
        let second = try JSON.parse(again.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(again.status == 0 && second["pulled"] == 0 && second["pushed"] == 0, "a second sync moved something: \(second)")
        try await byFerry.start()
        let ferryTarget = try await CouchDatabaseClient(byFerry)

        let want = try await src.snapshot()
        let fromReference = try await refTarget.snapshot(), fromFerry = try await ferryTarget.snapshot()
        #expect(want.count == 32, "\(want.keys.sorted())")
        #expect(fromReference == want, "reference replicator: \(snapshotDifferences(fromReference, want))")
        #expect(fromFerry == want, "ferry: \(snapshotDifferences(fromFerry, want))")
        #expect(want["tree"]?["leaves"]?.count == 4, "\(want["tree"] ?? .null)")
        for db in [refTarget, ferryTarget] {
            #expect(try await db.attachment("photo", "p.txt") == photo, "\(db.node.name)'s photo")
            let tree = try await db.document("tree")
            #expect(tree["_conflicts"]?.count == 2 && tree["_deleted_conflicts"]?.count == 1, "\(db.node.name): \(tree)")
        }
        await finish(cluster, allowing: expectedRefusals)
    }

    /// A source node holding `documents` documents of about 1 KiB (imported before it starts).
    func seededSource(_ cluster: Cluster, documents: Int) async throws -> Node {
        let b = cluster.add("b")
        let ndjson = cluster.root + "/docs.ndjson"
        _ = try DocumentFixtures.writeKiBDocuments(documents, to: ndjson)
        let imported = try await Ferry.run(["--data", b.dataDirectory, "import", ndjson])
        guard imported.status == 0 else { throw HarnessError("ferry import: \(imported.stderr)") }
        try await b.start()
        return b
    }

    /// The node's CouchDB base URL with its admin credentials, for the reference replicator.
    func basicURL(_ node: Node) throws -> String {
        guard let key = node.adminKey, var url = URLComponents(string: node.couchURL) else {
            throw HarnessError("\(node.name) has no CouchDB URL or admin key")
        }
        url.user = "admin"
        url.password = key
        return url.string ?? node.couchURL
    }
}

// In LabScenarios, which runs its tests one at a time: there is one lab per machine.
extension LabScenarios {
    /// A LAN of three Ferry nodes in the lab (mDNS, a full mesh) and one more node acting
    /// only as a CouchDB-protocol hub, with node1 replicating continuously with the hub's
    /// CouchDB API. A write on any LAN node reaches the hub, and one on the hub every LAN node; a
    /// conflict made on the hub and on a cut-off LAN node at once ends with the same winner
    /// everywhere; deletes and attachments survive the round trip; once converged, nothing
    /// writes new revisions.
    @Test func aLANMeshAndACouchDBHubConverge() async throws {
        try await withLab(3, "couch hub") { lab in
            let cluster = Cluster("couch-hub")
            defer { cluster.cleanUp() }
            let lan = (0..<3).map { cluster.add("node\($0 + 1)", host: lab.hosts[$0]) }
            // The hub runs on h1 beside node1, listening on h1's loopback only: a node's
            // CouchDB listener with the admin key is loopback-only by design (the LAN
            // listener takes configured users over HTTPS), and what is under test is the
            // replication protocol, not the route to the hub. It has its own group (so its
            // database is "hub"), no discovery and no trusted peers: only node1's CouchDB
            // replication reaches it.
            let hub = cluster.add("hub", host: lab.hosts[0])
            let ids = try await cluster.ids(lan)
            for (i, node) in lan.enumerated() {
                var args = ["--discovery", "--group", "lab", "--interface", "0.0.0.0"]
                for (j, id) in ids.enumerated() where j != i { args += ["--trust", id] }
                try await node.start(args)
            }
            try await hub.start(["--group", "hub", "--interface", "127.0.0.1"])
            var dbs: [CouchDatabaseClient] = []
            for node in lan + [hub] { dbs.append(try await CouchDatabaseClient(node)) }
            let hubDB = dbs[3]

            try await dbs[1].put("lan-1", ["from": "node2"])
            try await hubDB.put("hub-1", ["from": "hub"])
            try await lan[0].addReplication([
                "id": "hub", "url": .string(hubDB.url), "direction": "pushAndPull", "continuous": true,
                "credentialsFile": .string(try hub.couchCredentialsFile()),
            ])
            try await cluster.awaitConvergence(timeout: 90)
            #expect(try await hubDB.exists("lan-1"))
            #expect(try await dbs[2].exists("hub-1"))

            // Attachments made on the hub and on node3, deletes made on node2 and on the hub.
            let hubPhoto = payload(6, 25_000), lanPhoto = payload(7, 15_000)
            try await hubDB.put("hub-photo", ["kind": "photo"], attachments: ["h.txt": hubPhoto])
            try await dbs[2].put("lan-photo", ["kind": "photo"], attachments: ["l.txt": lanPhoto])
            try await dbs[1].delete("hub-1", rev: try await dbs[1].document("hub-1")["_rev"]?.stringValue ?? "")
            try await hubDB.delete("lan-1", rev: try await hubDB.document("lan-1")["_rev"]?.stringValue ?? "")
            try await cluster.awaitConvergence(timeout: 90)
            for db in dbs {
                #expect(try await db.attachment("hub-photo", "h.txt") == hubPhoto, "\(db.node.name)'s hub-photo")
                #expect(try await db.attachment("lan-photo", "l.txt") == lanPhoto, "\(db.node.name)'s lan-photo")
                #expect(try await !db.exists("hub-1"), "\(db.node.name) lost a delete")
                #expect(try await !db.exists("lan-1"), "\(db.node.name) lost a delete")
            }

            // A conflict: node3 is cut off, and it and the hub edit the same document.
            let base = try await dbs[1].put("clash", ["v": 0])
            try await cluster.awaitConvergence(timeout: 90)
            try await lab.partition(lab.hosts[2])
            try await dbs[2].put("clash", ["v": "node3"], rev: base)
            try await hubDB.put("clash", ["v": "hub"], rev: base)
            try await cluster.awaitConvergence(among: [lan[0], lan[1], hub], timeout: 60)
            try await lab.heal(lab.hosts[2])
            try await cluster.awaitConvergence(timeout: 120)
            var winners = Set<String>()
            for db in dbs {
                let clash = try await db.document("clash")
                winners.insert(clash["_rev"]?.stringValue ?? "-")
                #expect(clash["_conflicts"]?.count == 1, "\(db.node.name): \(clash)")
            }
            #expect(winners.count == 1, "winners differ: \(winners)")

            try await assertQuiescent(dbs, sentinelOn: dbs[2], timeout: 60)
            let status = try await lan[0].replication("hub")["status"] ?? .null
            print("hub replication: \(status.canonicalString)")
            #expect(status["rejected"] == 0, "\(status)")
            await finish(cluster, allowing: expectedRefusals + ["replication offline"])
        }
    }
}

/// Proves converged databases write nothing more: every snapshot is taken, a sentinel
/// written on `origin` is awaited everywhere, and each database then holds exactly what it
/// held plus the sentinel (the same winners, leaves, histories and attachments).
func assertQuiescent(_ dbs: [CouchDatabaseClient], sentinelOn origin: CouchDatabaseClient, timeout: Double = 30) async throws {
    var before: [[String: JSON]] = []
    for db in dbs { before.append(try await db.snapshot()) }
    for (db, snapshot) in zip(dbs.dropFirst(), before.dropFirst()) {
        #expect(snapshot == before[0], "\(db.node.name) differs from \(dbs[0].node.name): \(snapshotDifferences(snapshot, before[0]))")
    }
    let sentinel = "sentinel-\(UUID().uuidString.prefix(8).lowercased())"
    try await origin.put(sentinel, ["sentinel": true])
    for db in dbs { try await waitUntil("the sentinel reaches \(db.node.name)", timeout: timeout) { try await db.exists(sentinel) } }
    for (db, snapshot) in zip(dbs, before) {
        let after = try await db.snapshot().filter { $0.key != sentinel }
        #expect(after == snapshot, "\(db.node.name) wrote after converging: \(snapshotDifferences(after, snapshot))")
    }
}

/// A revision `2-hash` of `id` whose parent is `1-parentHash`, as a replicator sends it.
func child(
    of id: String, _ parentHash: String, hash: String, _ fields: [String: JSON], deleted: Bool = false,
    attachments: [String: String] = [:]
) -> JSON {
    var doc = fields
    doc["_id"] = .string(id)
    doc["_rev"] = .string("2-" + hash)
    doc["_revisions"] = ["start": 2, "ids": [.string(hash), .string(parentHash)]]
    if deleted { doc["_deleted"] = true }
    if !attachments.isEmpty {
        doc["_attachments"] = .object(attachments.mapValues { text -> JSON in
            ["content_type": "text/plain", "data": .string(Data(text.utf8).base64EncodedString())]
        })
    }
    return .object(doc)
}

/// `length` printable bytes, the same for the same seed.
func payload(_ seed: Int, _ length: Int) -> String {
    var state = UInt64(seed) &* 0x9E37_79B9_7F4A_7C15 | 1
    let letters = Array("abcdefghijklmnopqrstuvwxyz0123456789 \n".utf8)
    var bytes: [UInt8] = []
    bytes.reserveCapacity(length)
    for _ in 0..<length {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        bytes.append(letters[Int(state % UInt64(letters.count))])
    }
    return String(decoding: bytes, as: UTF8.self)
}
