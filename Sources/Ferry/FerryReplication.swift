import FerryCore
import FerryCouchClient
import FerryStore
import FerrySync
import FerryTransport
import Logging
import ServiceLifecycle

/// An app's replication between a document store and a target: start it, watch its status
/// and document events, stop it, and reset its checkpoint to go through everything again.
/// It is a swift-service-lifecycle `Service` too (`run()` ends on graceful shutdown).
public final class FerryReplication: Service, Sendable {
    public let store: DocumentStore
    public let target: ReplicationTarget
    public let settings: ReplicationSettings
    let logger: Logger
    /// The replicator of the current run, and the CouchDB client it uses (made once).
    private let state: Locked<(replicator: Replicator, couch: CouchReplication?)>
    private let nodeID: String

    /// A replication between `store` and `target`; nothing is contacted until it starts.
    /// A URL or pin that cannot work is refused here.
    public init(
        store: DocumentStore, target: ReplicationTarget, settings: ReplicationSettings = .init(),
        logger: Logger = Logger(label: "ferry.replication")
    ) throws {
        self.store = store
        self.target = target
        self.settings = settings
        self.logger = logger
        switch target {
        case .peer(_, _, let identity): nodeID = identity.nodeID
        case .couchDB, .endpoint: nodeID = "app-\(store.uuid.prefix(12))"
        }
        let couch: CouchReplication?
        if case .couchDB(let url, let credentials, let pin) = target {
            var endpoint = try CouchEndpoint.parse(url)
            if let credentials { endpoint.credentials = credentials }
            if let pin { endpoint.trust = .pinned(try CouchEndpoint.normalizedPin(pin)) }
            couch = CouchReplication(endpoint: endpoint, logger: logger)
        } else {
            couch = nil
        }
        let first = try Self.replicator(
            store: store, target: target, couch: couch, configuration: settings.configuration(nodeID: nodeID, resetCheckpoint: false),
            logger: logger)
        state = Locked((first, couch))
    }

    static func replicator(
        store: DocumentStore, target: ReplicationTarget, couch: CouchReplication?, configuration: ReplicatorConfiguration, logger: Logger
    ) throws -> Replicator {
        switch target {
        case .peer(let url, let pin, let identity):
            let connector = try WebSocketConnector(url: url, serverTrust: .pinned([pin.lowercased()]), identity: identity)
            return Replicator(store: store, connector: connector.connector, configuration: configuration, logger: logger)
        case .couchDB:
            return couch!.replicator(store: store, configuration: configuration, logger: logger)
        case .endpoint(let open):
            return Replicator(store: store, connector: open, configuration: configuration, logger: logger)
        }
    }

    private var current: Replicator { state.withLock { $0.replicator } }

    // MARK: Running

    /// Starts replicating in the background; `stop()` or, for a one-shot replication,
    /// catching up ends it.
    public func start() { current.start() }

    /// Stops replicating; what was stored stays stored and the next start resumes from the checkpoint.
    public func stop() { current.stop() }

    /// Returns once the replication has stopped.
    public func waitUntilStopped() async { await current.waitUntilStopped() }

    /// Runs the replication until it ends, or until graceful shutdown stops it.
    public func run() async throws {
        let replicator = current
        await withGracefulShutdownHandler {
            await replicator.run()
        } onGracefulShutdown: {
            replicator.stop()
        }
    }

    /// Forgets how far this replication got, so that its next start compares every
    /// document again (nothing is sent twice: the other side says what it has). Only while
    /// stopped: a running replication answers an error.
    public func resetCheckpoint() throws(SyncError) {
        try state.withLock { s throws(SyncError) in
            guard s.replicator.status.activity == .stopped else {
                throw SyncError(.badRequest, message: "stop the replication before resetting its checkpoint", isTransient: false)
            }
            do {
                s.replicator = try Self.replicator(
                    store: store, target: target, couch: s.couch,
                    configuration: settings.configuration(nodeID: nodeID, resetCheckpoint: true), logger: logger)
            } catch {
                throw SyncError.from(error)
            }
        }
    }

    /// Closes the CouchDB client's connections; call once the replication has stopped for good.
    public func shutdown() async {
        if let couch = state.withLock({ $0.couch }) { await couch.shutdown() }
    }

    // MARK: Observing

    /// Activity (connecting, busy, idle, stopped), progress and the last error.
    public var status: ReplicatorStatus { current.status }
    /// Every status change of the current run, from now on.
    public func statusChanges() -> AsyncStream<ReplicatorStatus> { current.statusChanges() }
    /// Each document pushed, pulled, refused or resolved by the current run, from now on.
    public func documentEvents() -> AsyncStream<DocumentEvent> { current.documentEvents() }
    /// Counts of what the current run moved.
    public var summary: ReplicationSummary { current.summary }
}
