import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The CouchDB HTTP API proven by code nobody here wrote: two real `ferry serve` nodes of one
/// group, and the Python suite of Integration/couch run against their CouchDB listeners —
/// CouchDB client libraries from PyPI, a conformance suite written from the CouchDB 3.x API
/// reference, and a reference replicator (Replication Protocol v3) between the two nodes.
@Suite(.serialized, .timeLimit(.minutes(10))) struct CouchClientScenarios {
    /// `ibmcloudant` and `pycouchdb` drive documents, bulk operations, changes feeds,
    /// attachments, conflicts and local documents, and their results are checked.
    @Test func couchDBClientLibrariesWorkAgainstANode() async throws {
        try await runSuite("test_clients.py", label: "couch-clients")
    }

    /// Every endpoint and option of the API, including those only a replicator uses, with
    /// CouchDB's statuses and error shapes.
    @Test func theCouchDBAPIConformsToTheSpecification() async throws {
        try await runSuite("test_conformance.py", label: "couch-conformance")
    }

    /// The reference replicator replicates node A → B and B → A with conflicts, deletions
    /// and attachments; the nodes converge, a second run transfers nothing, and the
    /// checkpoints stay in `_local`.
    @Test func aReferenceReplicatorConvergesTwoNodesOverTheCouchDBAPI() async throws {
        try await runSuite("test_reference_replicator.py", label: "couch-refrep")
    }

    /// `since` values a node handed out (from `_changes` and from the database info) still
    /// work after the node restarts: only later changes are listed.
    @Test func sequencesFromBeforeARestartStillWorkAsSince() async throws {
        let cluster = Cluster("couch-restart")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        try await a.start(["--couch-port", "0"])
        var couch = try CouchSuite.client(a)
        let db = try await a.admin.get("/")["group"]?.stringValue ?? "ferry"
        for i in 0..<3 { try await CouchSuite.expect(couch.call("PUT", "/\(db)/before-\(i)", body: #"{"i":\#(i)}"#), 201) }
        let infoSeq = try await CouchSuite.expect(couch.call("GET", "/\(db)"), 200).json["update_seq"] ?? .null
        try await CouchSuite.expect(couch.call("PUT", "/\(db)/between", body: "{}"), 201)
        let changesSeq = try await CouchSuite.expect(couch.call("GET", "/\(db)/_changes"), 200).json["last_seq"] ?? .null

        _ = await a.stop()
        try await a.restart()
        couch = try CouchSuite.client(a)
        try await CouchSuite.expect(couch.call("PUT", "/\(db)/after", body: "{}"), 201)
        for (seq, expected) in [(infoSeq, ["between", "after"]), (changesSeq, ["after"])] {
            let since = seq.stringValue ?? seq.intValue.map(String.init) ?? "\(seq)"
            let query = since.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? since
            let rows = try await CouchSuite.expect(couch.call("GET", "/\(db)/_changes?since=\(query)"), 200).json["results"]?.items ?? []
            #expect(rows.compactMap { $0["id"]?.stringValue } == expected, "since=\(since) after a restart: \(rows)")
        }
        await finish(cluster, allowing: expectedRefusals)
    }

    /// A document with CouchDB-made revision IDs (N- and 32 hex), stored on A through the
    /// CouchDB API with `new_edits=false`, replicates to B over Ferry's own protocol and is
    /// served there unchanged: the same leaves, the same history, the same winner.
    @Test func couchDBRevisionIDsCrossFerryReplicationUnchanged() async throws {
        let cluster = Cluster("couch-foreign")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        let (idA, idB) = (try await a.id, try await b.id)
        try await a.start(["--couch-port", "0", "--trust", idB])
        try await b.start(["--couch-port", "0", "--trust", idA, "--peer", "\(a.url)#\(idA)"])
        let db = try await a.admin.get("/")["group"]?.stringValue ?? "ferry"
        let (couchA, couchB) = (try CouchSuite.client(a), try CouchSuite.client(b))
        let base = "1-" + String(repeating: "a1", count: 16)
        let left = "2-" + String(repeating: "b2", count: 16), right = "2-" + String(repeating: "c3", count: 16)
        for (rev, side) in [(left, "left"), (right, "right")] {
            let hash = rev.dropFirst(2), baseHash = base.dropFirst(2)
            let doc = #"{"_id":"foreign","_rev":"\#(rev)","side":"\#(side)","_revisions":{"start":2,"ids":["\#(hash)","\#(baseHash)"]}}"#
            let r = try await CouchSuite.expect(couchA.call("POST", "/\(db)/_bulk_docs", body: #"{"new_edits":false,"docs":[\#(doc)]}"#), 201)
            #expect(!r.text.contains("error"), "A refused \(rev): \(r.text)")
        }
        try await cluster.awaitConvergence()
        let path = "/\(db)/foreign?open_revs=all&revs=true"
        let leavesA = try await CouchSuite.expect(couchA.call("GET", path, headers: ["Accept": "application/json"]), 200).json
        let leavesB = try await CouchSuite.expect(couchB.call("GET", path, headers: ["Accept": "application/json"]), 200).json
        func histories(_ leaves: JSON) -> Set<String> {
            Set(leaves.items.compactMap { item in
                item["ok"].map { doc in
                    let ids = doc["_revisions"]?["ids"]?.items.compactMap { $0.stringValue } ?? []
                    return "\(doc["_rev"]?.stringValue ?? "-") \(ids.joined(separator: ","))"
                }
            })
        }
        #expect(histories(leavesA) == histories(leavesB), "A: \(leavesA)\nB: \(leavesB)")
        #expect(histories(leavesB) == ["\(left) \(left.dropFirst(2)),\(base.dropFirst(2))", "\(right) \(right.dropFirst(2)),\(base.dropFirst(2))"])
        let winnerB = try await CouchSuite.expect(couchB.call("GET", "/\(db)/foreign?conflicts=true"), 200).json
        // CouchDB's rule: same generation, the higher hash wins ("c3…" > "b2…").
        #expect(winnerB["_rev"]?.stringValue == right && winnerB["_conflicts"] == .array([.string(left)]), "\(winnerB)")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// Starts two nodes that share a group (so one database name) and do not replicate with
    /// each other natively, runs one pytest file against them, and fails with its output.
    private func runSuite(_ file: String, label: String) async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        let cluster = Cluster(label)
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        try await a.start(["--couch-port", "0"])
        try await b.start(["--couch-port", "0"])
        let (groupA, groupB) = (try await a.admin.get("/")["group"]?.stringValue, try await b.admin.get("/")["group"]?.stringValue)
        #expect(groupA == groupB, "the two nodes serve different databases: \(groupA ?? "-") and \(groupB ?? "-")")
        let urlA = try CouchSuite.couchURL(a), urlB = try CouchSuite.couchURL(b)

        var environment = ProcessInfo.processInfo.environment
        environment["FERRY_COUCH_URL_A"] = urlA
        environment["FERRY_COUCH_URL_B"] = urlB
        environment["FERRY_COUCH_DB"] = groupA ?? "ferry"
        environment["FERRY_COUCH_USER"] = "admin"
        environment["FERRY_COUCH_PASSWORD"] = try CouchSuite.adminKey(a)
        environment["FERRY_COUCH_USER_B"] = "admin"
        environment["FERRY_COUCH_PASSWORD_B"] = try CouchSuite.adminKey(b)
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let result = try await Shell.run(
            ["-m", "pytest", "\(CouchSuite.directory)/\(file)", "-q", "-x", "-p", "no:cacheprovider", "-rfE"],
            executable: python, environment: environment, timeout: 480)
        let output = result.stdout + (result.stderr.isEmpty ? "" : "\n--- stderr ---\n" + result.stderr)
        if result.status != 0 {
            Attachment.record(output, named: "pytest-\(file).txt")
            let tail = output.split(separator: "\n", omittingEmptySubsequences: false).suffix(120).joined(separator: "\n")
            Issue.record("pytest \(file) exited \(result.status) against \(urlA) and \(urlB):\n\(tail)")
        }
        await finish(cluster, allowing: expectedRefusals)
    }
}

/// Where the Python suite lives and how a node is reached through its CouchDB API.
enum CouchSuite {
    /// The package root, from this file's place in it (Integration/Scenarios/).
    static let root: String = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
    static var directory: String { root + "/Integration/couch" }
    static var python: String { root + "/.venv-couch/bin/python" }

    /// The node's CouchDB base URL from its node.json (`http://127.0.0.1:PORT/`).
    static func couchURL(_ node: Node) throws -> String {
        guard let url = node.info["couchURL"]?.stringValue, !url.isEmpty else {
            throw HarnessError("\(node.name)'s node.json names no couchURL: \(node.info)")
        }
        return url.hasSuffix("/") ? url : url + "/"
    }

    /// A client of the node's CouchDB API, authenticated with its admin key (Bearer).
    static func client(_ node: Node) throws -> AdminClient {
        AdminClient(base: String(try couchURL(node).dropLast()), host: nil, key: try adminKey(node))
    }

    /// The reply, when its status is `status`; otherwise a failure naming the request.
    @discardableResult
    static func expect(_ reply: AdminClient.Reply, _ status: Int, sourceLocation: SourceLocation = #_sourceLocation) throws
        -> AdminClient.Reply
    {
        guard reply.status == status else {
            throw HarnessError("CouchDB API answered \(reply.status), expected \(status): \(reply.text.prefix(500))")
        }
        return reply
    }

    /// The node's admin key, from the file its node.json names (else DATA/admin.key).
    /// Runs one pytest file with `environment` added (the node's CouchDB URL, users...) and
    /// records pytest's output as an issue when it fails.
    static func pytest(
        _ file: String, environment extra: [String: String], timeout: Double = 300, sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch", sourceLocation: sourceLocation)
            return
        }
        var environment = ProcessInfo.processInfo.environment
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        environment.merge(extra) { _, new in new }
        let result = try await Shell.run(
            ["-m", "pytest", file, "-q", "-p", "no:cacheprovider", "-rfE"], executable: python, environment: environment, timeout: timeout)
        if result.status != 0 {
            let name = (file as NSString).lastPathComponent
            Issue.record(
                "pytest \(name) exited \(result.status):\n\(result.stdout.suffix(6000))\n\(result.stderr.suffix(2000))", sourceLocation: sourceLocation)
        }
    }

    static func adminKey(_ node: Node) throws -> String {
        let path = node.info["adminKeyFile"]?.stringValue ?? node.dataDirectory + "/admin.key"
        guard let key = try? String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines),
            !key.isEmpty
        else { throw HarnessError("\(node.name) has no admin key at \(path)") }
        return key
    }
}
