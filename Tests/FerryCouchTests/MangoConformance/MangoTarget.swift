import FerryCore
import Foundation
import Logging
import NIOHTTP1
import Testing

@testable import FerryCouch
@testable import FerryCouchClient

/// One empty database that `_find` suites run against: a fresh database on the CouchDB server
/// named by `FERRY_COUCH_REFERENCE_URL` (`http://user:pass@host:port/db`; the database part
/// is replaced by a new name, dropped at the end), or else an in-process Ferry server's database.
struct MangoTarget: Sendable {
    let http: CouchHTTP
    /// Whether the server is the reference CouchDB rather than Ferry.
    let isReference: Bool
    let end: @Sendable () async -> Void

    static var quiet: Logger {
        var l = Logger(label: "ferry.test.mango")
        l.logLevel = .critical
        return l
    }

    /// A fresh, empty database; `label` becomes part of the reference database's name.
    static func start(_ label: String) async throws -> MangoTarget {
        guard let url = ProcessInfo.processInfo.environment["FERRY_COUCH_REFERENCE_URL"] else {
            let server = try await CouchTestServer.start()
            let http = server.adminHTTP()
            return MangoTarget(
                http: http, isReference: false,
                end: {
                    await http.shutdown()
                    await server.stop()
                })
        }
        var endpoint = try CouchEndpoint.parse(url)
        endpoint.database = "ferry_mango_\(label)_" + UUID().uuidString.lowercased().prefix(8)
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: quiet)
        _ = try await http.json(.PUT, http.databasePath(), query: [("q", "1")])
        return MangoTarget(
            http: http, isReference: true,
            end: {
                _ = try? await http.send(.DELETE, http.databasePath())
                await http.shutdown()
            })
    }

    /// POSTs a JSON text to `suffix` of the database (e.g. `_find`) and returns the status and
    /// the answer (`.null` when the answer is not JSON).
    func post(_ suffix: String, _ body: String) async throws -> (status: Int, json: JSON) {
        let response = try await http.send(.POST, http.databasePath(suffix), body: Array(body.utf8))
        return (response.status, response.json ?? .null)
    }

    /// Any request to `suffix` of the database, with an optional JSON text body.
    func call(_ method: HTTPMethod, _ suffix: String, _ body: String? = nil) async throws -> (status: Int, json: JSON) {
        let response = try await http.send(method, http.databasePath(suffix), body: body.map { Array($0.utf8) })
        return (response.status, response.json ?? .null)
    }

    /// Stores documents given as JSON texts through `_bulk_docs`; every one must be accepted.
    func seed(_ documents: [String]) async throws {
        for start in stride(from: 0, to: documents.count, by: 500) {
            let chunk = documents[start..<min(start + 500, documents.count)]
            let (status, answer) = try await post("_bulk_docs", #"{"docs": ["# + chunk.joined(separator: ",") + "]}")
            try #require(status == 201, "seeding answered \(status): \(answer)")
            for result in answer.mangoItems where result["error"] != nil {
                Issue.record("a seed document was refused: \(result)")
            }
        }
    }

    /// Creates an index from a `POST /_index` body; it must be created.
    func createIndex(_ body: String) async throws {
        let (status, answer) = try await post("_index", body)
        try #require(status == 200 && answer["result"] == "created", "POST _index \(body) answered \(status): \(answer)")
    }
}

extension JSON {
    /// The elements of an array (empty for anything else).
    var mangoItems: [JSON] {
        if case .array(let a) = self { return a }
        return []
    }

    /// The same value with integral doubles as integers (`1905.0` is `1905`), so that answers
    /// of servers that write numbers differently compare equal when CouchDB calls them equal.
    var mangoNormalised: JSON {
        switch self {
        case .double(let d) where d.rounded(.towardZero) == d && abs(d) < 9.2e18: return .int(Int64(d))
        case .array(let a): return .array(a.map(\.mangoNormalised))
        case .object(let o): return .object(o.mapValues(\.mangoNormalised))
        default: return self
        }
    }
}
