import FerryCore
import FerryNode
import FerryStore
import FerryTransport
import Foundation
import IntegrationHarness
import Testing

/// A clinic's four stations with real `ferry serve` processes, on loopback or on four LAN-lab
/// hosts: the admin's (supervisor: everything), two of ward a and one of ward b, after
/// `invite`/`join`, with group rules by the `ward` field typed as an operator types them.
struct Clinic {
    let cluster: Cluster
    let admin: Node, wardA: Node, wardB: Node, wardA2: Node
    var all: [Node] { [admin, wardA, wardB, wardA2] }

    static let password = "ward-A-Secret-4711"

    func ferry(_ node: Node, _ args: [String], stdin: String? = nil) async throws -> Ferry.Result {
        try await Ferry.run(["--data", node.dataDirectory] + args, host: node.host, stdin: stdin)
    }

    /// The application documents a node holds.
    func ids(_ node: Node) async throws -> Set<String> {
        Set(try await node.admin.revisions().keys.filter { !$0.hasPrefix("_ferry/") })
    }

    /// Starts the stations (`serve` arguments beside `--discovery`), enrols them and types the
    /// rules; `before` (ID and body) is written on the admin's station first, and reaches every
    /// station before the first rule is typed.
    static func make(_ name: String, lab: Lab? = nil, serve: [String] = [], before: [(String, String)] = []) async throws -> Clinic {
        let cluster = Cluster(name)
        let hosts = lab?.hosts
        let c = Clinic(
            cluster: cluster, admin: cluster.add("admin", host: hosts?[0]), wardA: cluster.add("ward-a", host: hosts?[1]),
            wardB: cluster.add("ward-b", host: hosts?[2]), wardA2: cluster.add("ward-a2", host: hosts?[3]))
        // On loopback, no avahi: members dial where their entries say they listen.
        let environment = lab == nil ? ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"] : [:]
        let network = lab == nil ? [] : ["--group", "clinic", "--interface", "0.0.0.0"]
        for n in c.all { try await n.start(["--discovery"] + network + serve, environment: environment) }
        for n in [c.wardA, c.wardB, c.wardA2] {
            let invite = try await c.ferry(c.admin, ["invite", "--json"])
            #expect(invite.status == 0, "\(invite.stderr)")
            let code = try JSON.parse(invite.stdout.trimmingCharacters(in: .whitespacesAndNewlines))["code"]?.stringValue ?? ""
            let joined = try await c.ferry(n, ["join", code])
            #expect(joined.status == 0, "\(joined.stderr)")
        }
        for (id, body) in before { try await c.admin.admin.put(id, body) }
        if !before.isEmpty {
            let ids = Set(before.map(\.0))
            try await waitUntil("every station holds what was written before the rules", timeout: 60) {
                for n in c.all { guard try await c.ids(n) == ids else { return false } }
                return true
            }
        }
        // As docs/operations.md ("Access by content") types it.
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
            let r = try await c.ferry(c.admin, step)
            #expect(r.status == 0, "\(step.joined(separator: " ")): \(r.stderr)")
        }
        let version = try await c.admin.admin.get("/access")["version"]?.stringValue ?? ""
        try await waitUntil("every station has the rules", timeout: 60) {
            for n in c.all { guard try await n.admin.get("/access")["version"]?.stringValue == version else { return false } }
            return true
        }
        return c
    }

    /// Patients of both wards written on the admin's station reach exactly their wards' stations;
    /// a ward-a write reaches ward a and the admin only; every route to a ward-b document is
    /// closed to ward a (native replication and relays, the CouchDB API as a ward-a user, a
    /// CouchDB-protocol pull); a moved patient and a withdrawn role are purged; bad changes are refused.
    func holdsOnlyEachWardAndRemovesWhatLeavesIt() async throws {
        for (id, ward) in [("patient-1", "a"), ("patient-2", "b"), ("patient-3", "a"), ("patient-4", "b")] {
            try await admin.admin.put(id, #"{"ward":"\#(ward)","name":"\#(id)"}"#)
        }
        // Written on ward b's own station: it relays through the admin, who may read it, and still never reaches ward a.
        try await wardB.admin.put("patient-8", #"{"ward":"b","name":"from ward b"}"#)
        let wardADocs: Set = ["patient-1", "patient-3"], wardBDocs: Set = ["patient-2", "patient-4", "patient-8"]
        try await waitUntil("each station holds exactly its ward", timeout: 60) {
            let a = try await ids(wardA), a2 = try await ids(wardA2), b = try await ids(wardB), all = try await ids(admin)
            return a == wardADocs && a2 == wardADocs && b == wardBDocs && all == wardADocs.union(wardBDocs)
        }
        // Every link compares digests over what both of its ends may read, and finds them equal.
        var lastPeers: [String: JSON] = [:]
        do {
            try await waitUntil("every link under the rules reports equal digests", timeout: 60) {
                for node in [admin, wardA, wardA2, wardB] {
                    let peers = try await node.admin.get("/peers")
                    lastPeers[node.name] = peers
                    let connected = (peers["peers"]?.items ?? []).filter { $0["connected"]?.boolValue == true }
                    guard !connected.isEmpty, connected.allSatisfy({ $0["digestMatches"]?.boolValue == true }) else { return false }
                }
                return true
            }
        } catch {
            print("peers: \(lastPeers)")
            throw error
        }
        try await wardA.admin.put("patient-5", #"{"ward":"a","name":"new"}"#)
        try await waitUntil("the ward-a write reaches ward a and the admin", timeout: 60) {
            let a2 = try await ids(wardA2), all = try await ids(admin)
            return a2.contains("patient-5") && all.contains("patient-5")
        }
        #expect(try await !ids(wardB).contains("patient-5"))
        let forbidden = try await wardA.admin.call("PUT", "/docs/patient-6", body: #"{"ward":"b"}"#)
        #expect(forbidden.status == 403, "a ward-a station may not write ward b: \(forbidden.text)")

        let explained = try await ferry(admin, ["--json", "access", "explain", "patient-2", "--for", "ward-a"])
        let answer = try JSON.parse(explained.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(answer["read"]?["allowed"]?.boolValue == false, "\(answer)")
        let admitted = try JSON.parse(try await ferry(admin, ["--json", "access", "explain", "patient-1", "--for", "ward-a"]).stdout)
        #expect(admitted["read"]?["rule"]?.stringValue == "ward-a", "\(admitted)")

        // The CouchDB API as a ward-a user, on the admin's station (which holds everything).
        let added = try await ferry(admin, ["couch-user", "add", "nurse-a"], stdin: Self.password + "\n")
        #expect(added.status == 0, "\(added.stderr)")
        #expect(try await ferry(admin, ["access", "roles", "user:nurse-a", "ward-a"]).status == 0)
        let couch = try await CouchDatabaseClient(admin)
        let nurse = AdminClient(base: couch.client.base, host: admin.host, key: nil)
        let basic = ["Authorization": "Basic " + Data("nurse-a:\(Self.password)".utf8).base64EncodedString()]
        let allDocs = try await nurse.call("GET", "/\(couch.name)/_all_docs", headers: basic)
        let seen = Set(allDocs.json["rows"]?.items.compactMap { $0["id"]?.stringValue }.filter { !$0.hasPrefix("_") } ?? [])
        #expect(seen == wardADocs.union(["patient-5"]), "\(allDocs.text)")
        #expect(try await nurse.call("GET", "/\(couch.name)/patient-2", headers: basic).status == 404)
        let changes = try await nurse.call("GET", "/\(couch.name)/_changes", headers: basic)
        #expect(!changes.text.contains("patient-2") && !changes.text.contains("patient-8"), "\(changes.text)")
        let write = try await nurse.call("PUT", "/\(couch.name)/patient-7", body: #"{"ward":"b"}"#, headers: basic)
        #expect(write.status == 403, "\(write.text)")
        let pulled = cluster.root + "/nurse-pull"
        let port = URL(string: couch.client.base)?.port ?? 0
        let sync = try await Ferry.run(
            ["--data", pulled, "sync", "http://nurse-a:\(Self.password)@127.0.0.1:\(port)/\(couch.name)", "--pull"], host: admin.host)
        #expect(sync.status == 0, "\(sync.stderr)")
        let listed = try await Ferry.run(["--data", pulled, "--json", "ls"], host: admin.host)
        #expect(!listed.stdout.contains("patient-2") && !listed.stdout.contains("patient-8") && listed.stdout.contains("patient-1"), "\(listed.stdout)")

        // A patient moves from ward a to ward b: both ward-a stations lose it within 5 s, ward b gains it.
        let rev = try await admin.admin.get("/docs/patient-1")["_rev"]?.stringValue ?? ""
        try await admin.admin.put("patient-1", #"{"ward":"b","name":"patient-1"}"#, rev: rev)
        try await waitUntil("the moved patient leaves ward a and reaches ward b", timeout: 5) {
            let a = try await ids(wardA), a2 = try await ids(wardA2), b = try await ids(wardB)
            return !a.contains("patient-1") && !a2.contains("patient-1") && b.contains("patient-1")
        }
        let removed = try await wardA.admin.get("/access/removed")
        #expect(removed["removed"]?.items.contains { $0["id"]?.stringValue == "patient-1" } == true, "\(removed)")
        let listing = try await ferry(wardA, ["access", "removed"])
        #expect(listing.stdout.contains("accessRemoved patient-1"), "\(listing.stdout)")
        #expect(try await wardA.admin.get("/")["access"]?["removed"]?.intValue ?? 0 >= 1)
        #expect(try await wardA.admin.metric("ferry_access_removed_documents") >= 1)
        // Its later edit of the purged patient is refused where it is typed.
        let edit = try await wardA.admin.call("PUT", "/docs/patient-1", body: #"{"ward":"a"}"#)
        #expect(edit.status == 403, "\(edit.text)")

        // Ward-a2's role is taken away: it purges its ward-a documents.
        #expect(try await ferry(admin, ["access", "roles", "ward-a2"]).status == 0)
        try await waitUntil("ward-a2 holds nothing once its role is gone", timeout: 10) { try await ids(wardA2).isEmpty }
        // Given back, its ward's patients return at once, with no other write to carry them.
        #expect(try await ferry(admin, ["access", "roles", "ward-a2", "ward-a"]).status == 0)
        let wardANow = try await ids(wardA)
        try await waitUntil("ward-a2 holds ward a's patients again", timeout: 10) { try await ids(wardA2) == wardANow }

        // A rule change typed on a non-admin is refused; bad input changes nothing.
        let notAdmin = try await ferry(wardB, ["access", "rule", "add", "grab", "--role", "ward-b", "--read-all"])
        #expect(notAdmin.status != 0 && notAdmin.stderr.contains("admin"), "\(notAdmin.stderr)")
        let before = try await admin.admin.get("/access")["version"]?.stringValue
        let badSelector = try await ferry(admin, ["access", "rule", "add", "bad", "--role", "ward-a", "--read-selector", #"{"ward":{"$nope":1}}"#])
        #expect(badSelector.status != 0 && badSelector.stderr.contains("selector"), "\(badSelector.stderr)")
        let unknownRole = try await ferry(admin, ["access", "roles", "ward-b", "pharmacy"])
        #expect(unknownRole.status != 0 && unknownRole.stderr.contains("pharmacy"), "\(unknownRole.stderr)")
        let lockout = try await ferry(admin, ["access", "rule", "rm", "everything"])
        #expect(lockout.status != 0 && lockout.stderr.contains("admin"), "\(lockout.stderr)")
        #expect(try await admin.admin.get("/access")["version"]?.stringValue == before)
    }

    /// A ward-a station writes a ward-b patient's record as its own ward's behind its node's back
    /// (offline, straight into its store), and ward b's station signs itself a rule with its own
    /// key: every host refuses both.
    func refusesForgedWritesAndRules() async throws {
        let rev = try await admin.admin.put("patient-12", #"{"ward":"b","name":"two"}"#)
        try await waitUntil("ward b holds its patient", timeout: 60) { try await ids(wardB).contains("patient-12") }
        #expect(await wardA.stop() == 0)
        let forged = try await ferry(wardA, ["put", "patient-12", #"{"ward":"a","name":"forged"}"#])
        #expect(forged.status == 0, "\(forged.stderr)")
        try await wardA.restartOnNewPort(reconnectingWith: [admin, wardB, wardA2], within: 5)
        // Whichever comes first: the admin refuses its push, or the station's access check at
        // its first pull learns the admin holds that patient in ward b and purges the forgery.
        do {
            try await waitUntil("the forged write was refused by the admin or purged by its forger", timeout: 60) {
                let refused = try await admin.admin.metric("ferry_documents_rejected_total", labelsContaining: ["policy"]) > 0
                let purged = try await !ids(wardA).contains("patient-12")
                return refused || purged
            }
        } catch {
            print("ward-a log:\n\(wardA.logTail(80))\nadmin log:\n\(admin.logTail(80))")
            throw error
        }

        // Ward b's station signs a rule granting itself everything, written into its own store.
        let groupID = try await admin.id
        #expect(await wardB.stop() == 0)
        let identity = try NodeIdentity.loadOrCreate(directory: wardB.dataDirectory)
        let grab = try AccessRuleEntry.signed(
            group: groupID, name: "grab", roles: ["ward-b"], read: AccessMatch(), write: AccessMatch(), delete: true, state: .active,
            version: 1, by: identity)
        do {
            let store = try DocumentStore.openExisting(directory: wardB.dataDirectory)
            try store.put(AccessRuleEntry.documentID("grab"), body: grab.body)
        }
        try await wardB.restartOnNewPort(reconnectingWith: [admin, wardA, wardA2], within: 5)
        try await admin.admin.put("patient-13", #"{"ward":"b"}"#)
        try await admin.admin.put("patient-14", #"{"ward":"a"}"#)
        do {
            try await waitUntil("ward b has caught up past both", timeout: 60) { try await ids(wardB).contains("patient-13") }
        } catch {
            print("ward-b log:\n\(wardB.logTail(60))\nadmin log:\n\(admin.logTail(60))")
            throw error
        }
        try await waitUntil("the admin refused the forged rule", timeout: 60) {
            try await admin.admin.metric("ferry_documents_rejected_total", labelsContaining: ["validation"]) > 0
        }
        for n in [admin, wardB] {
            let doc = try await n.admin.get("/docs/patient-12?conflicts=true")
            #expect(doc["_rev"]?.stringValue == rev && doc["ward"]?.stringValue == "b" && (doc["_conflicts"]?.items ?? []).isEmpty, "\(n.name): \(doc)")
        }
        for n in [admin, wardA, wardA2] {
            let rules = try await n.admin.get("/access")["rules"]?.items.compactMap { $0["name"]?.stringValue } ?? []
            #expect(!rules.contains("grab"), "\(n.name) took the forged rule: \(rules)")
        }
        // Not even ward b itself counts its own rule: it still holds ward b only.
        let wardBRules = try await wardB.admin.get("/access")["rules"]?.items ?? []
        #expect(wardBRules.first { $0["name"]?.stringValue == "grab" }?["inForce"]?.boolValue == false, "\(wardBRules)")
        try await waitUntil("ward a holds its new patient", timeout: 60) { try await ids(wardA).contains("patient-14") }
        #expect(try await !ids(wardB).contains("patient-14"), "ward b's own rule gave it nothing")
    }

    static let allowedLogLines = expectedRefusals + ["access removed", "this writer may not", "neither the founder nor an active admin"]
}

/// The clinic on loopback.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AccessScenarios {
    @Test func wardStationsHoldOnlyTheirWardAndLoseAMovedPatient() async throws {
        let c = try await Clinic.make("access-clinic", serve: ["--couch-port", "0"])
        defer { c.cluster.cleanUp() }
        try await c.holdsOnlyEachWardAndRemovesWhatLeavesIt()
        await finish(c.cluster, allowing: Clinic.allowedLogLines)
    }

    /// Patients written before any rule reach every station; the docs' commands, typed in
    /// their order, first leave the stations without a role (they purge everything), then give
    /// them their roles: each station gets its ward's patients back, with no other write.
    @Test func documentsPurgedBeforeTheStationsHadRolesComeBackWithThem() async throws {
        let patients = [("patient-1", "a"), ("patient-3", "a"), ("patient-2", "b")].map { ($0.0, #"{"ward":"\#($0.1)","name":"\#($0.0)"}"#) }
        let c = try await Clinic.make("access-order", before: patients)
        defer { c.cluster.cleanUp() }
        do {
            try await waitUntil("each station holds its ward's patients again", timeout: 30) {
                let a = try await c.ids(c.wardA), a2 = try await c.ids(c.wardA2), b = try await c.ids(c.wardB), all = try await c.ids(c.admin)
                return a == ["patient-1", "patient-3"] && a2 == ["patient-1", "patient-3"] && b == ["patient-2"] && all.count == 3
            }
        } catch {
            for n in c.all { print("\(n.name): \(try await c.ids(n).sorted())\n\(n.logTail(30))") }
            throw error
        }
        await finish(c.cluster, allowing: Clinic.allowedLogLines)
    }

    @Test func forgedWritesAndRulesAreRefusedByEveryHost() async throws {
        let c = try await Clinic.make("access-forge")
        defer { c.cluster.cleanUp() }
        try await c.refusesForgedWritesAndRules()
        await finish(c.cluster, allowing: Clinic.allowedLogLines)
    }
}
