import FerryCore
import FerryNode
import FerryStore
import Foundation
import IntegrationHarness
import Testing

/// Attacks on the group's signed access entries by the clinic's own stations (restricted
/// peers): each keeps an admin-signed body while it is current and, once the admin has
/// withdrawn it, pushes it back as a child of the current revision, so that its revision
/// tree's winner is the old entry again. Every node must keep the withdrawal.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackAccessReplayScenarios {
    @Test func aReplayedWithdrawnRoleOrRemovedRuleStaysWithdrawnOnEveryNode() async throws {
        let c = try await Clinic.make("attack-access-replay")
        defer { c.cluster.cleanUp() }
        let (admin, wardA, wardB, station) = (c.admin, c.wardA, c.wardB, c.wardA2)
        let stationID = try await station.id
        let rolesID = "_ferry/access/roles/\(stationID)", ruleID = "_ferry/access/rules/audit"

        // A rule that lets ward b read everything, for a while.
        #expect(try await c.ferry(admin, ["access", "rule", "add", "audit", "--role", "ward-b", "--read-all"]).status == 0)
        try await everyNodeFollows(c, "the audit rule")
        try await admin.admin.put("patient-1", #"{"ward":"a","name":"before"}"#)
        try await waitUntil("the station and ward b hold the ward-a patient", timeout: 60) {
            let (a2, b) = (try await c.ids(station), try await c.ids(wardB))
            return a2.contains("patient-1") && b.contains("patient-1")
        }
        // Each station keeps the signed body that favours it while it is current.
        let keptRoles = try await station.admin.get("/docs/\(rolesID)")
        let keptRule = try await wardB.admin.get("/docs/\(ruleID)")
        #expect(keptRoles["roles"]?.items == ["ward-a"], "\(keptRoles)")
        #expect(keptRule["state"]?.stringValue == "active", "\(keptRule)")

        // The admin withdraws the station's role and removes the rule.
        #expect(try await c.ferry(admin, ["access", "roles", "ward-a2"]).status == 0)
        #expect(try await c.ferry(admin, ["access", "rule", "rm", "audit"]).status == 0)
        let withdrawn = try await everyNodeFollows(c, "the withdrawal")
        try await waitUntil("the station and ward b lose the ward-a patient", timeout: 60) {
            let (a2, b) = (try await c.ids(station), try await c.ids(wardB))
            return a2.isEmpty && !b.contains("patient-1")
        }
        var baseline: [String: Double] = [:]
        for n in [admin, wardA] { baseline[n.name] = try await n.admin.metric("ferry_documents_rejected_total", labelsContaining: ["validation"]) }

        // Each station writes the old body back as a child of its current revision, straight
        // into its own store (its disk is its own), and starts again: its node offers the
        // revision to every member as any other change, over the native protocol.
        for n in [station, wardB] { #expect(await n.stop() == 0) }
        for (node, id, kept) in [(station, rolesID, keptRoles), (wardB, ruleID, keptRule)] {
            var body = kept.objectValue ?? [:]
            for key in body.keys where key.hasPrefix("_") { body[key] = nil }
            let store = try DocumentStore.openExisting(directory: node.dataDirectory)
            let docID = try DocumentID(id, allowReserved: true)
            let current = try #require(try store.document(docID)).revision
            let replayed = try store.put(docID, body: .object(body), parent: current)
            #expect(replayed.generation == current.generation + 1)
        }
        // Their counts start from zero with the restart; neither can offer its replay to the
        // other before the other is up again.
        for n in [station, wardB] {
            try await n.restartOnSamePort()
            baseline[n.name] = 0
        }
        let refused = baseline

        // Every other node refuses the replays (or, were it to take them, its rules change):
        // the admin and ward a judge both, each station the other's.
        let judges: [(Node, Double)] = [(admin, 2), (wardA, 2), (wardB, 1), (station, 1)]
        @Sendable func judged(_ n: Node, _ count: Double) async throws -> String? {
            let now = try await n.admin.metric("ferry_documents_rejected_total", labelsContaining: ["validation"])
            let version = try await n.admin.get("/access")["version"]?.stringValue
            return now < refused[n.name]! + count && version == withdrawn ? "\(n.name): \(now - refused[n.name]!) refused" : nil
        }
        do {
            try await waitUntil("every node has judged both replays", timeout: 120) {
                for (n, count) in judges { if try await judged(n, count) != nil { return false } }
                return true
            }
        } catch {
            for (n, count) in judges { print(try await judged(n, count) ?? "\(n.name): judged") }
            for n in c.all { print("\(n.name) log:\n\(n.logTail(40))") }
            throw error
        }
        for n in c.all {
            let access = try await n.admin.get("/access")
            #expect(access["version"]?.stringValue == withdrawn, "\(n.name) changed its rules: \(access)")
            let roles = access["roles"]?.items.first { $0["principal"]?.stringValue == stationID }
            #expect(roles?["inForce"]?.boolValue != true, "\(n.name) gives the station its role back: \(access)")
            let audit = access["rules"]?.items.first { $0["name"]?.stringValue == "audit" }
            #expect(audit?["inForce"]?.boolValue != true && audit?["state"]?.stringValue == "removed", "\(n.name) revived the rule: \(access)")
        }

        // A patient written after the withdrawal (and the replay) reaches its ward, not the station.
        try await admin.admin.put("patient-2", #"{"ward":"a","name":"after"}"#)
        try await waitUntil("ward a holds the new patient", timeout: 60) { try await c.ids(wardA).contains("patient-2") }
        // A marker change of the rules, written after the patient: once the station and ward b
        // follow it, whatever the admin would have sent them before it has arrived.
        #expect(try await c.ferry(admin, ["access", "rule", "add", "marker", "--role", "supervisor", "--read-all"]).status == 0)
        try await everyNodeFollows(c, "the marker rule")
        #expect(try await c.ids(station).isEmpty, "the station holds patients without a role")
        #expect(try await !c.ids(wardB).contains("patient-2"), "ward b reads ward a through a removed rule")

        // The admin, restarted, still holds the withdrawal.
        let version = try await admin.admin.get("/access")["version"]?.stringValue
        #expect(await admin.stop() == 0)
        try await admin.restartOnSamePort()
        #expect(try await admin.admin.get("/access")["version"]?.stringValue == version)
        await finish(c.cluster, allowing: Clinic.allowedLogLines + ["superseded"])
    }

    /// Waits until every node follows the admin's rules; returns their version.
    @discardableResult
    func everyNodeFollows(_ c: Clinic, _ what: String) async throws -> String {
        let version = try await c.admin.admin.get("/access")["version"]?.stringValue ?? ""
        try await waitUntil("every station follows \(what)", timeout: 60) {
            for n in c.all { guard try await n.admin.get("/access")["version"]?.stringValue == version else { return false } }
            return true
        }
        return version
    }
}
