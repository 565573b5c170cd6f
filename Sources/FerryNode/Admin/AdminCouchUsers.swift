import FerryCore
import FerryCouch
import Foundation
import Hummingbird
import HummingbirdCore

/// The admin API's CouchDB-user routes: list, add, change and remove the users of the
/// CouchDB API while the node runs. Replies never carry a password or its hash.
extension AdminAPI {
    func addCouchUserRoutes(to router: Router<BasicRequestContext>) {
        router.get("/couch/users") { _, _ in couchUserList() }
        router.post("/couch/users") { request, _ in try await addCouchUser(request) }
        router.put("/couch/users/:name") { request, ctx in try await setCouchUser(request, name: try couchUserName(ctx)) }
        router.delete("/couch/users/:name") { _, ctx in try removeCouchUser(try couchUserName(ctx)) }
    }

    func couchUserName(_ ctx: BasicRequestContext) throws -> String {
        let raw = try ctx.parameters.require("name")
        return raw.removingPercentEncoding ?? raw
    }

    func couchUserList() -> Response {
        json(["users": .array(node.couchUsers.entries.map(\.json))])
    }

    /// `POST /couch/users`: `{"name", "password" | "passwordHash", "policy"?}`; a name in use is a 409.
    func addCouchUser(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        let user: CouchUser
        do { user = try CouchUserStore.parseUser(body, source: "request body") } catch { throw badBody(error) }
        try node.couchUsers.add(user)
        node.logger.info("CouchDB user added", metadata: ["user": "\(LogText.escape(user.name))"])
        return json(CouchUserStore.Entry(name: user.name, policy: user.policy, source: .api).json, status: .created)
    }

    /// `PUT /couch/users/{name}`: a new password and/or policy rules; what the body omits stays.
    func setCouchUser(_ request: Request, name: String) async throws -> Response {
        let body = try await readJSON(request)
        let change: CouchUserStore.Change
        do { change = try CouchUserStore.parseChange(body, source: "request body") } catch { throw badBody(error) }
        guard !change.isEmpty else {
            throw APIError(.badRequest, "bad_request", "nothing to change: give password, passwordHash or policy")
        }
        guard let entry = try node.couchUsers.update(name, change) else {
            throw APIError(.notFound, "not_found", "no CouchDB user \(LogText.escape(name)) (add one with POST /couch/users)")
        }
        node.logger.info(
            "CouchDB user changed", metadata: ["user": "\(LogText.escape(name))", "password": "\(change.password == nil ? "kept" : "changed")"])
        return json(entry.json)
    }

    func removeCouchUser(_ name: String) throws -> Response {
        guard try node.couchUsers.remove(name) else {
            throw APIError(.notFound, "not_found", "no CouchDB user \(LogText.escape(name))")
        }
        node.logger.info("CouchDB user removed", metadata: ["user": "\(LogText.escape(name))"])
        return json(["name": .string(name), "removed": true])
    }
}
