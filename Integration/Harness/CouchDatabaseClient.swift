import FerryCore
import Foundation

/// A node's one CouchDB database, reached through its loopback CouchDB listener with the
/// node's admin key (on a LAN-lab host, through `curl` inside that host): documents,
/// attachments, replicated writes, and a snapshot of every leaf to compare nodes by.
public struct CouchDatabaseClient: Sendable {
    public let node: Node
    /// The database's name: the node's group.
    public let name: String
    public let client: AdminClient

    /// The database's URL, as a replication names it (`http://127.0.0.1:PORT/NAME`).
    public var url: String { client.base + "/" + name }

    /// The database of a started node.
    public init(_ node: Node) async throws {
        let couch = node.couchURL
        guard !couch.isEmpty, let key = node.adminKey else {
            throw HarnessError("\(node.name) serves no CouchDB API (node.json: \(node.info))")
        }
        self.node = node
        client = AdminClient(base: couch.hasSuffix("/") ? String(couch.dropLast()) : couch, host: node.host, key: key)
        name = try await node.admin.get("/")["group"]?.stringValue ?? "ferry"
    }

    /// One request to `/NAME` + `path`; fails unless the status is one of `expect`.
    @discardableResult
    public func call(
        _ method: String, _ path: String, body: JSON? = nil, headers: [String: String] = [:], expect: Set<Int> = [200, 201, 202]
    ) async throws -> AdminClient.Reply {
        let reply = try await client.call(method, "/\(name)\(path)", body: body?.canonicalString, headers: headers)
        guard expect.contains(reply.status) else {
            throw HarnessError("\(node.name): \(method) /\(name)\(path) answered \(reply.status): \(reply.text.prefix(400))")
        }
        return reply
    }

    /// Writes a document (an update with `rev`), with `attachments` (name → text) inline;
    /// returns the new revision.
    @discardableResult
    public func put(_ id: String, _ fields: [String: JSON], rev: String? = nil, attachments: [String: String] = [:]) async throws -> String {
        var body = fields
        if let rev { body["_rev"] = .string(rev) }
        if !attachments.isEmpty {
            body["_attachments"] = .object(attachments.mapValues { text -> JSON in
                ["content_type": "text/plain", "data": .string(Data(text.utf8).base64EncodedString())]
            })
        }
        let reply = try await call("PUT", "/\(id)", body: .object(body))
        guard let new = reply.json["rev"]?.stringValue else { throw HarnessError("PUT \(id) answered no rev: \(reply.text)") }
        return new
    }

    /// Deletes a document's revision `rev`; returns the tombstone's revision.
    @discardableResult
    public func delete(_ id: String, rev: String) async throws -> String {
        let reply = try await call("DELETE", "/\(id)?rev=\(rev)")
        guard let new = reply.json["rev"]?.stringValue else { throw HarnessError("DELETE \(id) answered no rev: \(reply.text)") }
        return new
    }

    /// Stores revisions as a replicator does (`_bulk_docs` with `new_edits: false`); fails
    /// if any is refused.
    public func storeReplicated(_ docs: [JSON]) async throws {
        let reply = try await call("POST", "/_bulk_docs", body: ["new_edits": false, "docs": .array(docs)])
        guard !reply.text.contains("\"error\"") else { throw HarnessError("\(node.name) refused replicated revisions: \(reply.text)") }
    }

    /// The document's current revision, with `_conflicts` and `_deleted_conflicts`.
    public func document(_ id: String) async throws -> JSON {
        try await call("GET", "/\(id)?conflicts=true&deleted_conflicts=true").json
    }

    /// Whether the document exists and is not deleted.
    public func exists(_ id: String) async throws -> Bool {
        try await call("GET", "/\(id)", expect: [200, 404]).status == 200
    }

    /// An attachment's bytes, as text.
    public func attachment(_ id: String, _ name: String) async throws -> String {
        try await call("GET", "/\(id)/\(name)").text
    }

