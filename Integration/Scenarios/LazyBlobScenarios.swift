import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Scenario 28: blob fetch policies between real `ferry serve` processes on loopback.
@Suite(.serialized, .timeLimit(.minutes(10))) struct LazyBlobScenarios {
    /// A node whose policy is eager up to 100 KB gets documents at once, small blobs with
    /// them and large ones on first read (`ferry blob get`), from the peer that has them; a
    /// large blob no connected peer can send is a clear "unavailable" (CLI exit 5, HTTP 503).
    @Test func aLazyPeerGetsDocumentsAtOnceAndALargeBlobOnFirstRead() async throws {
        let cluster = Cluster("lazy")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        let (idA, idB) = (try await a.id, try await b.id)
        let config = cluster.root + "/b.json"
        try #"{"discovery":{"enabled":false},"blobs":{"fetch":"100KB"}}"#.write(toFile: config, atomically: true, encoding: .utf8)
        try await a.start(["--no-discovery", "--trust", idB])
        try await b.start(["--config", config, "--trust", idA, "--peer", "\(a.url)#\(idA)"])

        func blob(_ name: String, _ size: Int, on node: Node) async throws -> (ref: String, digest: String, file: String) {
            let file = cluster.root + "/\(name).bin"
            try Data((0..<size).map { UInt8(($0 &* 7 &+ size) % 253) }).write(to: URL(fileURLWithPath: file))
            let put = try await Ferry.run(["--data", node.dataDirectory, "blob", "put", file, "--json"])
            #expect(put.status == 0, "\(put.stderr)")
            let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            return (ref, try JSON.parse(ref)["digest"]?.stringValue ?? "", file)
        }
        func state(_ digest: String, on node: Node) async throws -> JSON {
            let r = try await Ferry.run(["--data", node.dataDirectory, "blob", "state", digest, "--json"])
            return try JSON.parse(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        }

        let small = try await blob("small", 20_000, on: a)
        let large = try await blob("large", 3_000_000, on: a)
        try await a.admin.put("note", #"{"f":\#(small.ref)}"#)
        try await a.admin.put("scan", #"{"f":\#(large.ref)}"#)
        try await cluster.awaitConvergence()
        #expect(try await state(small.digest, on: b)["state"] == "present")
        let deferred = try await state(large.digest, on: b)
        #expect(deferred["state"] == "deferred", "\(deferred)")
        #expect(deferred["length"] == 3_000_000)
        #expect(try await b.admin.get("/docs/scan")["f"]?["digest"]?.stringValue == large.digest)

        // First read: fetched from A over the open link.
        let fetched = cluster.root + "/fetched.bin"
        let get = try await Ferry.run(["--data", b.dataDirectory, "blob", "get", large.digest, "-o", fetched])
        #expect(get.status == 0, "\(get.stderr)")
        #expect(FileManager.default.contentsEqual(atPath: fetched, andPath: large.file))
        #expect(try await state(large.digest, on: b)["state"] == "present")

        // A second large blob arrives deferred; then A goes away.
        let later = try await blob("later", 2_000_000, on: a)
        try await a.admin.put("later", #"{"f":\#(later.ref)}"#)
        try await cluster.awaitConvergence()
        _ = await a.stop()
        let offline = try await Ferry.run(["--data", b.dataDirectory, "blob", "get", later.digest, "-o", cluster.root + "/x.bin"])
        #expect(offline.status == 5, "\(offline.stdout) \(offline.stderr)")
        #expect(offline.stderr.contains("unavailable"))
        let http = try await b.admin.call("GET", "/blobs/\(later.digest)")
        #expect(http.status == 503)
        #expect(http.json["error"] == "blob_unavailable")
        #expect(try await b.admin.call("GET", "/blobs/\(large.digest)").status == 200)
        await finish(cluster, allowing: ["connect_failed", "peer_silent", "disconnected", "went silent", "replication offline"])
    }

    /// An eager node whose only peer is a lazy one still gets every blob: when it asks the
    /// lazy node for a blob deferred there, that node fetches it from its own peer first.
    @Test func anEagerNodeBehindALazyOneGetsTheBlobThroughIt() async throws {
        let cluster = Cluster("lazy-relay")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        let c = cluster.add("c")
        let (idA, idB, idC) = (try await a.id, try await b.id, try await c.id)
        let config = cluster.root + "/b.json"
        try #"{"discovery":{"enabled":false},"blobs":{"fetch":"lazy"}}"#.write(toFile: config, atomically: true, encoding: .utf8)
        try await a.start(["--no-discovery", "--trust", idB])
        try await b.start(["--config", config, "--trust", idA, "--trust", idC, "--peer", "\(a.url)#\(idA)"])
        try await c.start(["--no-discovery", "--trust", idB, "--peer", "\(b.url)#\(idB)"])
        let file = cluster.root + "/scan.bin"
        try Data((0..<3_000_000).map { UInt8(($0 &* 13) % 251) }).write(to: URL(fileURLWithPath: file))
        let put = try await Ferry.run(["--data", a.dataDirectory, "blob", "put", file, "--json"])
        #expect(put.status == 0, "\(put.stderr)")
        let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let digest = try JSON.parse(ref)["digest"]?.stringValue ?? ""
        try await a.admin.put("scan", #"{"f":\#(ref)}"#)
        try await waitUntil("C stores the document with its blob", timeout: 60, every: .milliseconds(100)) {
            try await c.admin.call("GET", "/docs/scan").status == 200
        }
        let copy = cluster.root + "/on-c.bin"
        let get = try await Ferry.run(["--data", c.dataDirectory, "blob", "get", digest, "-o", copy])
        #expect(get.status == 0, "\(get.stderr)")
        #expect(FileManager.default.contentsEqual(atPath: copy, andPath: file))
        // B fetched it for C: it holds it now too.
        let onB = try await Ferry.run(["--data", b.dataDirectory, "blob", "state", digest, "--json"])
        #expect(try JSON.parse(onB.stdout.trimmingCharacters(in: .whitespacesAndNewlines))["state"] == "present")
        await finish(cluster, allowing: ["connect_failed", "peer_silent", "disconnected", "went silent", "replication offline", "unavailable"])
    }
}
