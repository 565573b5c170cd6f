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

    /// The node's admin key, from the file its node.json names (else DATA/admin.key).
    static func adminKey(_ node: Node) throws -> String {
        let path = node.info["adminKeyFile"]?.stringValue ?? node.dataDirectory + "/admin.key"
        guard let key = try? String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines),
            !key.isEmpty
        else { throw HarnessError("\(node.name) has no admin key at \(path)") }
        return key
    }
}
