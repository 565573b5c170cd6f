import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging
import NIOSSL

/// Builds replicators whose other side is one CouchDB-protocol database: the entry point
/// for `ferry sync http(s)://…` and persistent replications with a CouchDB URL.
public final class CouchReplication: Sendable {
    public let endpoint: CouchEndpoint
    let http: CouchHTTP
    let logger: Logger

    /// A client for `endpoint` (for a pinned certificate, the certificate is fetched and
    /// checked against the pin first).
    public static func make(endpoint: CouchEndpoint, logger: Logger) async throws -> CouchReplication {
        let tls = try await CouchTLS.configuration(for: endpoint, logger: logger)
        return CouchReplication(endpoint: endpoint, http: CouchHTTP(endpoint: endpoint, tls: tls, logger: logger), logger: logger)
    }

    init(endpoint: CouchEndpoint, http: CouchHTTP, logger: Logger) {
        self.endpoint = endpoint
        self.http = http
        self.logger = logger
    }

    /// A replicator between `store` and the endpoint's database, shaped by `configuration`
    /// (direction, continuous, document IDs, filters, policy, resolvers, metrics).
    public func replicator(
        store: DocumentStore, configuration: ReplicatorConfiguration, clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger? = nil
    ) -> Replicator {
        let http = self.http, log = logger ?? self.logger
        return Replicator(
            store: store, remote: { try await CouchRemote.open(http: http, store: store, logger: log) }, configuration: configuration,
            clock: clock, logger: log)
    }

    /// Closes the client's connections; replicators made by it must have stopped.
    public func shutdown() async { await http.shutdown() }
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
