import FerryCore
import FerryStore
import Foundation
import Hummingbird
import HummingbirdCore

/// The admin API's access routes: the group's rules and role assignments (list, add,
/// remove), the explain answer, and the documents purged here for access.
extension AdminAPI {
    func addAccessRoutes(to router: Router<BasicRequestContext>) {
        router.get("/access") { _, _ in try accessInfo() }
        router.put("/access/rules/:name") { request, ctx in try await putRule(request, name: try pathPart(ctx, "name")) }
        router.delete("/access/rules/:name") { _, ctx in try removeRule(try pathPart(ctx, "name")) }
        router.put("/access/roles/:principal") { request, ctx in try await putRoles(request, who: try pathPart(ctx, "principal")) }
        router.get("/access/explain") { request, _ in try explain(request) }
        router.get("/access/removed") { request, _ in try accessRemoved(request) }
    }

    func pathPart(_ ctx: BasicRequestContext, _ name: String) throws -> String {
        let raw = try ctx.parameters.require(name)
        return raw.removingPercentEncoding ?? raw
    }

    /// `GET /access`: the version in force, every stored rule (active or not, and whether it
    /// counts) and every role assignment.
    func accessInfo() throws -> Response {
        let access = node.access
        let snapshot = access.snapshot
        let stored = access.storedEntries
        let view = node.membership.view
        let removed = try node.store.accessRemovals().total
        return json([
            "version": .string(snapshot.version),
            "rules": .array(stored.rules.map { r in
                var o = Self.ruleJSON(r).objectValue!
                o["inForce"] = .bool(snapshot.rules[r.name] == r)
                return .object(o)
            }),
            "roles": .array(stored.roles.map { a in
                var o: [String: JSON] = [
                    "principal": .string(a.principal), "roles": .array(a.roles.map(JSON.string)), "version": .int(a.version),
                    "signer": .string(a.signer), "inForce": .bool(snapshot.roles[a.principal] != nil),
                ]
                if let name = view?.selected[a.principal]?.name { o["name"] = .string(name) }
                return .object(o)
            }),
            "self": .object([
                "id": .string(access.nodeID), "roles": .array((snapshot.roles[access.nodeID] ?? []).map(JSON.string)),
            ]),
            "removed": .int(removed),
        ])
    }

    static func ruleJSON(_ r: AccessRuleEntry) -> JSON {
        var o: [String: JSON] = [
            "name": .string(r.name), "roles": .array(r.roles.map(JSON.string)), "delete": .bool(r.delete),
            "state": .string(r.state.rawValue), "version": .int(r.version), "signer": .string(r.signer),
        ]
        o["read"] = r.read?.json ?? .null
        o["write"] = r.write?.json ?? .null
        return .object(o)
    }

    /// `PUT /access/rules/{name}` `{"roles": [...], "read"?: {"ids"?, "selector"?}, "write"?: ..., "delete"?: bool}`.
    func putRule(_ request: Request, name: String) async throws -> Response {
        let body = try await readJSON(request)
        guard let o = body.objectValue else { throw AccessError.malformed("the request body is not a JSON object") }
        if let extra = o.keys.sorted().first(where: { !["roles", "read", "write", "delete"].contains($0) }) {
            throw AccessError.malformed("unknown member \"\(LogText.escape(extra))\" (roles, read, write, delete)")
        }
        let roles = try AccessNames.roles(o["roles"])
        func match(_ key: String) throws -> AccessMatch? {
            guard let v = o[key], v != .null else { return nil }
            return try AccessMatch(parsing: v, key)
        }
        var delete = false
        if let d = o["delete"] {
            guard let b = d.boolValue else { throw AccessError.malformed("\"delete\" is not a boolean") }
            delete = b
        }
        let entry = try node.access.setRule(
            name, roles: roles, read: try match("read"), write: try match("write"), delete: delete, membership: node.membership)
        node.logger.notice("access rule set", metadata: ["rule": "\(name)", "version": "\(entry.version)"])
        return json(Self.ruleJSON(entry))
    }

    /// `DELETE /access/rules/{name}`: signs the rule as removed.
    func removeRule(_ name: String) throws -> Response {
        let entry = try node.access.removeRule(name, membership: node.membership)
        node.logger.notice("access rule removed", metadata: ["rule": "\(name)"])
        return json(Self.ruleJSON(entry))
    }

    /// `PUT /access/roles/{member | user:NAME}` `{"roles": [...]}` (empty: no roles).
    func putRoles(_ request: Request, who: String) async throws -> Response {
        let body = try await readJSON(request)
        guard let o = body.objectValue, o.keys.allSatisfy({ $0 == "roles" }) else {
            throw AccessError.malformed("the request body must be {\"roles\": [ROLE, ...]}")
        }
        let a = try node.access.setRoles(who, roles: try AccessNames.roles(o["roles"]), membership: node.membership)
        node.logger.notice("access roles set", metadata: ["principal": "\(a.principal)", "roles": "\(a.roles.joined(separator: ","))"])
        return json(["principal": .string(a.principal), "roles": .array(a.roles.map(JSON.string)), "version": .int(a.version)])
    }

    /// `GET /access/explain?doc=ID&principal=WHO[&body=JSON]`: which rule admits the document.
    func explain(_ request: Request) throws -> Response {
        let q = request.uri.queryParameters
        guard let doc = q.get("doc"), let who = q.get("principal") else {
            throw AccessError.malformed("explain needs ?doc=ID&principal=MEMBER|user:NAME")
        }
        let id = try DocumentID(doc)
        var body: JSON?
        if let text = q.get("body") {
            do { body = try JSON.parse(Array(text.utf8)) } catch { throw AccessError.malformed("body is not JSON: \(error)") }
        }
        let answer = try node.access.explain(id, body: body, who: who, membership: node.membership, store: node.store)
        var o = answer.json.objectValue!
        o["doc"] = .string(id.rawValue)
        return json(.object(o))
    }

    /// `GET /access/removed?after=N`: documents purged here because this node lost access.
    func accessRemoved(_ request: Request) throws -> Response {
        let after = request.uri.queryParameters.get("after").flatMap { Int64($0) } ?? 0
        let (total, removals) = try node.store.accessRemovals(after: after)
        return json([
            "total": .int(total),
            "removed": .array(removals.map { r in
                .object(["number": .int(r.number), "id": .string(r.id), "reason": .string(r.reason), "time": .double(r.time)])
            }),
        ])
    }
}