    /// Every document's leaves, by ID (deleted documents included): the winner, as the
    /// changes feed lists it first, and each leaf as `GET ?open_revs=all&revs=true` renders
    /// it (body, `_deleted`, `_revisions`, attachment stubs with digest, revpos and length).
    /// Two nodes with equal snapshots hold the same revisions and pick the same winners.
    public func snapshot() async throws -> [String: JSON] {
        let changes = try await call("GET", "/_changes?style=all_docs").json["results"]
        guard case .array(let rows)? = changes else { throw HarnessError("\(node.name): _changes without results") }
        var out: [String: JSON] = [:]
        for row in rows {
            guard let id = row["id"]?.stringValue, case .array(let revs)? = row["changes"], let winner = revs.first?["rev"] else {
                continue
            }
            out[id] = ["winner": winner, "leaves": try await leaves(id)]
        }
        return out
    }

    /// The document's leaves by revision, with their histories and attachment stubs.
    public func leaves(_ id: String) async throws -> JSON {
        let reply = try await call("GET", "/\(id)?open_revs=all&revs=true", headers: ["Accept": "application/json"])
        guard case .array(let items) = reply.json else { throw HarnessError("\(node.name): open_revs of \(id): \(reply.text)") }
        var leaves: [String: JSON] = [:]
        for item in items {
            guard let doc = item["ok"], let rev = doc["_rev"]?.stringValue else { continue }
            leaves[rev] = doc
        }
        return .object(leaves)
    }
}

/// The differences between two snapshots (at most `limit` documents), for failure messages.
public func snapshotDifferences(_ a: [String: JSON], _ b: [String: JSON], limit: Int = 10) -> String {
    let ids = Set(a.keys).union(b.keys).sorted().filter { a[$0] != b[$0] }
    let lines = ids.prefix(limit).map { id in
        "  \(id):\n    \(a[id]?.canonicalString.prefix(600) ?? "absent")\n    \(b[id]?.canonicalString.prefix(600) ?? "absent")"
    }
    return "\(ids.count) documents differ (\(a.count) and \(b.count) documents)\n" + lines.joined(separator: "\n")
}

extension Node {
    /// The replication `id` as the admin API lists it (its spec, and `status`).
    public func replication(_ id: String) async throws -> JSON {
        let list = try await admin.get("/replications")["replications"]
        guard case .array(let items)? = list, let found = items.first(where: { $0["id"]?.stringValue == id }) else {
            throw HarnessError("\(name) lists no replication \(id): \(list ?? .null)")
        }
        return found
    }

    /// Adds a replication through the admin API (`POST /replications`).
    public func addReplication(_ spec: JSON) async throws {
        let r = try await admin.call("POST", "/replications", body: spec.canonicalString)
        guard r.status == 201 else { throw HarnessError("\(name): POST /replications answered \(r.status): \(r.text)") }
    }

    /// Stops and forgets a replication added through the admin API.
    public func removeReplication(_ id: String) async throws {
        let r = try await admin.call("DELETE", "/replications/\(id)")
        guard r.status == 200 else { throw HarnessError("\(name): DELETE /replications/\(id) answered \(r.status): \(r.text)") }
    }

    /// Waits until the replication's status satisfies `condition`, and returns it; throws
    /// naming `what` and the last status otherwise.
    @discardableResult
    public func awaitReplication(
        _ id: String, _ what: String, timeout: Double = 60, _ condition: (JSON) -> Bool
    ) async throws -> JSON {
        var last: JSON = .null
        let held = try await eventually(timeout, every: .milliseconds(100)) {
            last = try await replication(id)["status"] ?? .null
            return condition(last)
        }
        guard held else { throw HarnessError("\(name)'s replication \(id) never \(what) in \(timeout) s; status \(last)") }
        return last
    }

    /// Writes `user:password` for this node's CouchDB API (the admin key) to a file readable
    /// only by its owner, beside the node's data directory; returns its path.
    public func couchCredentialsFile() throws -> String {
        guard let key = adminKey else { throw HarnessError("\(name) has no admin key yet: start it first") }
        let path = dataDirectory + ".couch-credentials"
        guard FileManager.default.createFile(atPath: path, contents: Data("admin:\(key)\n".utf8), attributes: [.posixPermissions: 0o600])
        else { throw HarnessError("cannot write \(path)") }
        return path
    }
}
