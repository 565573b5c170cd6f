import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Access by content through the CouchDB API, read by CouchDB client libraries from PyPI:
/// Integration/couch/test_access.py, as a user whose group role admits one ward, against a
/// real `ferry serve` that founded the group and typed the rules.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AccessCouchClientScenarios {
    @Test func aRestrictedUserSeesOnlyItsWardThroughEveryReadRouteAndIsRefusedOtherWrites() async throws {
        let cluster = Cluster("access-couch")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        try await a.start(["--no-discovery", "--couch-port", "0"])
        func ferry(_ args: [String], stdin: String? = nil) async throws {
            let r = try await Ferry.run(["--data", a.dataDirectory] + args, stdin: stdin)
            #expect(r.status == 0, "ferry \(args.joined(separator: " ")): \(r.stderr)")
        }
        // `ferry invite` founds the group with this node as its admin.
        try await ferry(["invite"])
        try await ferry(["access", "roles", try await a.id, "supervisor"])
        try await ferry(["access", "rule", "add", "everything", "--role", "supervisor", "--read-all", "--write-all", "--delete"])
        try await ferry(["access", "rule", "add", "ward-a", "--role", "ward-a", "--read-selector", #"{"ward":"a"}"#, "--write-selector", #"{"ward":"a"}"#])
        try await ferry(["couch-user", "add", "nurse"], stdin: "nurse-pass-4711\n")
        try await ferry(["access", "roles", "user:nurse", "ward-a"])
        try await CouchSuite.pytest(
            CouchSuite.directory + "/test_access.py",
            environment: [
                "FERRY_COUCH_URL": try CouchSuite.couchURL(a), "FERRY_COUCH_DB": try await a.admin.get("/")["group"]?.stringValue ?? "ferry",
                "FERRY_ADMIN_KEY": try CouchSuite.adminKey(a), "FERRY_USER": "nurse", "FERRY_USER_PASSWORD": "nurse-pass-4711",
            ])
        await finish(cluster, allowing: expectedRefusals + ["forbidden"])
    }
}
