import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Mango indexes between real `ferry serve` nodes of one group: an index defined through one
/// node's CouchDB API (`POST /{db}/_index`) is a design document, so it replicates; the peer
/// builds it and answers `_find` from it, and deleting it on the first node removes it there.
/// Also runs Integration/couch/test_find.py (CouchDB client libraries from PyPI) against a node.
@Suite(.serialized, .timeLimit(.minutes(10))) struct FindReplicationScenarios {
    static let noIndex = "No matching index found"

    @Test func anIndexDefinedOnOneNodeIsBuiltOnItsPeerAndAnswersThereUntilItIsDeleted() async throws {
        let cluster = Cluster("find-replication")
        defer { cluster.cleanUp() }
        let a = cluster.add("a"), b = cluster.add("b")
        let (idA, idB) = (try await a.id, try await b.id)
        try await a.start(["--trust", idB])
        try await b.start(["--trust", idA, "--peer", "\(a.url)#\(idA)"])
        let dbA = try await CouchDatabaseClient(a), dbB = try await CouchDatabaseClient(b)

        // Documents on both sides, some before the index exists and some after; a few lack
        // the field or hold another type, which sorts after numbers.
        var years: [String: JSON] = [:]
        for i in 0..<20 {
            let year = JSON.int(Int64(1950 + (i * 7) % 60))
            years["a-\(i)"] = year
            try await dbA.put("a-\(i)", ["year": year, "title": .string("A \(i)")])
        }
        let made = try await dbA.call(
            "POST", "/_index", body: ["index": ["fields": ["year"]], "ddoc": "films", "name": "by-year", "type": "json"]
        ).json
        #expect(made["result"] == "created" && made["id"] == "_design/films" && made["name"] == "by-year", "\(made)")
        for i in 0..<20 {
            let year = JSON.int(Int64(1955 + (i * 11) % 60))
            years["b-\(i)"] = year
            try await dbB.put("b-\(i)", ["year": year, "title": .string("B \(i)")])
        }
        try await dbA.put("a-text", ["year": "nineteen-eighty"])
        years["a-text"] = "nineteen-eighty"
        try await dbB.put("b-none", ["title": "no year"])
        try await cluster.awaitConvergence(among: [a, b])

        // B lists the same index, in the same design document.
        try await waitUntil("B lists the index made on A") {
            try await Self.indexNames(dbB).contains("_design/films/by-year")
        }
        #expect(try await Self.indexNames(dbA) == Self.indexNames(dbB))

        // B answers from it once built: the same documents as A, in index order, no warning.
        let query: JSON = ["selector": ["year": ["$gte": 1970]], "sort": [["year": "asc"]], "limit": 1000]
        try await waitUntil("B answers the sorted query from its index") {
            let r = try await dbB.call("POST", "/_find", body: query, expect: [200, 400])
            return r.status == 200 && !(r.json["warning"]?.stringValue ?? "").contains(Self.noIndex)
        }
        let expected = years.filter { _, year in
            if case .int(let y) = year { return y >= 1970 }
            return true
        }.sorted { x, y in
            let (p, q) = (Self.sortRank(x.value), Self.sortRank(y.value))
            return p != q ? p < q : x.key < y.key
        }.map(\.key)
        for db in [dbA, dbB] {
            let answer = try await db.call("POST", "/_find", body: query).json
            let ids = answer["docs"]?.items.compactMap { $0["_id"]?.stringValue } ?? []
            #expect(ids == expected, "\(db.node.name): \(ids)")
            let warning = answer["warning"]?.stringValue ?? ""
            #expect(!warning.contains(Self.noIndex), "\(db.node.name): \(warning)")
            let explained = try await db.call("POST", "/_explain", body: query).json
            #expect(explained["index"]?["ddoc"] == "_design/films" && explained["index"]?["name"] == "by-year", "\(db.node.name): \(explained)")
        }

        // A later write on B is in B's index at once (the same transaction as the write).
        try await dbB.put("b-late", ["year": 1999])
        let late = try await dbB.call("POST", "/_find", body: ["selector": ["year": 1999], "sort": ["year"]]).json
        #expect(late["docs"]?.items.compactMap { $0["_id"]?.stringValue }.contains("b-late") == true, "\(late)")

        // Deleted on A, the index disappears from B; B then scans, and says so.
        try await dbA.call("DELETE", "/_index/films/json/by-year")
        #expect(try await !Self.indexNames(dbA).contains("_design/films/by-year"))
        try await cluster.awaitConvergence(among: [a, b])
        try await waitUntil("the index is gone from B") {
            try await !Self.indexNames(dbB).contains("_design/films/by-year")
        }
        let scanned = try await dbB.call("POST", "/_find", body: ["selector": ["year": ["$gte": 1970]], "limit": 1000]).json
        let warning = scanned["warning"]?.stringValue ?? ""
        #expect(warning.contains(Self.noIndex), "\(scanned)")
        #expect(Set(scanned["docs"]?.items.compactMap { $0["_id"]?.stringValue } ?? []) == Set(expected + ["b-late"]))
        let refused = try await dbB.call("POST", "/_find", body: query, expect: [400]).json
        #expect(refused["error"] == "no_usable_index", "\(refused)")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// `ibmcloudant` and `pycouchdb` create, list, use, explain and delete indexes and run
    /// `_find` with fields, sorts, limits, bookmarks and statistics against a node.
    @Test func couchDBClientLibrariesQueryAndIndexANode() async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        let cluster = Cluster("find-clients")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        try await a.start()
        var environment = ProcessInfo.processInfo.environment
        environment["FERRY_COUCH_URL_A"] = try CouchSuite.couchURL(a)
        environment["FERRY_COUCH_DB"] = try await a.admin.get("/")["group"]?.stringValue ?? "ferry"
        environment["FERRY_COUCH_USER"] = "admin"
        environment["FERRY_COUCH_PASSWORD"] = try CouchSuite.adminKey(a)
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let result = try await Shell.run(
            ["-m", "pytest", "\(CouchSuite.directory)/test_find.py", "-q", "-x", "-p", "no:cacheprovider", "-rfE"],
            executable: python, environment: environment, timeout: 300)
        if result.status != 0 {
            let output = result.stdout + "\n--- stderr ---\n" + result.stderr
            Attachment.record(output, named: "pytest-test_find.py.txt")
            Issue.record("pytest test_find.py exited \(result.status):\n\(output.split(separator: "\n").suffix(120).joined(separator: "\n"))")
        }
        await finish(cluster, allowing: expectedRefusals)
    }

    /// `ddoc/name` of every JSON index the node lists.
    static func indexNames(_ db: CouchDatabaseClient) async throws -> [String] {
        let listed = try await db.call("GET", "/_index").json
        return (listed["indexes"]?.items ?? []).compactMap { index in
            guard let ddoc = index["ddoc"]?.stringValue, let name = index["name"]?.stringValue else { return nil }
            return ddoc + "/" + name
        }.sorted()
    }

    /// Numbers sort before strings (CouchDB's collation); numbers by value.
    static func sortRank(_ v: JSON) -> Int64 {
        if case .int(let i) = v { return i }
        return Int64.max
    }
}
