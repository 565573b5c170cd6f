import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// CouchDB API users managed while a real `ferry serve` runs, with `ferry couch-user`, and
/// checked by a CouchDB client library from PyPI (pycouchdb) and plain HTTP (requests):
/// a change applies to the next request, with no restart.
@Suite(.serialized, .timeLimit(.minutes(5))) struct CouchUserScenarios {
    /// What one client call did: status 200 when pycouchdb succeeded; when it raised, the
    /// exception and the HTTP status the same request gets (pycouchdb reports a 401 on its
    /// first HEAD as a bare GenericError).
    static let client = #"""
        import json, sys, pycouchdb, requests
        url, db, name, password, action = sys.argv[1:6]
        base = url.replace("http://", f"http://{name}:{password}@", 1)
        if action == "login":
            r = requests.post(url + "_session", data={"name": name, "password": password})
            print(json.dumps({"status": r.status_code, "cookie": r.cookies.get("AuthSession", "")}))
            sys.exit(0)
        if action == "cookie":
            r = requests.get(url + db, cookies={"AuthSession": password})
            print(json.dumps({"status": r.status_code}))
            sys.exit(0)
        doc_id = sys.argv[6]
        try:
            database = pycouchdb.Server(base).database(db)
            if action == "write":
                database.save({"_id": doc_id, "text": "hi"})
            else:
                database.get(doc_id)
            print(json.dumps({"status": 200}))
        except pycouchdb.exceptions.Error as e:
            if action == "write":
                r = requests.put(f"{url}{db}/{doc_id}-check", json={"text": "hi"}, auth=(name, password))
            else:
                r = requests.get(f"{url}{db}/{doc_id}", auth=(name, password))
            print(json.dumps({"status": r.status_code, "error": type(e).__name__ + ": " + str(e)}))
        """#

    /// One client call; answers the JSON it printed.
    func call(_ node: Node, _ name: String, _ password: String, _ action: String, _ extra: [String] = []) async throws -> JSON {
        let python = CouchSuite.python
        let db = try await node.admin.get("/")["group"]?.stringValue ?? "ferry"
        let result = try await Shell.run(
            ["-c", Self.client, try CouchSuite.couchURL(node), db, name, password, action] + extra, executable: python,
            environment: ["PYTHONDONTWRITEBYTECODE": "1"], timeout: 60)
        guard result.status == 0, let json = try? JSON.parse(Array(result.stdout.utf8)) else {
            throw HarnessError("client \(action) failed (\(result.status)): \(result.stdout) \(result.stderr)")
        }
        return json
    }

    func status(_ json: JSON) -> String {
        json["status"]?.intValue.map(String.init) ?? json["status"]?.stringValue ?? "?"
    }

    /// Added, restricted, given a new password, and removed through the CLI while the node
    /// runs: each change holds at the next request, sessions of a removed user end, the user
    /// survives a restart, and no password appears in the node's log, the CLI's output or
    /// the users file.
    @Test func usersAddedChangedAndRemovedWhileTheNodeRunsApplyAtOnce() async throws {
        guard FileManager.default.isExecutableFile(atPath: CouchSuite.python) else {
            Issue.record("\(CouchSuite.python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        let cluster = Cluster("couch-users")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        try await a.start(["--couch-port", "0"])
        let data = a.dataDirectory
        let first = "first-Secret-4711", second = "second-Secret-0815"

        #expect(status(try await call(a, "tablet", first, "write", ["note-1"])) == "401")
        let added = try await Ferry.run(
            ["--data", data, "couch-user", "add", "tablet", "--read", "note-*", "--write", "note-*"], stdin: first + "\n")
        #expect(added.status == 0, "\(added.stderr)")
        #expect(status(try await call(a, "tablet", first, "write", ["note-1"])) == "200")
        #expect(status(try await call(a, "tablet", first, "write", ["order-1"])) == "403", "the write rule holds at once")

        let listed = try await Ferry.run(["--data", data, "--json", "couch-user", "ls"])
        let users = try JSON.parse(Array(listed.stdout.utf8))
        #expect(users.items.map { $0["name"]?.stringValue } == ["tablet"])
        #expect(users.items.first?["source"]?.stringValue == "api")

        let login = try await call(a, "tablet", first, "login")
        let cookie = login["cookie"]?.stringValue ?? ""
        #expect(status(login) == "200" && !cookie.isEmpty)
        #expect(status(try await call(a, "", cookie, "cookie")) == "200")

        let changed = try await Ferry.run(["--data", data, "couch-user", "set", "tablet", "--password"], stdin: second + "\n")
        #expect(changed.status == 0, "\(changed.stderr)")
        #expect(status(try await call(a, "tablet", first, "read", ["note-1"])) == "401", "the old password no longer works")
        #expect(status(try await call(a, "tablet", second, "read", ["note-1"])) == "200")
        #expect(status(try await call(a, "", cookie, "cookie")) == "401", "a session of the old password ends")

        let widened = try await Ferry.run(["--data", data, "couch-user", "set", "tablet", "--write-all"])
        #expect(widened.status == 0, "\(widened.stderr)")
        #expect(status(try await call(a, "tablet", second, "write", ["order-1"])) == "200")

        // A restart keeps the run-time user (DATA/couch-users.json).
        try await a.restart()
        #expect(status(try await call(a, "tablet", second, "read", ["note-1"])) == "200")
        #expect(status(try await call(a, "tablet", second, "read", ["order-1"])) == "404", "its read rule still hides other documents")

        let cookie2 = try await call(a, "tablet", second, "login")["cookie"]?.stringValue ?? ""
        let removed = try await Ferry.run(["--data", data, "couch-user", "rm", "tablet"])
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(status(try await call(a, "tablet", second, "read", ["note-1"])) == "401")
        #expect(status(try await call(a, "", cookie2, "cookie")) == "401", "a removed user's session ends")
        let again = try await Ferry.run(["--data", data, "couch-user", "rm", "tablet"])
        #expect(again.status == 3 && again.stderr.contains("no CouchDB user tablet"), "\(again.stderr)")

        let file = (try? String(contentsOfFile: data + "/couch-users.json", encoding: .utf8)) ?? ""
        for text in [a.log, added.stdout + added.stderr, changed.stdout + changed.stderr, file] {
            #expect(!text.contains(first) && !text.contains(second), "a password was written out")
        }
        #expect(a.log.contains("CouchDB user added"))
        await finish(cluster, allowing: expectedRefusals)
    }

    /// Bad input gets a clear error and changes nothing: a reserved name, an empty password,
    /// a user that exists, and a change that names nothing.
    @Test func badUserCommandsAreRefusedWithAReason() async throws {
        let cluster = Cluster("couch-users-bad")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        try await a.start(["--couch-port", "0"])
        let data = a.dataDirectory
        let reserved = try await Ferry.run(["--data", data, "couch-user", "add", "admin"], stdin: "x\n")
        #expect(reserved.status == 64 && reserved.stderr.contains("reserved"), "\(reserved.stderr)")
        let empty = try await Ferry.run(["--data", data, "couch-user", "add", "tablet"], stdin: "\n")
        #expect(empty.status == 64 && empty.stderr.contains("the password is empty"), "\(empty.stderr)")
        #expect(try await Ferry.run(["--data", data, "couch-user", "add", "tablet"], stdin: "pw\n").status == 0)
        let twice = try await Ferry.run(["--data", data, "couch-user", "add", "tablet"], stdin: "other\n")
        #expect(twice.status == 4 && twice.stderr.contains("exists"), "\(twice.stderr)")
        let nothing = try await Ferry.run(["--data", data, "couch-user", "set", "tablet"])
        #expect(nothing.status == 64 && nothing.stderr.contains("nothing to change"), "\(nothing.stderr)")
        let both = try await a.admin.call("POST", "/couch/users", body: #"{"name":"x","password":"a","passwordHash":"b"}"#)
        #expect(both.status == 400 && both.text.contains("not both"), "\(both.text)")
        let listed = try await a.admin.get("/couch/users")
        #expect(listed["users"]?.items.count == 1)
        #expect(!(try await a.admin.call("GET", "/couch/users").text.contains("pbkdf2")), "the list never carries a hash")
        await finish(cluster)
    }
}
