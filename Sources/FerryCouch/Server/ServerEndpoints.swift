import Crypto
import FerryCore
import FerryCouchDocuments
import Hummingbird

// Server-level endpoints other than the database's: `_session` (as reached without the
// front door, which serves logins and logouts itself), `_uuids`, and the refusal of CouchDB
// server paths Ferry does not serve.
extension CouchDatabase {
    func serverEndpoint(_ endpoint: CouchRouting.Endpoint, _ request: Request, context: CouchRequestContext) async throws -> Response {
        switch endpoint {
        case .session:
            guard request.method == .get || request.method == .head else { throw CouchError.methodNotAllowed("GET,HEAD") }
            return CouchResponse.json(CouchFrontDoor.sessionInfo(context.principal, via: "default"))
        case .uuids:
            _ = try context.requirePrincipal()
            guard request.method == .get || request.method == .head else { throw CouchError.methodNotAllowed("GET,HEAD") }
            let count = try Self.uuidCount(request.uri.queryParameters.get("count"))
            let uuids = (0..<count).map { _ in JSON.string(Hex.encode(SymmetricKey(size: .bits128).withUnsafeBytes { Array($0) })) }
            return CouchResponse.json(["uuids": .array(uuids)])
        case .unknownServer(let name):
            _ = try context.requirePrincipal()
            throw CouchError.notFound("Ferry serves one database (\(self.name)); /\(name) is not served")
        default:
            throw CouchError.notFound("missing")
        }
    }

    /// `_uuids?count=N`: 1 by default, at most 1000 as CouchDB's default limit.
    static func uuidCount(_ text: String?) throws(CouchError) -> Int {
        guard let text else { return 1 }
        guard let n = Int(text), n >= 1 else { throw .badRequest("count must be a positive integer") }
        guard n <= 1000 else { throw CouchError(.forbidden, "forbidden", "count parameter too large") }
        return n
    }
}
