import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Attacks on a real node's store through the CouchDB API (Integration/attacks/test_store.py):
/// wide documents and large `_revs_diff` requests stay bounded, `_revs_diff` reveals nothing of
/// a document the user may not read, and the running node deletes blobs nothing refers to.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackStoreScenarios {
    @Test func wideDocumentsRevsDiffProbesAndOrphanBlobsAreBounded() async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        let cluster = Cluster("attack-store")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let passwordFile = cluster.root + "/reader.password"
        try FileManager.default.createDirectory(atPath: cluster.root, withIntermediateDirectories: true)
        try "reader-pass-4711\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let made = try await Ferry.run(["couch-user", "reader", "--password-file", passwordFile, "--iterations", "10000"])
        guard var user = try? JSON.parse(Array(made.stdout.utf8)).objectValue else {
            Issue.record("ferry couch-user printed no entry: \(made.stdout) \(made.stderr)")
            return
        }
        user["policy"] = try JSON.parse(Array(#"{"read":{"types":["note"]},"write":{"types":["note"]},"mayDelete":false}"#.utf8))
        let config = cluster.root + "/a.json"
        try #"""
            {"discovery":{"enabled":false},"couch":{"users":[\#(JSON.object(user).canonicalString)]},
             "blobCollection":{"intervalSeconds":2,"graceSeconds":1}}
            """#.write(toFile: config, atomically: true, encoding: .utf8)
        try await a.start(["--config", config, "--couch-port", "0"])
        var environment = ProcessInfo.processInfo.environment
        environment["FERRY_COUCH_URL"] = try CouchSuite.couchURL(a)
        environment["FERRY_COUCH_DB"] = try await a.admin.get("/")["group"]?.stringValue ?? "ferry"
        environment["FERRY_ADMIN_KEY"] = try CouchSuite.adminKey(a)
        environment["FERRY_DATA"] = a.dataDirectory
        environment["FERRY_USER"] = "reader"
        environment["FERRY_USER_PASSWORD"] = "reader-pass-4711"
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let result = try await Shell.run(
            ["-m", "pytest", CouchSuite.root + "/Integration/attacks/test_store.py", "-q", "-s", "-p", "no:cacheprovider", "-rfE"],
            executable: python, environment: environment, timeout: 480)
        print(result.stdout.suffix(3000))
        if result.status != 0 {
            Issue.record("pytest test_store.py exited \(result.status):\n\(result.stdout.suffix(6000))\n\(result.stderr.suffix(2000))")
        }
        let bytes = try await a.admin.metric("ferry_blobs_collected_bytes_total", labelsContaining: [])
        #expect(bytes >= Double(3 << 20), "the node counted \(bytes) bytes collected")
        await finish(cluster, allowing: expectedRefusals + ["forbidden"])
    }
}
