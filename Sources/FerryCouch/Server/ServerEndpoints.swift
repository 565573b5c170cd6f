import FerryCore
import Hummingbird

// Server-level endpoints other than the database's: `_session`, `_uuids`, and the refusal
// of CouchDB server paths Ferry does not serve.
extension CouchDatabase {
    func serverEndpoint(_ endpoint: CouchRouting.Endpoint, _ request: Request, context: CouchRequestContext) async throws -> Response {
        throw CouchError.notFound("Database does not exist.")
    }
}
