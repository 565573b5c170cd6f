import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Access by content on loopback with real `ferry serve` processes: a clinic whose group
/// rules give each ward's stations only that ward's patients (a Mango selector on `ward`),
/// enforced by every node, with removal when a patient moves or a role is taken away.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AccessScenarios {
    /// The clinic's four hosts after `invite`/`join`, rules and roles: the admin's station
    /// (supervisor: everything), two ward-a stations and one ward-b station.
    struct Clinic {
        let cluster: Cluster
        let admin: Node, wardA: Node, wardB: Node, wardA2: Node
        var all: [Node] { [admin, wardA, wardB, wardA2] }
    }

    func ferry(_ node: Node, _ args: [String], stdin: String? = nil) async throws -> Ferry.Result {
        try await Ferry.run(["--data", node.dataDirectory] + args, stdin: stdin)
    }

    func ids(_ node: Node) async throws -> Set<String> {
        Set(try await node.admin.revisions().keys.filter { !$0.hasPrefix("_ferry/") })
    }

    func makeClinic(_ name: String, extra: [String] = []) async throws -> Clinic {
        let cluster = Cluster(name)
        let c = Clinic(cluster: cluster, admin: cluster.add("admin"), wardA: cluster.add("ward-a"), wardB: cluster.add("ward-b"), wardA2: cluster.add("ward-a2"))
        let noAvahi = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"]
        for n in c.all { try await n.start(["--discovery"] + extra, environment: noAvahi) }
        for n in [c.wardA, c.wardB, c.wardA2] {
            let invite = try await ferry(c.admin, ["invite", "--json"])
            #expect(invite.status == 0, "\(invite.stderr)")
            let code = try JSON.parse(invite.stdout.trimmingCharacters(in: .whitespacesAndNewlines))["code"]?.stringValue ?? ""
            let joined = try await ferry(n, ["join", code])
            #expect(joined.status == 0, "\(joined.stderr)")
        }
        // As an operator types it (docs/operations.md, "Access by content").
        let steps: [[String]] = [
            ["access", "roles", "admin", "supervisor"],
            ["access", "rule", "add", "everything", "--role", "supervisor", "--read-all", "--write-all", "--delete"],
            ["access", "rule", "add", "ward-a", "--role", "ward-a", "--read-selector", #"{"ward":"a"}"#, "--write-selector", #"{"ward":"a"}"#],
            ["access", "rule", "add", "ward-b", "--role", "ward-b", "--read-selector", #"{"ward":"b"}"#, "--write-selector", #"{"ward":"b"}"#],
            ["access", "roles", "ward-a", "ward-a"],
            ["access", "roles", "ward-a2", "ward-a"],
            ["access", "roles", "ward-b", "ward-b"],
        ]
        for step in steps {
            let r = try await ferry(c.admin, step)
            #expect(r.status == 0, "\(step.joined(separator: " ")): \(r.stderr)")
        }
        let version = try await c.admin.admin.get("/access")["version"]?.stringValue ?? ""
        try await waitUntil("every host has the rules", timeout: 30) {
            for n in c.all { guard try await n.admin.get("/access")["version"]?.stringValue == version else { return false } }
            return true
        }
        return c
    }

    @Test func wardStationsHoldOnlyTheirWardAndLoseAMovedPatient() async throws {
        let c = try await makeClinic("access-clinic", extra: ["--couch-port", "0"])
        defer { c.cluster.cleanUp() }
        for (id, ward) in [("patient-1", "a"), ("patient-2", "b"), ("patient-3", "a"), ("patient-4", "b")] {
            try await c.admin.admin.put(id, #"{"ward":"\#(ward)","name":"\#(id)"}"#)
        }
        let wardADocs: Set = ["patient-1", "patient-3"], wardBDocs: Set = ["patient-2", "patient-4"]
        try await waitUntil("each station holds exactly its ward", timeout: 30) {
            let a = try await ids(c.wardA), a2 = try await ids(c.wardA2), b = try await ids(c.wardB)
            return a == wardADocs && a2 == wardADocs && b == wardBDocs
        }
        #expect(try await ids(c.admin) == wardADocs.union(wardBDocs))

        // A ward-a station writes its own ward: it reaches the other ward-a station and the admin, never ward b.
        try await c.wardA.admin.put("patient-5", #"{"ward":"a","name":"new"}"#)
        try await waitUntil("the ward-a write reaches ward a and the admin", timeout: 30) {
            let a2 = try await ids(c.wardA2), admin = try await ids(c.admin)
            return a2.contains("patient-5") && admin.contains("patient-5")
        }
        #expect(try await !ids(c.wardB).contains("patient-5"))
        // A ward-a station may not write a ward-b patient: refused locally (403).
        let forbidden = try await c.wardA.admin.call("PUT", "/docs/patient-6", body: #"{"ward":"b"}"#)
        #expect(forbidden.status == 403, "\(forbidden.text)")

        // The explain answer names the rule.
        let explained = try await ferry(c.admin, ["--json", "access", "explain", "patient-2", "--for", "ward-a"])
        let answer = try JSON.parse(explained.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(answer["read"]?["allowed"]?.boolValue == false, "\(answer)")
        let admitted = try JSON.parse(try await ferry(c.admin, ["--json", "access", "explain", "patient-1", "--for", "ward-a"]).stdout)
        #expect(admitted["read"]?["rule"]?.stringValue == "ward-a", "\(admitted)")

        // The CouchDB API as a ward-a user, on the admin's node (which holds everything).
        let password = "ward-A-Secret-4711"
        let added = try await ferry(c.admin, ["couch-user", "add", "nurse-a"], stdin: password + "\n")
        #expect(added.status == 0, "\(added.stderr)")
        #expect(try await ferry(c.admin, ["access", "roles", "user:nurse-a", "ward-a"]).status == 0)
        try await waitUntil("the nurse's role is in force", timeout: 10) {
            try await c.admin.admin.get("/access")["roles"]?.items.contains { $0["principal"]?.stringValue == "user:nurse-a" } == true
        }
        let couch = try await CouchDatabaseClient(c.admin)
        let nurse = AdminClient(base: couch.client.base, host: nil, key: nil)
        let basic = ["Authorization": "Basic " + Data("nurse-a:\(password)".utf8).base64EncodedString()]
        let allDocs = try await nurse.call("GET", "/\(couch.name)/_all_docs", headers: basic)
        let seen = Set(allDocs.json["rows"]?.items.compactMap { $0["id"]?.stringValue }.filter { !$0.hasPrefix("_") } ?? [])
        #expect(seen == wardADocs.union(["patient-5"]), "\(allDocs.text)")
        #expect(try await nurse.call("GET", "/\(couch.name)/patient-2", headers: basic).status == 404)
        let changes = try await nurse.call("GET", "/\(couch.name)/_changes", headers: basic)
        #expect(!changes.text.contains("patient-2") && !changes.text.contains("patient-4"), "\(changes.text)")
        let write = try await nurse.call("PUT", "/\(couch.name)/patient-7", body: #"{"ward":"b"}"#, headers: basic)
        #expect(write.status == 403, "\(write.text)")
        // A CouchDB-protocol pull as that user gets ward a only.
        let pulled = c.cluster.root + "/nurse-pull"
        let port = URL(string: couch.client.base)?.port ?? 0
        let sync = try await Ferry.run(["--data", pulled, "--create", "sync", "http://nurse-a:\(password)@127.0.0.1:\(port)/\(couch.name)", "--pull"])
        #expect(sync.status == 0, "\(sync.stderr)")
        let listed = try await Ferry.run(["--data", pulled, "--json", "ls"])
        #expect(!listed.stdout.contains("patient-2") && listed.stdout.contains("patient-1"), "\(listed.stdout)")

        // A patient moves from ward a to ward b: both ward-a stations lose it within 5 s, ward b gains it.
        let rev = try await c.admin.admin.get("/docs/patient-1")["_rev"]?.stringValue ?? ""
        try await c.admin.admin.put("patient-1", #"{"ward":"b","name":"patient-1"}"#, rev: rev)
        try await waitUntil("the moved patient leaves ward a and reaches ward b", timeout: 5) {
            let a = try await ids(c.wardA), a2 = try await ids(c.wardA2), b = try await ids(c.wardB)
            return !a.contains("patient-1") && !a2.contains("patient-1") && b.contains("patient-1")
        }
        let removed = try await c.wardA.admin.get("/access/removed")
        #expect(removed["removed"]?.items.contains { $0["id"]?.stringValue == "patient-1" } == true, "\(removed)")
        let watch = try await ferry(c.wardA, ["access", "removed"])
        #expect(watch.stdout.contains("accessRemoved patient-1"), "\(watch.stdout)")

        // Ward-a2's role is taken away: it purges its ward-a documents.
        #expect(try await ferry(c.admin, ["access", "roles", "ward-a2"]).status == 0)
        try await waitUntil("ward-a2 holds nothing once its role is gone", timeout: 10) { try await ids(c.wardA2).isEmpty }

        // A rule changed by a non-admin is refused where it is typed.
        let notAdmin = try await ferry(c.wardB, ["access", "rule", "add", "grab", "--role", "ward-b", "--read-all"])
        #expect(notAdmin.status != 0 && notAdmin.stderr.contains("admin"), "\(notAdmin.stderr)")
        // Bad input: an invalid selector, an unknown role, a lockout; nothing changes.
        let before = try await c.admin.admin.get("/access")["version"]?.stringValue
        let badSelector = try await ferry(c.admin, ["access", "rule", "add", "bad", "--role", "ward-a", "--read-selector", #"{"ward":{"$nope":1}}"#])
        #expect(badSelector.status != 0 && badSelector.stderr.contains("selector"), "\(badSelector.stderr)")
        let unknownRole = try await ferry(c.admin, ["access", "roles", "ward-b", "pharmacy"])
        #expect(unknownRole.status != 0 && unknownRole.stderr.contains("pharmacy"), "\(unknownRole.stderr)")
        let lockout = try await ferry(c.admin, ["access", "rule", "rm", "everything"])
        #expect(lockout.status != 0 && lockout.stderr.contains("admin"), "\(lockout.stderr)")
        #expect(try await c.admin.admin.get("/access")["version"]?.stringValue == before)

        await finish(c.cluster, allowing: expectedRefusals + ["access removed"])
    }

    /// A station that writes, behind its node's back (offline, straight into its store), a
    /// ward-b patient's record as its own ward's: every host holding that patient refuses it.
    @Test func aForgedWriteIsRefusedByEveryHostHoldingTheDocument() async throws {
        let c = try await makeClinic("access-forge")
        defer { c.cluster.cleanUp() }
        let rev = try await c.admin.admin.put("patient-2", #"{"ward":"b","name":"two"}"#)
        try await waitUntil("ward b holds its patient", timeout: 30) { try await ids(c.wardB).contains("patient-2") }
        #expect(await c.wardA.stop() == 0)
        // The forger writes with the store opened directly, as an attacker who owns the host would.
        let forged = try await ferry(c.wardA, ["put", "patient-2", #"{"ward":"a","name":"forged"}"#])
        #expect(forged.status == 0, "\(forged.stderr)")
        try await c.wardA.restart()
        try await waitUntil("the admin refused the forged write", timeout: 30) {
            try await c.admin.admin.metric("ferry_documents_rejected_total", labelsContaining: ["policy"]) > 0
        }
        try await c.admin.admin.put("patient-10", #"{"ward":"b"}"#)
        try await waitUntil("ward b has caught up past it", timeout: 30) { try await ids(c.wardB).contains("patient-10") }
        for n in [c.admin, c.wardB] {
            let doc = try await n.admin.get("/docs/patient-2?conflicts=true")
            #expect(doc["_rev"]?.stringValue == rev && doc["ward"]?.stringValue == "b" && (doc["_conflicts"]?.items ?? []).isEmpty, "\(n.name): \(doc)")
        }
        await finish(c.cluster, allowing: expectedRefusals + ["access removed", "this writer may not"])
    }
}
