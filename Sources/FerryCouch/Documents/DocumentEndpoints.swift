import FerryCore
import FerryStore
import Hummingbird

// The document endpoints: `/{db}/{id}`, `POST /{db}`, attachments, `_bulk_docs`, `_bulk_get`.
extension CouchDatabase {
    /// `GET|HEAD|PUT|DELETE /{db}/{id}` (and `_design/…`).
    func document(_ request: Request, context: CouchRequestContext, id: String) async throws -> Response {
        throw CouchError(.notImplemented, "not_implemented", "not yet")
    }

    /// `GET|HEAD|PUT|DELETE /{db}/{id}/{name}`.
    func attachment(_ request: Request, context: CouchRequestContext, docID: String, name: String) async throws -> Response {
        throw CouchError(.notImplemented, "not_implemented", "not yet")
    }

    /// `POST /{db}/_bulk_docs`.
    func bulkDocs(_ request: Request, context: CouchRequestContext) async throws -> Response {
        throw CouchError(.notImplemented, "not_implemented", "not yet")
    }

    /// `POST /{db}/_bulk_get`.
    func bulkGet(_ request: Request, context: CouchRequestContext) async throws -> Response {
        throw CouchError(.notImplemented, "not_implemented", "not yet")
    }
}
