import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import Logging

/// Builds replicators whose other side is one CouchDB-protocol database: the entry point
/// for `ferry sync http(s)://…` and persistent replications with a CouchDB URL.
public final class CouchReplication: Sendable {
    public let endpoint: CouchEndpoint
    let logger: Logger
    /// The HTTP client, made at the first connection attempt (a pinned certificate is
    /// fetched and checked then, so a server that is down now is retried like any other).
    private let client = Locked<CouchHTTP?>(nil)

    /// A client for `endpoint`; nothing is contacted until a replicator made by it runs.
    public init(endpoint: CouchEndpoint, logger: Logger) {
        self.endpoint = endpoint
        self.logger = logger
    }

    /// Set by `abort()`: no client is made after it.
    private let aborted = Locked(false)

    /// Cancels every request in flight and refuses new ones, for a stop that must not wait
    /// on a transfer (what has been stored stays stored; a half-fetched attachment resumes
    /// on the next run).
    public func abort() {
        aborted.withLock { $0 = true }
        client.withLock { $0 }?.abort()
    }

    /// The HTTP client, made on first use.
    func http() async throws -> CouchHTTP {
        if aborted.withLock({ $0 }) { throw CouchClientError.stopped("connecting to \(endpoint.redacted)") }
        if let made = client.withLock({ $0 }) { return made }
        let tls = try await CouchTLS.configuration(for: endpoint, logger: logger)
        let made = CouchHTTP(endpoint: endpoint, tls: tls, logger: logger)
        let (winner, loser) = client.withLock { c -> (CouchHTTP, CouchHTTP?) in
            if let existing = c { return (existing, made) }
            c = made
            return (made, nil)
        }
        if let loser { await loser.shutdown() }
        if aborted.withLock({ $0 }) { winner.abort() }
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
