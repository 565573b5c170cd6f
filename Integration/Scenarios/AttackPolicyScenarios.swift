import FerryCore
import FerryTransport
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// Attacks on the access policies of a real node: a restricted peer with the stock CLI and
/// by hand over the native protocol, and a restricted user through the CouchDB API
/// (Integration/attacks/test_policy.py). Each asserts the refusal.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackPolicyScenarios {
    /// A restricted by `--read 'public/*' --write-type note --no-delete`, as the trust
    /// command makes it, for the peer node B and for a hand-driven identity.
    static let restrictedPolicy = #"{"read":{"ids":["public/*"]},"write":{"types":["note"]},"mayDelete":false}"#

    @Test func aRestrictedPeerNeitherOverwritesNorReadsWhatItMayNot() async throws {
        let cluster = Cluster("attack-policy")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        let (idA, idB) = (try await a.id, try await b.id)
        let intruder = try NodeIdentity.loadOrCreate(directory: cluster.root + "/intruder", name: "intruder")
        let config = cluster.root + "/a.json"
        try """
            {"discovery":{"enabled":false},
             "trust":[{"id":"\(idB)","policy":\(Self.restrictedPolicy)},
                      {"id":"\(intruder.nodeID)","policy":\(Self.restrictedPolicy)}]}
            """.write(toFile: config, atomically: true, encoding: .utf8)
        try await a.start(["--config", config, "--couch-port", "0"])
        try await a.admin.put("patients/2", #"{"type":"patient","name":"Ada","pin":"4711"}"#)
        try await a.admin.put("public/menu", #"{"type":"note","v":1}"#)
        // A patient record with a scan, through the CouchDB API (the scan becomes a blob).
        let scanBytes = Array("x-ray of Ada".utf8)
        let blobDigest = BlobDigest.of(scanBytes).description
        let db = try await a.admin.get("/")["group"]?.stringValue ?? "ferry"
        let withScan: JSON = [
            "type": "patient",
            "_attachments": ["scan": ["content_type": "image/png", "data": .string(Data(scanBytes).base64EncodedString())]],
        ]
        try CouchSuite.expect(
            try await CouchSuite.client(a).call("PUT", "/\(db)/patients%2F3", body: withScan.canonicalString,
                                                headers: ["Content-Type": "application/json"]), 201)
        let patientRev = try await a.admin.get("/docs/patients/2")["_rev"]?.stringValue ?? ""

        // 1. The stock CLI: B writes patients/2 as a note, edits it twice, and syncs with A.
        _ = try await Ferry.run(["--data", b.dataDirectory, "trust", "add", idA])
        for v in 1...3 {
            let current = try await Ferry.run(["--data", b.dataDirectory, "get", "patients/2"])
            let rev = (try? JSON.parse(Array(current.stdout.utf8)))?["_rev"]?.stringValue
            var args = ["--data", b.dataDirectory, "put", "patients/2", #"{"type":"note","v":\#(v)}"#]
            if let rev { args += ["--rev", rev] }
            let put = try await Ferry.run(args)
            #expect(put.status == 0, "\(put.stderr)")
        }
        try await b.start(["--peer", "\(a.url)#\(idA)"])
        try await waitUntil("B receives what it may read") { try await b.admin.call("GET", "/docs/public/menu").status == 200 }
        try await waitUntil("A refuses B's note over the patient record") {
            try await a.admin.metric("ferry_documents_rejected_total", labelsContaining: [#"direction="push""#]) >= 1
        }
        let onA = try await a.admin.get("/docs/patients/2?conflicts=true")
        #expect(onA["_rev"]?.stringValue == patientRev)
        #expect(onA["type"] == "patient")
        #expect(onA["_conflicts"]?.items ?? [] == [])
        // Nothing of the patients reached B beyond its own note.
        let onB = try await b.admin.get("/docs/patients/2")
        #expect(onB["type"] == "note")
        #expect(try await b.admin.call("GET", "/docs/patients/3").status == 404)

        // 2. By hand, as a restricted peer: no revision, no revsDiff answer, no blob.
        var client = try await HostileScenarios.RawClient.connect(to: a, nodeID: idA, identity: intruder)
        let hello = try await client.requestJSON("hello", ["nodeID": .string(intruder.nodeID), "protocol": [1]])
        #expect(hello?.kind == .response)
        let getRevs: JSON = ["revs": [["id": "patients/2", "rev": .string(patientRev), "ancestors": []]], "deltas": false, "maxHistory": 10]
        let revs = try await client.requestJSON("getRevs", getRevs)
        let wires = try WireRevision.decodeBatch(revs?.body ?? [])
        let served = wires.filter { !$0.missing }
        #expect(served.isEmpty, "a patient revision was served")
        let guess = "2-" + String(repeating: "a", count: 64)
        let diff = try await client.requestJSON("revsDiff", ["docs": ["patients/2": [.string(patientRev), .string(guess)]]])
        let answer = try diff?.json()
        #expect(answer?["patients/2"]?["ancestors"] == .array([]))
        #expect(answer?["patients/2"]?["missing"] == .array([.string(patientRev), .string(guess)]))
        try await client.endpoint.send(
            Message(kind: .request, number: 99, properties: [("Profile", "getBlob"), ("Digest", blobDigest)]).encoded())
        for try await bytes in client.endpoint.incoming {
            let blob = try Message(decoding: bytes)
            #expect(blob.kind == .error && blob.body != scanBytes)
            break
        }
        var checkpoints = 0
        for i in 0..<(CheckpointQuota.maxCheckpointsPerPeer + 1) {
            let set = try await client.requestJSON("setCheckpoint", ["id": .string("junk-\(i)"), "value": ["seq": 1]])
            if set?.kind == .response { checkpoints += 1 }
        }
        #expect(checkpoints == CheckpointQuota.maxCheckpointsPerPeer)

        _ = await a.stop()
        let check = try await Ferry.run(["--data", a.dataDirectory, "check", "--json"])
        #expect(check.stdout.contains(#""ok":true"#), "\(check.stdout)")
        await finish(cluster, allowing: expectedRefusals + ["request failed", "rejected", "refused"])
    }

    @Test func aRestrictedCouchUserNeitherOverwritesNorReadsWhatItMayNot() async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        let cluster = Cluster("attack-policy-couch")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let passwordFile = cluster.root + "/nurse.password"
        try FileManager.default.createDirectory(atPath: cluster.root, withIntermediateDirectories: true)
        try "nurse-pass-4711\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let made = try await Ferry.run(["couch-user", "nurse", "--password-file", passwordFile, "--iterations", "10000"])
        guard var user = try? JSON.parse(Array(made.stdout.utf8)).objectValue else {
            Issue.record("ferry couch-user printed no entry: \(made.stdout) \(made.stderr)")
            return
        }
        user["policy"] = try JSON.parse(Array(#"{"read":{"types":["note"]},"write":{"types":["note"]},"mayDelete":false}"#.utf8))
        let config = cluster.root + "/a.json"
        try #"{"discovery":{"enabled":false},"couch":{"users":[\#(JSON.object(user).canonicalString)]}}"#
            .write(toFile: config, atomically: true, encoding: .utf8)
        try await a.start(["--config", config, "--couch-port", "0"])
        try await CouchSuite.pytest(
            CouchSuite.root + "/Integration/attacks/test_policy.py",
            environment: [
                "FERRY_COUCH_URL": try CouchSuite.couchURL(a), "FERRY_COUCH_DB": try await a.admin.get("/")["group"]?.stringValue ?? "ferry",
                "FERRY_ADMIN_KEY": try CouchSuite.adminKey(a), "FERRY_USER": "nurse", "FERRY_USER_PASSWORD": "nurse-pass-4711",
            ])
        await finish(cluster, allowing: expectedRefusals + ["revision refused", "forbidden"])
    }
}
