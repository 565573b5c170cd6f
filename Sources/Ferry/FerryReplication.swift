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
    /// The replicator of the current run.
    private let state: Locked<Replicator>
    /// Makes a replicator for the target from a configuration: parsed and checked once, here.
    private let makeReplicator: @Sendable (ReplicatorConfiguration) -> Replicator
    /// The CouchDB client of a `.couchDB` target, made once and shared by every run.
    private let couch: CouchReplication?
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
        case .peer(let url, let pin, let identity):
            nodeID = identity.nodeID
            let connector = try WebSocketConnector(url: url, serverTrust: .pinned([pin.lowercased()]), identity: identity)
            couch = nil
            makeReplicator = { Replicator(store: store, connector: connector.connector, configuration: $0, logger: logger) }
        case .couchDB(let url, let credentials, let pin):
            nodeID = "app-\(store.uuid.prefix(12))"
            var endpoint = try CouchEndpoint.parse(url)
            if let credentials { endpoint.credentials = credentials }
            if let pin { endpoint.trust = .pinned(try CouchEndpoint.normalizedPin(pin)) }
            let client = CouchReplication(endpoint: endpoint, logger: logger)
            couch = client
            makeReplicator = { client.replicator(store: store, configuration: $0, logger: logger) }
        case .endpoint(let open):
            nodeID = "app-\(store.uuid.prefix(12))"
            couch = nil
            makeReplicator = { Replicator(store: store, connector: open, configuration: $0, logger: logger) }
        }
        state = Locked(makeReplicator(settings.configuration(nodeID: nodeID, resetCheckpoint: false)))
    }

    private var current: Replicator { state.withLock { $0 } }

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
        try state.withLock { replicator throws(SyncError) in
            guard replicator.status.activity == .stopped else {
                throw SyncError(.badRequest, message: "stop the replication before resetting its checkpoint", isTransient: false)
            }
            replicator = makeReplicator(settings.configuration(nodeID: nodeID, resetCheckpoint: true))
        }
    }

    /// Closes the CouchDB client's connections; call once the replication has stopped for good.
    public func shutdown() async {
        if let couch { await couch.shutdown() }
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
