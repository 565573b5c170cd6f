import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The web dashboard in a real headless Chromium (Integration/ui/test_dashboard.py, selenium):
/// three `ferry serve` nodes of one group on loopback; the browser logs in to A, watches the
/// mesh (no link drawn over another), sees C go offline when it stops, finds a conflict marked
/// in the documents list and resolves it (asked first; Cancel deletes nothing), runs a Mango
/// query, creates and deletes a document, is refused a stale edit, reads the group, the health
/// charts' axes and the peer links' counters, uses every page at 375 px wide and by keyboard,
/// and logs out. Screenshots go to docs/dashboard/.
@Suite(.serialized, .timeLimit(.minutes(10))) struct DashboardScenarios {
    @Test func theDashboardWorksInARealBrowser() async throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/chromium"), FileManager.default.isExecutableFile(atPath: "/usr/bin/chromedriver")
        else {
            Issue.record("chromium and chromium-driver are missing: run scripts/install-deps.sh")
            return
        }
        let cluster = Cluster("dashboard")
        defer { cluster.cleanUp() }
        let (a, b, c) = (cluster.add("a"), cluster.add("b"), cluster.add("c"))
        let noAvahi = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"]
        for n in [a, b] { try await n.start(["--discovery", "--couch-port", "0"], environment: noAvahi) }
        try await c.start(["--discovery"], environment: noAvahi)
        for n in [b, c] {
            let invite = try await Ferry.run(["--data", a.dataDirectory, "invite", "--json"])
            let code = try JSON.parse(invite.stdout.trimmingCharacters(in: .whitespacesAndNewlines))["code"]?.stringValue ?? ""
            let joined = try await Ferry.run(["--data", n.dataDirectory, "join", code])
            #expect(joined.status == 0, "\(joined.stderr)")
        }
        // docs/dashboard/ holds the pictures `make screenshots` takes; a plain run keeps its own.
        let shots = ProcessInfo.processInfo.environment["FERRY_SCREENSHOTS"] ?? (cluster.root + "/screenshots")
        try await CouchSuite.pytest(
            CouchSuite.root + "/Integration/ui/test_dashboard.py",
            environment: [
                "FERRY_A_ADMIN": a.info["adminURL"]?.stringValue ?? "", "FERRY_A_KEY": a.adminKey ?? "",
                "FERRY_B_ADMIN": b.info["adminURL"]?.stringValue ?? "", "FERRY_B_KEY": b.adminKey ?? "",
                "FERRY_A_COUCH": try CouchSuite.couchURL(a), "FERRY_B_COUCH": try CouchSuite.couchURL(b), "FERRY_DB": try await a.admin.get("/")["group"]?.stringValue ?? "ferry",
                "FERRY_C_PID": "\(c.pid ?? 0)", "FERRY_SCREENSHOTS": shots,
            ], timeout: 400)
        await finish(cluster, allowing: expectedRefusals + ["dashboard login refused", "replication offline", "connect_failed"])
    }
}
