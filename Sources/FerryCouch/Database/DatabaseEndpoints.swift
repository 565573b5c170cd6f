import FerryCore
import FerryStore
import Hummingbird

// The database-level endpoints: `/`, `/_up`, `/_all_dbs`, `/{db}`, `_changes`, `_all_docs`,
// `_revs_diff`, `_local`, `_ensure_full_commit`, `_revs_limit`.
extension CouchDatabase {
    func welcome(_ request: Request, context: CouchRequestContext) async throws -> Response {
        CouchResponse.json(["couchdb": "Welcome", "version": "3.4.0", "vendor": .object(["name": "Ferry"])])
    }

    func up(_ request: Request, context: CouchRequestContext) async throws -> Response {
        CouchResponse.json(["status": "ok"])
    }

    func allDbs(_ request: Request, context: CouchRequestContext) async throws -> Response {
        _ = try context.requirePrincipal()
        return CouchResponse.json(.array([.string(name)]))
    }

    /// `GET|HEAD|PUT|DELETE /{db}`.
    func databaseEndpoint(_ request: Request, context: CouchRequestContext) async throws -> Response {
        throw CouchError(.notImplemented, "not_implemented", "not yet")
    }

    /// `/{db}/_changes`, `_all_docs`, `_revs_diff`, `_ensure_full_commit`, `_revs_limit`, …
    func databaseSpecial(_ name: String, _ request: Request, context: CouchRequestContext) async throws -> Response {
        throw CouchError(.notImplemented, "not_implemented", "not yet")
    }

    /// `GET|PUT|DELETE /{db}/_local/{id}`.
    func localDocument(_ request: Request, context: CouchRequestContext, id: String) async throws -> Response {
        throw CouchError(.notImplemented, "not_implemented", "not yet")
    }
}
