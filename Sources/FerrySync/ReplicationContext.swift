import FerryCore
import FerryStore
import Foundation
import Logging

/// What the workers of one replicator share: the local store, the configuration, the
/// clock, the stop signal, the revisions the peer holds, and the one place that reports
/// progress (status, summary, document events, metrics).
final class ReplicationContext: Sendable {
    let store: DocumentStore
    let configuration: ReplicatorConfiguration
    let clock: any Clock<Duration>
    let logger: Logger
    let progress: ReplicationProgress
    /// Revisions pulled from or pushed to the current connection's peer: not pushed back.
    let peerHeld = PeerHeldRevisions()
    private let stopState = Locked(false)
    /// The directions whose checkpoint start has not yet reset (`resetCheckpoint`): a reset
    /// applies to the replication's first session, not to every reconnect after it.
    private let resetsPending: Locked<Set<CheckpointDirection>>
    private let stopSignal = Broadcaster<Void>()

    init(store: DocumentStore, configuration: ReplicatorConfiguration, clock: any Clock<Duration>, logger: Logger) {
        self.store = store
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        progress = ReplicationProgress(metrics: configuration.wiring.metrics, logger: logger, continuous: configuration.continuous)
        resetsPending = Locked(configuration.resetCheckpoint ? [.pull, .push] : [])
    }

    /// Whether this direction's next checkpoint start resets: true until one such start succeeded.
    func resetsCheckpoint(_ direction: CheckpointDirection) -> Bool { resetsPending.withLock { $0.contains(direction) } }

    /// Records that this direction's checkpoint start reset: later sessions resume from the new checkpoints.
    func checkpointWasReset(_ direction: CheckpointDirection) { _ = resetsPending.withLock { $0.remove(direction) } }

    var stopRequested: Bool { stopState.withLock { $0 } }

    func requestStop() {
        stopState.withLock { $0 = true }
        stopSignal.send(())
    }

    func clearStop() { stopState.withLock { $0 = false } }

    /// Whether a change need not be offered to `target`, which gets it over its own link to
    /// the peer this node got it from (`MeshRelay.relaySkip`): nil when it is to be offered,
    /// else the leaves the skip relies on.
    func relaySkip(_ id: DocumentID, leaves: [RevisionID], to target: String) -> [RevisionID]? {
        guard let mesh = configuration.wiring.mesh else { return nil }
        return mesh.relaySkip(of: id, leaves: leaves, to: target, peerHeld: peerHeld, rules: configuration.remotePolicy.groupRules?.version)
    }

    /// Remembers that `sender` sent this stored revision.
    func recordRelayed(_ id: DocumentID, _ rev: RevisionID, from sender: String) {
        configuration.wiring.mesh?.ledger.recordReceived(id, rev, from: sender)
    }

    /// Starts heartbeats on a connection whose hello showed both sides offer them.
    func startLiveness(on connection: Connection, remote: RemoteIdentity) {
        guard configuration.wiring.liveness.enabled, remote.heartbeat else { return }
        let both = remote.allowsPull && remote.allowsPush
        connection.startLiveness(
            LivenessPlan(
                settings: configuration.wiring.liveness, clock: clock, logger: logger, peerID: remote.peerID, mesh: configuration.wiring.mesh,
                localFull: both && configuration.replicatesEverything, rules: configuration.remotePolicy.groupRules?.version,
                localGrant: both && configuration.replicatesGroupGrant, digests: configuration.wiring.digests,
                view: LivenessPlan.view(
                    localGrant: both && configuration.replicatesGroupGrant, peerRead: configuration.remotePolicy.read, ownRead: configuration.ownRead())))
    }

    /// Runs `operation` until it returns (its value), `limit` passes on the clock, or a stop
    /// is requested (nil for both). The one race of work against a deadline or a stop.
    func race<T: Sendable>(
        timeout limit: Duration? = nil, stoppable: Bool = true, _ operation: @escaping @Sendable () async throws -> T
    ) async throws -> T? {
        // Subscribed before the check, so a stop between the two is not missed.
        let stop = stoppable ? stopSignal.subscribe() : nil
        if stoppable && stopRequested { return nil }
        return try await firstOf(operation, timeout: limit, clock: clock, stop: stop)
    }
}
