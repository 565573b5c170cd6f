import Ferry
import Foundation
import IntegrationHarness
import Testing

// README example begins
/// Writes a note in an app's own store, replicates it with a Ferry node over pinned TLS,
/// then with the node's CouchDB API as a CouchDB user; returns what each run moved.
func replicateWithNode(
    directory: String, nodeURL: String, nodeID: String, couchURL: String, password: String
) async throws -> [ReplicationSummary] {
    let store = try DocumentStore.open(directory: directory)
    let identity = try NodeIdentity.loadOrCreate(directory: directory)  // the node trusts identity.nodeID
    _ = try store.put(DocumentID("note-from-app"), body: ["text": "written by the app"])

    var settings = ReplicationSettings()  // push and pull, once
    settings.pullFilter = RevisionFilter(name: "no-drafts") { $0.deleted || $0.body["draft"] != .bool(true) }
    let peer = try FerryReplication(
        store: store, target: .peer(url: nodeURL, pin: nodeID, identity: identity), settings: settings)
    peer.start()
    await peer.waitUntilStopped()
    if let error = peer.status.error { throw error }

    let couch = try FerryReplication(
        store: store, target: .couchDB(url: couchURL, credentials: CouchCredentials(user: "tablet", password: password)))
    couch.start()
    await couch.waitUntilStopped()
    await couch.shutdown()
    if let error = couch.status.error { throw error }
    return [peer.summary, couch.summary]
}
// README example ends

/// The README's embedding example, verbatim above, run against a real `ferry serve`: an
/// app that imports only `Ferry` replicates with the node over pinned TLS (whose pull
/// filter refuses the node's draft) and then over the CouchDB protocol (no filter).
@Suite(.serialized, .timeLimit(.minutes(5))) struct EmbeddingScenarios {
    @Test func theReadmeExampleReplicatesWithARealNodeOverTLSAndTheCouchDBProtocol() async throws {
        let cluster = Cluster("embedding")
        defer { cluster.cleanUp() }
        let node = cluster.add("node")
        let app = cluster.root + "/app-data"
        let appID = try NodeIdentity.loadOrCreate(directory: app).nodeID
        try await node.start(["--couch-port", "0", "--trust", appID])
        try await node.admin.put("on-node", #"{"text":"written on the node"}"#)
        try await node.admin.put("draft-on-node", #"{"draft":true}"#)
        let passwordFile = cluster.root + "/tablet.pw"
        try "tablet-secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let added = try await IntegrationHarness.Ferry.run(["--data", node.dataDirectory, "couch-user", "add", "tablet", "--password-file", passwordFile, "--write-all"])
        #expect(added.status == 0, "\(added.stderr)")
        let group = try await node.admin.get("/")["group"]?.stringValue ?? "ferry"
        try await node.admin.put("via-couch", #"{"text":"read by the app as tablet"}"#)

        let summaries = try await replicateWithNode(
            directory: app, nodeURL: node.url, nodeID: node.id, couchURL: node.couchURL + group, password: "tablet-secret")

        let (peer, couch) = (summaries[0], summaries[1])
        #expect(peer.pushed == 1 && peer.pulled == 2 && peer.rejected == 1, "over TLS, the draft refused by the filter: \(peer)")
        #expect(couch.pulled == 1, "over the CouchDB protocol, without a filter, the draft arrives: \(couch)")
        #expect(try await node.admin.call("GET", "/docs/note-from-app").status == 200, "pushed to the node")
        let store = try DocumentStore.open(directory: app)
        for id in ["on-node", "via-couch", "draft-on-node", "note-from-app"] {
            #expect(try store.document(DocumentID(id)) != nil, "\(id) in the app's store")
        }
        await finish(cluster, allowing: expectedRefusals)
    }

    /// The README shows exactly the code this file compiles and runs.
    @Test func theReadmeShowsTheExampleThisFileRuns() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        let source = try String(contentsOf: URL(fileURLWithPath: #filePath), encoding: .utf8)
        let begin = "// README example begins\n", end = "// README example ends\n"
        let example = source.components(separatedBy: begin)[1].components(separatedBy: end)[0]
        #expect(readme.contains("```swift\nimport Ferry\n\n" + example + "```"), "README's library example differs from EmbeddingScenarios.swift")
    }
}
