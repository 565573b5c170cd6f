import FerryCore
import FerryTransport
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// Attacks on access removal in the clinic of docs/operations.md (real `ferry serve`
/// processes on loopback): a ward-a station, which may read and write ward a but not delete,
/// speaks the native protocol by hand with its own identity. Its forged removal notices purge
/// nothing on the supervisor or on the other ward-a station, and neither an access check's
/// answer nor a write refusal names a revision of a ward-b patient (revision IDs hash bodies:
/// one would confirm a guessed secret offline).
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackRemovalScenarios {
    /// Every feature but heartbeats (a hand-driven client reads replies in order).
    static let features = JSON.array(SyncProtocol.features.filter { $0 != SyncProtocol.heartbeatFeature }.map(JSON.string))

    @Test func aRestrictedStationCanNeitherPurgeOthersNorLearnRevisionsItMayNotRead() async throws {
        let c = try await Clinic.make("attack-removal", serve: ["--couch-port", "0"])
        defer { c.cluster.cleanUp() }
        for (id, ward) in [("patient-1", "a"), ("patient-3", "a"), ("patient-2", "b"), ("patient-4", "b")] {
            try await c.admin.admin.put(id, #"{"ward":"\#(ward)","name":"\#(id)","secret":"SECRET-\#(id)"}"#)
        }
        try await waitUntil("each ward-a station holds ward a", timeout: 60) {
            let a = try await c.ids(c.wardA), a2 = try await c.ids(c.wardA2)
            return a == ["patient-1", "patient-3"] && a2 == ["patient-1", "patient-3"]
        }
        // The attacker: ward-a's own identity, driven by hand.
        #expect(await c.wardA.stop() == 0)
        let identity = try NodeIdentity.loadOrCreate(directory: c.wardA.dataDirectory)
        let madeUp = "2-" + String(repeating: "f", count: 64)

        for victim in [c.admin, c.wardA2] {
            let before = try await victim.admin.revisions()
            var client = try await HostileScenarios.RawClient.connect(to: victim, nodeID: try await victim.id, identity: identity)
            let hello = try await client.requestJSON(
                "hello", ["nodeID": .string(identity.nodeID), "protocol": [1], "features": Self.features])
            #expect(hello?.kind == .response, "\(victim.name) said hello")
            // The victim's own leaves, a made-up newer revision, in the older form and the current one.
            var removed: [JSON] = []
            for id in ["patient-1", "patient-3"] {
                let leaf = JSON.string(before[id] ?? "")
                removed.append([.string(id), [leaf], [.string(madeUp)]])
                removed.append([.string(id), [leaf]])
            }
            let told = try await client.requestJSON("accessRemoved", ["removed": .array(removed)])
            #expect(told?.kind == .response, "\(victim.name) answered the notices")
            // The answer comes once the notices were applied: nothing may have been purged.
            let after = try await victim.admin.revisions()
            #expect(after["patient-1"] == before["patient-1"] && after["patient-3"] == before["patient-3"], "\(victim.name) purged on a forged notice")
            #expect(try await victim.admin.get("/access/removed")["removed"]?.items.isEmpty ?? true)
            await client.endpoint.close(error: nil)
        }

        // Ward-b's patients, named with made-up leaves in an access check: no revision comes back.
        let secretRevs = try await c.admin.admin.revisions().filter { ["patient-2", "patient-4"].contains($0.key) }.map(\.value)
        var client = try await HostileScenarios.RawClient.connect(to: c.admin, nodeID: try await c.admin.id, identity: identity)
        _ = try await client.requestJSON(
            "hello", ["nodeID": .string(identity.nodeID), "protocol": [1], "features": Self.features])
        let check = try await client.requestJSON(
            "accessCheck", ["held": [["patient-2", [.string("1-" + String(repeating: "0", count: 64))]], ["patient-4", [.string(madeUp)]]]])
        let answer = String(decoding: check?.body ?? [], as: UTF8.self)
        #expect(check?.kind == .response, "\(answer)")
        for rev in secretRevs { #expect(!answer.contains(rev) && !answer.contains(rev.dropFirst(2).prefix(16)), "the answer names \(rev): \(answer)") }
        await client.endpoint.close(error: nil)

        // A write of ward b's patient, refused: the refusal names no revision of it either
        // (through the CouchDB API as a ward-a user, which the same engine judges).
        let added = try await c.ferry(c.admin, ["couch-user", "add", "nurse-a"], stdin: Clinic.password + "\n")
        #expect(added.status == 0, "\(added.stderr)")
        #expect(try await c.ferry(c.admin, ["access", "roles", "user:nurse-a", "ward-a"]).status == 0)
        let couch = try await CouchDatabaseClient(c.admin)
        let nurse = AdminClient(base: couch.client.base, host: c.admin.host, key: nil)
        let basic = ["Authorization": "Basic " + Data("nurse-a:\(Clinic.password)".utf8).base64EncodedString()]
        let write = try await nurse.call("PUT", "/\(couch.name)/patient-4", body: #"{"ward":"a","secret":"guess"}"#, headers: basic)
        #expect(write.status == 403 || write.status == 409, "\(write.text)")
        for rev in secretRevs { #expect(!write.text.contains(rev.dropFirst(2).prefix(16)), "the refusal names \(rev): \(write.text)") }

        try await c.wardA.restartOnSamePort()
        await finish(c.cluster, allowing: Clinic.allowedLogLines + ["request failed", "refused", "forbidden"])
    }
}
