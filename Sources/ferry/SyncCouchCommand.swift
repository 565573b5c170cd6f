import FerryCore
import FerryCouch
import FerryCouchClient
import FerryNode
import FerryStore
import FerrySync
import Foundation
import Logging

extension Sync {
    /// `ferry sync http(s)://…/DATABASE`: one replication with a CouchDB-protocol database,
    /// built as a node builds its CouchDB replications.
    func runCouch(_ local: DocumentStore) async throws {
        let options = couchOptions
        let endpoint: CouchEndpoint
        do { endpoint = try options.endpoint(url: path!) } catch { throw CLIError(message: error.message) }
        var logger = Logger(label: "ferry.sync")
        if LogLevel.environment == nil { logger.logLevel = .critical }
        let trust = try TrustStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
        var replicators = ReplicationFactory(store: local, nodeID: local.uuid, trust: trust, configuration: NodeConfiguration(), logger: logger)
        replicators.resolvers = ResolverSet(fallback: NodeConfiguration.resolver(named: resolve)!)
        let couch = CouchReplication(endpoint: endpoint, logger: logger)
        let ids = try documentIDs()
        let replicator = try replicators.couchReplicator(couch, policy: nil, selector: options.selector, logger: logger) { config in
            config.direction = push ? .push : pull ? .pull : .pushAndPull
            config.continuous = continuous
            config.resetCheckpoint = resetCheckpoint
            config.documentIDs = ids
            if !continuous { config.maxAttempts = 3 }
        }
        do {
            // A stop cancels the HTTP requests in flight: a transfer, however slow or
            // stalled, never holds the exit up (an attachment half fetched resumes next time).
            try await drive(replicator, hint: Self.couchHint, onInterrupt: { couch.abort() })
        } catch {
            await couch.shutdown()
            throw error
        }
        await couch.shutdown()
    }

    /// What to do about a CouchDB failure, when its message does not say already.
    static func couchHint(_ error: SyncError) -> String? {
        guard let couch = error.cause as? CouchClientError else { return nil }
        switch couch.kind {
        case .unauthorized where !error.message.contains("check the user and password"):
            return "check the user and password"
        case .notFound where !error.message.contains("--create-target"), .databaseMissing where !error.message.contains("--create-target"):
            return "the database is missing: create it, or pass --create-target to create it when pushing"
        case .forbidden where !error.message.contains("may not"):
            return "the user may not do this: check its roles on the server"
        default:
            return nil
        }
    }
}
