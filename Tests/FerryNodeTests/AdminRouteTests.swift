import FerryCore
import FerrySync
import Foundation
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import FerryNode

/// An admin API over a node on a temporary data directory, its requests routed in-process;
/// its peer manager exists but is not run, so no peer is discovered or dialled by itself.
struct RoutedNode {
    let node: FerryNode
    let api: AdminAPI
    let manager: PeerManager
    let directory: String

    init(_ configure: (inout NodeConfiguration) -> Void = { _ in }) throws {
        var c = NodeConfiguration()
        c.name = "routed"
        c.discovery = false
        configure(&c)
        directory = NSTemporaryDirectory() + "ferry-routes-\(UUID().uuidString)"
        node = try FerryNode(configuration: c, dataDirectory: directory)
        let parts = node.makeParts(discovery: nil)
        manager = parts.manager
        api = parts.admin
    }

    /// Runs `body` against the router, then stops what the routes started and removes the data directory.
    func test(_ body: @Sendable (AdminClient) async throws -> Void) async throws {
        let app = Application(router: api.router())
        let key = node.adminKey.value
        do {
            try await app.test(.router) { client in try await body(AdminClient(client: client, key: key)) }
        } catch {
            await manager.stopAll()
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        await manager.stopAll()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// One admin request's answer: the status, the body parsed as JSON (nil if it is not), the headers.
struct AdminAnswer {
    let status: Int
    let json: JSON?
    let text: String
    let headers: HTTPFields

    /// The `error` code of an error body.
    var code: String? { json?["error"]?.stringValue }
    subscript(_ key: String) -> JSON? { json?[key] }
}

/// Sends requests as the CLI does: with the admin key and, for a body, `Content-Type: application/json`.
struct AdminClient: Sendable {
    let client: any TestClientProtocol
    let key: String

    func call(
        _ method: HTTPRequest.Method, _ path: String, body: String? = nil, headers: [String: String] = [:], withKey: Bool = true
    ) async throws -> AdminAnswer {
        var fields = HTTPFields()
        if withKey { fields[.authorization] = "Bearer \(key)" }
        if body != nil { fields[.contentType] = "application/json" }
        for (name, value) in headers {
            let field = try #require(HTTPFields.Element.Name(name))
            fields[field] = value.isEmpty ? nil : value
        }
        let response = try await client.execute(uri: path, method: method, headers: fields, body: body.map { ByteBuffer(string: $0) })
        let bytes = Array(response.body.readableBytesView)
        return AdminAnswer(
            status: response.status.code, json: try? JSON.parse(bytes), text: String(decoding: bytes, as: UTF8.self),
            headers: response.headers)
    }
}

extension JSON {
    var arrayCount: Int? { if case .array(let a) = self { a.count } else { nil } }
}

/// Every admin route and the guard, called in-process through the router: statuses, error
/// codes and body shapes as docs/operations.md gives them.
@Suite(.timeLimit(.minutes(2))) struct AdminRouteTests {
    static let peerA = String(repeating: "a", count: 64)
    static let peerB = String(repeating: "b", count: 64)

    @Test func theNodeRouteDescribesTheNodeAndItsDatabase() async throws {
        let n = try RoutedNode()
        try await n.test { c in
            let info = try await c.call(.get, "/")
            #expect(info.status == 200)
            #expect(info.headers[.contentType] == "application/json")
            for key in ["id", "name", "version", "group", "port", "database", "docCount", "deletedCount", "conflictedCount", "lastSequence", "digest"] {
                #expect(info[key] != nil, "no \(key)")
            }
            #expect(info["id"]?.stringValue == n.node.identity.nodeID)
            #expect(info["version"]?.stringValue == FerryVersion.current)
        }
    }

    @Test func aDocumentIsWrittenReadListedAndDeletedWithItsDocumentedStatuses() async throws {
        let n = try RoutedNode()
        try await n.test { c in
            let created = try await c.call(.put, "/docs/notes/one", body: #"{"text":"hi"}"#)
            #expect(created.status == 201)
            let rev = try #require(created["rev"]?.stringValue)
            #expect(created["id"]?.stringValue == "notes/one")

            let read = try await c.call(.get, "/docs/notes/one")
            #expect(read.status == 200 && read["_id"]?.stringValue == "notes/one" && read["_rev"]?.stringValue == rev)
            #expect(read["text"]?.stringValue == "hi")

            let stale = try await c.call(.put, "/docs/notes/one", body: #"{"text":"again"}"#)
            #expect(stale.status == 409 && stale.code == "conflict")
            let updated = try await c.call(.put, "/docs/notes/one?rev=\(rev)", body: #"{"text":"again"}"#)
            #expect(updated.status == 201)
            let newRev = try #require(updated["rev"]?.stringValue)

            let list = try await c.call(.get, "/docs?limit=1")
            #expect(list.status == 200 && list["rows"]?.arrayCount == 1 && list["next"] == .null)

            let noRev = try await c.call(.delete, "/docs/notes/one")
            #expect(noRev.status == 400 && noRev.code == "bad_request")
            let notLeaf = try await c.call(.delete, "/docs/notes/one?rev=\(rev)")
            #expect(notLeaf.status == 409 && notLeaf.code == "conflict")
            let deleted = try await c.call(.delete, "/docs/notes/one?rev=\(newRev)")
            #expect(deleted.status == 200 && deleted["deleted"] == .bool(true))
            let afterDelete = try await c.call(.get, "/docs/notes/one")
            #expect(afterDelete.status == 200 && afterDelete["_deleted"] == .bool(true))
            #expect(try await c.call(.get, "/docs?deleted=true")["rows"]?.arrayCount == 1)
        }
    }

    @Test func theNodesOwnDocumentsAreListedOnlyWhenAskedForByTheirPrefix() async throws {
        let n = try RoutedNode()
        for id in ["_ferry/state/x", "_ferry/state/y"] {
            try n.node.store.put(DocumentID(id, allowReserved: true), body: ["type": "entry"])
        }
        try n.node.store.put(DocumentID("_design/d", allowReserved: true), body: ["views": [:]])
        for id in ["a", "b"] { try n.node.store.put(DocumentID(id), body: [:]) }
        try await n.test { c async throws in
            func ids(_ path: String) async throws -> [String] {
                guard case .array(let rows)? = try await c.call(.get, path)["rows"] else { return [] }
                return rows.compactMap { $0["id"]?.stringValue }
            }
            #expect(try await ids("/docs") == ["_design/d", "a", "b"])
            #expect(try await ids("/docs?limit=1&after=_design/d") == ["a"])
            #expect(try await ids("/docs?prefix=_ferry/") == ["_ferry/state/x", "_ferry/state/y"])
            #expect(try await c.call(.get, "/")["docCount"] == 3)
        }
    }

    @Test func badDocumentRequestsAnswerTheirOwnErrorCodes() async throws {
        let n = try RoutedNode { $0.limits.maxDocumentBytes = 1024 }
        try await n.test { c in
            let missing = try await c.call(.get, "/docs/nothing")
            #expect(missing.status == 404 && missing.code == "not_found")
            #expect(missing["reason"]?.stringValue?.isEmpty == false)
            let badRev = try await c.call(.get, "/docs/nothing?rev=zzz")
            #expect(badRev.status == 400 && badRev.code == "bad_rev")
            _ = try await c.call(.put, "/docs/one", body: "{}")
            let otherRev = try await c.call(.get, "/docs/one?rev=9-\(String(repeating: "0", count: 64))")
            #expect(otherRev.status == 404 && otherRev.code == "revision_not_found")
            let badJSON = try await c.call(.put, "/docs/one", body: "{not json")
            #expect(badJSON.status == 400 && badJSON.code == "bad_json")
            let mismatched = try await c.call(.put, "/docs/one", body: #"{"_id":"two"}"#)
            #expect(mismatched.status == 400 && mismatched.code == "bad_id")
            let notObject = try await c.call(.put, "/docs/three", body: "[1]")
            #expect(notObject.status == 400 && notObject.code == "invalid_body")
            let tooLarge = try await c.call(.put, "/docs/big", body: #"{"x":"\#(String(repeating: "y", count: 200_000))"}"#)
            #expect(tooLarge.status == 413 && tooLarge.code == "too_large")
            let badLimit = try await c.call(.get, "/docs?limit=0")
            #expect(badLimit.status == 400 && badLimit.code == "bad_request")
            let deleteMissing = try await c.call(.delete, "/docs/nothing?rev=1-\(String(repeating: "0", count: 64))")
            #expect(deleteMissing.status == 404 && deleteMissing.code == "not_found")
        }
    }

    @Test func aWriteRefusedByValidationIsForbidden() async throws {
        let configured = try NodeConfiguration.parse(["validation": ["types": ["note"]]], file: "test.json")
        let n = try RoutedNode { $0.validation = configured.validation }
        try await n.test { c in
            let refused = try await c.call(.put, "/docs/x", body: #"{"type":"order"}"#)
            #expect(refused.status == 403 && refused.code == "rejected")
            #expect(try await c.call(.put, "/docs/y", body: #"{"type":"note"}"#).status == 201)
        }
    }

    @Test func theChangesFeedPagesAndRefusesBadParameters() async throws {
        let n = try RoutedNode()
        try await n.test { c in
            for id in ["a", "b", "c"] { _ = try await c.call(.put, "/docs/\(id)", body: "{}") }
            let first = try await c.call(.get, "/changes?limit=2")
            #expect(first.status == 200 && first["results"]?.arrayCount == 2 && first["last_seq"]?.intValue == 2)
            let rest = try await c.call(.get, "/changes?since=2")
            #expect(rest["results"]?.arrayCount == 1 && rest["last_seq"]?.intValue == 3)
            let empty = try await c.call(.get, "/changes?since=3&feed=longpoll&timeout=0")
            #expect(empty.status == 200 && empty["results"]?.arrayCount == 0 && empty["last_seq"]?.intValue == 3)
            let badFeed = try await c.call(.get, "/changes?feed=continuous")
            #expect(badFeed.status == 400 && badFeed.code == "bad_request")
            #expect(try await c.call(.get, "/changes?since=-1").status == 400)
            #expect(try await c.call(.get, "/changes?timeout=300001").status == 400)
        }
    }

    @Test func peersAndReplicationsAreListedAddedAndRemoved() async throws {
        let configured = ReplicationSpec(id: "from-config", url: "wss://127.0.0.1:1/ferry/sync", peerID: Self.peerB)
        let n = try RoutedNode { $0.replications = [configured] }
        try await n.test { c in
            #expect(try await c.call(.get, "/peers")["peers"]?.arrayCount == 0)
            // A discovered peer nobody trusts is listed, not dialled.
            n.manager.handle(.appeared(peer(Self.peerA, port: 1)))
            let peers = try await c.call(.get, "/peers")
            let listedPeer = try #require(peers["peers"].flatMap { if case .array(let a) = $0 { a.first } else { nil } })
            #expect(peers.status == 200 && listedPeer["id"]?.stringValue == Self.peerA)
            #expect(listedPeer["source"]?.stringValue == "dns-sd" && listedPeer["trusted"] == .bool(false))
            #expect(listedPeer["connected"] == .bool(false) && listedPeer["replication"] == nil)
            #expect(try await c.call(.get, "/replications")["replications"]?.arrayCount == 0)

            let spec = #"{"id":"r1","url":"wss://127.0.0.1:1/ferry/sync","peer":"\#(Self.peerA)","continuous":false}"#
            let added = try await c.call(.post, "/replications", body: spec)
            #expect(added.status == 201 && added["id"]?.stringValue == "r1")
            let listed = try await c.call(.get, "/replications")
            let first = try #require(listed["replications"].flatMap { if case .array(let a) = $0 { a.first } else { nil } })
            #expect(first["id"]?.stringValue == "r1" && first["source"]?.stringValue == "api" && first["status"]?["activity"] != nil)
            let again = try await c.call(.post, "/replications", body: spec)
            #expect(again.status == 409 && again.code == "conflict")
            let fromConfig = try await c.call(.post, "/replications", body: #"{"id":"from-config","url":"wss://127.0.0.1:1/ferry/sync","peer":"\#(Self.peerB)"}"#)
            #expect(fromConfig.status == 409 && fromConfig.code == "conflict")
            let bad = try await c.call(.post, "/replications", body: #"{"id":"r2"}"#)
            #expect(bad.status == 400 && bad.code == "bad_request")

            let removed = try await c.call(.delete, "/replications/r1")
            #expect(removed.status == 200 && removed["removed"] == .bool(true))
            let unknown = try await c.call(.delete, "/replications/r1")
            #expect(unknown.status == 404 && unknown.code == "not_found")
            let configDelete = try await c.call(.delete, "/replications/from-config")
            #expect(configDelete.status == 409 && configDelete.code == "conflict")
        }
    }

    @Test func trustEntriesAreAddedChangedAndRemovedButConfigEntriesAreNot() async throws {
        let n = try RoutedNode { $0.trust = [.init(nodeID: Self.peerB, name: "fixed")] }
        try await n.test { c in
            let added = try await c.call(.post, "/trust", body: #"{"id":"\#(Self.peerA)","name":"tablet"}"#)
            #expect(added.status == 201 && added["id"]?.stringValue == Self.peerA && added["source"]?.stringValue == "api")
            #expect(try await c.call(.get, "/trust")["trusted"]?.arrayCount == 2)
            let again = try await c.call(.post, "/trust", body: #"{"id":"\#(Self.peerA)"}"#)
            #expect(again.status == 409 && again.code == "conflict")
            let badID = try await c.call(.post, "/trust", body: #"{"id":"not-a-fingerprint"}"#)
            #expect(badID.status == 400 && badID.code == "bad_request")

            let renamed = try await c.call(.put, "/trust/\(Self.peerA)", body: #"{"name":"phone"}"#)
            #expect(renamed.status == 200 && renamed["name"]?.stringValue == "phone")
            let unknown = try await c.call(.put, "/trust/\(String(repeating: "c", count: 64))", body: #"{"name":"x"}"#)
            #expect(unknown.status == 404 && unknown.code == "not_found")
            let fixedChange = try await c.call(.put, "/trust/\(Self.peerB)", body: #"{"name":"x"}"#)
            #expect(fixedChange.status == 409 && fixedChange.code == "conflict")
            let fixedRemoval = try await c.call(.delete, "/trust/\(Self.peerB)")
            #expect(fixedRemoval.status == 409 && fixedRemoval.code == "conflict")

            let removed = try await c.call(.delete, "/trust/\(Self.peerA)")
            #expect(removed.status == 200 && removed["removed"] == .bool(true))
            let gone = try await c.call(.delete, "/trust/\(Self.peerA)")
            #expect(gone.status == 404 && gone.code == "not_found")
        }
    }

    @Test func metricsAreServedAsPrometheusText() async throws {
        let n = try RoutedNode()
        try await n.test { c in
            let metrics = try await c.call(.get, "/metrics")
            #expect(metrics.status == 200)
            #expect(metrics.headers[.contentType]?.hasPrefix("text/plain") == true)
            #expect(metrics.text.contains("# HELP ferry_documents "))
        }
    }

    @Test func anUnknownRouteIsAJSONNotFound() async throws {
        let n = try RoutedNode()
        try await n.test { c in
            let unknown = try await c.call(.get, "/nowhere")
            #expect(unknown.status == 404 && unknown.code == "not_found")
            #expect(unknown["reason"]?.stringValue == "no route GET /nowhere")
            #expect(try await c.call(.patch, "/trust", body: "{}").status == 404)
        }
    }

    @Test func theGuardRefusesAForeignHostAWebOriginAMissingKeyAndANonJSONBody() async throws {
        let n = try RoutedNode()
        try await n.test { c in
            // The first Host is the authority (always localhost here); a second one is checked
            // too, and must agree with it.
            let foreignHost = try await c.call(.get, "/", headers: ["Host": "evil.example"])
            #expect(foreignHost.status == 421 && foreignHost.code == "misdirected")
            #expect(try await c.call(.get, "/", headers: ["Host": "LOCALHOST"]).status == 200)
            let twoHosts = try await c.call(.get, "/", headers: ["Host": "127.0.0.1:4986"])
            #expect(twoHosts.status == 421 && twoHosts.code == "misdirected")

            let fromPage = try await c.call(.post, "/trust", body: #"{"id":"\#(Self.peerA)"}"#, headers: ["Origin": "http://evil.example"])
            #expect(fromPage.status == 403 && fromPage.code == "forbidden_origin")

            let keyless = try await c.call(.get, "/", withKey: false)
            #expect(keyless.status == 401 && keyless.code == "unauthorized")
            #expect(keyless.headers[.wwwAuthenticate] == #"Bearer realm="ferry""#)
            let wrongKey = try await c.call(.get, "/", headers: ["Authorization": "Bearer " + String(repeating: "0", count: 64)])
            #expect(wrongKey.status == 401)
            // The guard runs before routing: an unknown route tells a keyless client nothing.
            #expect(try await c.call(.get, "/nowhere", withKey: false).status == 401)
            #expect(try await c.call(.get, "/metrics", withKey: false).status == 401)

            let form = try await c.call(
                .post, "/trust", body: #"{"id":"\#(Self.peerA)"}"#, headers: ["Content-Type": "application/x-www-form-urlencoded"])
            #expect(form.status == 415 && form.code == "unsupported_media_type")
            #expect(!n.node.trust.isTrusted(Self.peerA))
        }
    }

    @Test func listedOriginsAndPublicMetricsAreAdmitted() async throws {
        let n = try RoutedNode {
            $0.adminAllowedOrigins = ["http://localhost:8080"]
            $0.adminPublicMetrics = true
        }
        try await n.test { c in
            let listed = try await c.call(.get, "/", headers: ["Origin": "http://LOCALHOST:8080/"])
            #expect(listed.status == 200)
            #expect(try await c.call(.get, "/", headers: ["Origin": "http://localhost:8081"]).status == 403)
            #expect(try await c.call(.get, "/metrics", withKey: false).status == 200)
            #expect(try await c.call(.get, "/trust", withKey: false).status == 401)
        }
    }
}
