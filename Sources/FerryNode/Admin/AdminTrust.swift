import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle

/// The admin API's trust routes (`/trust`): the trusted peers and their policies, listed,
/// added, changed and removed at run time.
extension AdminAPI {
    func trustList() -> Response {
        json(["trusted": .array(node.trust.entries.map(\.json))])
    }

    /// `POST /trust`: a new entry; an ID already trusted is a 409 (change it with PUT).
    func addTrust(_ request: Request) async throws -> Response {
        let body = try await readJSON(request)
        let t: NodeConfiguration.TrustEntry
        do { t = try ConfigReader(file: "request body").trustEntry(body, "") } catch { throw badBody(error) }
        let entry = TrustStore.Entry(nodeID: t.nodeID, name: t.name, policy: t.policy, source: .api)
        try node.trust.add(entry)
        manager.trustChanged()
        return json(entry.json, status: .created)
    }

    /// `PUT /trust/{id}`: changes an existing run-time entry; what the body omits stays as it is.
    func setTrust(_ request: Request, id: String) async throws -> Response {
        let body = try await readJSON(request)
        let change: TrustStore.Change
        do { change = try ConfigReader(file: "request body").trustChange(body, "", id: id.lowercased()) } catch { throw badBody(error) }
        guard let entry = try node.trust.update(id.lowercased(), change) else {
            throw APIError(.notFound, "not_found", "node \(id) is not in the trust store (add it with POST /trust)")
        }
        manager.trustChanged()
        return json(entry.json)
    }

    func badBody(_ error: ConfigError) -> APIError {
        APIError(.badRequest, "bad_request", error.reason.isEmpty ? error.description : "\(error.key.trimmingCharacters(in: CharacterSet(charactersIn: "."))) \(error.reason)")
    }

    func removeTrust(_ id: String) throws -> Response {
        guard try node.trust.remove(id.lowercased()) else {
            if node.trust.entry(id.lowercased())?.source == .group {
                throw APIError(.notFound, "not_found", "node \(id) is trusted as a member of this node's group: remove it with `ferry group remove` (DELETE /group/members/{id})")
            }
            throw APIError(.notFound, "not_found", "node \(id) is not in the trust store")
        }
        manager.trustChanged()
        return json(["id": .string(id.lowercased()), "removed": true])
    }
}
