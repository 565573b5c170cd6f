import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging
import NIOSSL
import Synchronization

/// Builds replicators whose other side is one CouchDB-protocol database: the entry point
/// for `ferry sync http(s)://…` and persistent replications with a CouchDB URL.
public final class CouchReplication: Sendable {
    public let endpoint: CouchEndpoint
    let logger: Logger
    /// The HTTP client, made at the first connection attempt (a pinned certificate is
    /// fetched and checked then, so a server that is down now is retried like any other).
    private let client = Mutex<CouchHTTP?>(nil)

    /// A client for `endpoint`; nothing is contacted until a replicator made by it runs.
    public init(endpoint: CouchEndpoint, logger: Logger) {
        self.endpoint = endpoint
        self.logger = logger
    }

    /// The HTTP client, made on first use.
    func http() async throws -> CouchHTTP {
        if let made = client.withLock({ $0 }) { return made }
        let tls = try await CouchTLS.configuration(for: endpoint, logger: logger)
        let made = CouchHTTP(endpoint: endpoint, tls: tls, logger: logger)
        let (winner, loser) = client.withLock { c -> (CouchHTTP, CouchHTTP?) in
            if let existing = c { return (existing, made) }
            c = made
            return (made, nil)
        }
        if let loser { await loser.shutdown() }
        return winner
    }

    /// A replicator between `store` and the endpoint's database, shaped by `configuration`
    /// (direction, continuous, document IDs, filters, policy, resolvers, metrics).
    public func replicator(
        store: DocumentStore, configuration: ReplicatorConfiguration, clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger? = nil
    ) -> Replicator {
        let log = logger ?? self.logger
        return Replicator(
            store: store, remote: { try await CouchRemote.open(http: try await self.http(), store: store, logger: log) },
            configuration: configuration, clock: clock, logger: log)
    }

    /// Closes the client's connections; replicators made by it must have stopped.
    public func shutdown() async {
        if let made = client.withLock({ c -> CouchHTTP? in defer { c = nil }; return c }) { await made.shutdown() }
    }
}

/// The TLS configuration an endpoint's trust calls for.
enum CouchTLS {
    /// nil for http; the system trust store, or exactly the pinned certificate, for https.
    static func configuration(for endpoint: CouchEndpoint, logger: Logger) async throws -> TLSConfiguration? {
        guard endpoint.scheme == "https" else { return nil }
        switch endpoint.trust {
        case .system: return TLSConfiguration.makeClientConfiguration()
        case .pinned:
            throw CouchClientError(code: "not_implemented", message: "pinned TLS", isTransient: false)
        }
    }
}
