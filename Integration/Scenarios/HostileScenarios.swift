import FerryCore
import FerryTransport
import Foundation
import IntegrationHarness
import NIOCore
import NIOWebSocket
import Testing

@testable import FerrySync

/// Scenario 6: hostile peers against a real node, while honest peers keep syncing.
@Suite(.serialized, .timeLimit(.minutes(10))) struct HostileScenarios {
    /// A raw protocol client: a pinned TLS WebSocket to the node, speaking envelopes by hand.
    struct RawClient {
        let endpoint: any MessageEndpoint
        var number: UInt64 = 1

        static func connect(to node: Node, nodeID: String, identity: NodeIdentity) async throws -> RawClient {
            let connector = try WebSocketConnector(url: node.url, serverTrust: .pinned([nodeID]), identity: identity)
            return RawClient(endpoint: try await connector.connect())
        }

        mutating func request(_ profile: String, _ body: [UInt8]) async throws -> Message? {
            let message = Message(kind: .request, number: number, properties: [("Profile", profile)], body: body)
            number += 1
            try await endpoint.send(message.encoded())
            for try await bytes in endpoint.incoming { return try Message(decoding: bytes) }
            return nil
        }

        mutating func requestJSON(_ profile: String, _ body: JSON) async throws -> Message? {
            try await request(profile, body.canonicalBytes)
        }

        /// Sends raw bytes as one message; true when the node then closes the connection.
        func sendGarbageAndSeeClose(_ bytes: [UInt8]) async -> Bool {
            do {
                try await endpoint.send(bytes)
                for try await _ in endpoint.incoming {}
                return true
            } catch { return true }
        }
    }

    @Test func hostilePeersAreRefusedAndHonestPeersKeepSyncing() async throws {
        let cluster = Cluster("hostile")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        let restricted = cluster.add("restricted")
        let (idA, idB, idR) = (try await a.id, try await b.id, try await restricted.id)
        // A trusts B fully and R with a policy: write public/* only, no deletions, and
        // accepts documents of at most 2 KiB.
        let forgerDir = cluster.root + "/forger"
        let forger = try NodeIdentity.loadOrCreate(directory: forgerDir, name: "forger")
        let config = cluster.root + "/a.json"
        try """
            {"discovery":{"enabled":false},"limits":{"maxDocumentBytes":2048},
             "trust":[{"id":"\(idB)"},{"id":"\(forger.nodeID)"},
                      {"id":"\(idR)","policy":{"write":{"ids":["public/*"]},"mayDelete":false}}]}
            """.write(toFile: config, atomically: true, encoding: .utf8)
        try await a.start(["--config", config])
        try await b.start(["--peer", "\(a.url)#\(idA)"])
        try await a.admin.put("public/shared", #"{"v":1}"#)
        try await cluster.awaitConvergence(among: [a, b])

        // 1. The restricted peer: forbidden writes, a forbidden delete and an oversized document.
        try await restricted.start(["--peer", "\(a.url)#\(idA)"])
        try await cluster.awaitConvergence(among: [a, restricted])  // it may read everything
        let sharedRev = try await restricted.admin.get("/docs/public/shared")["_rev"]?.stringValue ?? ""
        try await restricted.admin.put("public/ok", "{}")
        try await restricted.admin.put("private/forbidden", "{}")
        try await restricted.admin.put("public/huge", #"{"pad":"\#(String(repeating: "x", count: 4096))"}"#)
        #expect(try await restricted.admin.call("DELETE", "/docs/public/shared?rev=\(sharedRev)").status == 200)
        try await waitUntil("A receives the allowed document") { try await a.admin.call("GET", "/docs/public/ok").status == 200 }
        try await waitUntil("A counts three policy or size rejections") {
            try await a.admin.metric("ferry_documents_rejected_total", labelsContaining: [#"direction="push""#]) >= 3
        }
        #expect(try await a.admin.call("GET", "/docs/private/forbidden").status == 404)
        #expect(try await a.admin.call("GET", "/docs/public/huge").status == 404)
        #expect(try await a.admin.get("/docs/public/shared")["_deleted"] == nil)

        // 2. An unknown certificate: refused in the TLS handshake, nothing exchanged.
        let stranger = cluster.root + "/stranger"
        try FileManager.default.createDirectory(atPath: stranger, withIntermediateDirectories: true)
        _ = try await Ferry.run(["--data", stranger, "put", "from-stranger", "{}"])
        let refused = try await Ferry.run(["--data", stranger, "sync", a.url, "--pin", idA])
        #expect(refused.status != 0)
        #expect(try await a.admin.call("GET", "/docs/from-stranger").status == 404)

        // 3. A trusted peer replaying revisions whose bodies do not match their IDs.
        var client = try await RawClient.connect(to: a, nodeID: idA, identity: forger)
        let hello = try await client.requestJSON("hello", ["nodeID": .string(forger.nodeID), "protocol": [1]])
        #expect(hello?.kind == .response)
        let honest: JSON = ["v": "honest"]
        let forgedRev = RevisionID.compute(parent: nil, deleted: false, canonicalBody: honest.canonicalBytes)
        let forged = WireRevision(
            id: "forged", rev: forgedRev.description, history: [], deleted: false, hlc: 0,
            content: JSON.object(["v": "tampered"]).canonicalBytes, deltaBase: nil)
        let reply = try await client.request("putRevs", WireRevision.encodeBatch([forged]))
        let results = (try? reply?.json())?["results"]?.items ?? []
        #expect(results.first?["status"] == "rejected", "\(String(describing: results))")
        #expect(results.first?["reason"]?.stringValue?.hasPrefix("digest") == true)
        #expect(try await a.admin.call("GET", "/docs/forged").status == 404)

        // 4. Malformed, truncated, out-of-order and huge messages.
        var early = try await RawClient.connect(to: a, nodeID: idA, identity: forger)
        let outOfOrder = try await early.request("putRevs", WireRevision.encodeBatch([forged]))
        #expect(outOfOrder?.kind == .error)
        let garbage = try await RawClient.connect(to: a, nodeID: idA, identity: forger)
        #expect(await garbage.sendGarbageAndSeeClose(Array("this is not an envelope".utf8)))
        let truncated = try await RawClient.connect(to: a, nodeID: idA, identity: forger)
        #expect(await truncated.sendGarbageAndSeeClose(Array(Message(kind: .request, number: 1, properties: [("Profile", "hello")]).encoded().prefix(5))))
        let huge = try await RawClient.connect(to: a, nodeID: idA, identity: forger)
        #expect(await huge.sendGarbageAndSeeClose([UInt8](repeating: 0xFE, count: 20 << 20)))
        var batchOfLies = try await RawClient.connect(to: a, nodeID: idA, identity: forger)
        _ = try await batchOfLies.requestJSON("hello", ["nodeID": .string(forger.nodeID), "protocol": [1]])
        let lies = try await batchOfLies.request("putRevs", [0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 1, 2, 3])
        #expect(lies?.kind == .error)

        // Honest peers keep syncing, and nothing bad was stored.
        try await b.admin.put("after-the-attacks", "{}")
        try await waitUntil("A still syncs with B") { try await a.admin.call("GET", "/docs/after-the-attacks").status == 200 }
        try await cluster.awaitConvergence(among: [a, b])
        _ = await a.stop()
        let check = try await Ferry.run(["--data", a.dataDirectory, "check", "--json"])
        #expect(check.stdout.contains(#""ok":true"#), "\(check.stdout)")
        await finish(cluster, allowing: expectedRefusals + ["refusing", "closing connection", "too large", "bad message"])
    }
}
