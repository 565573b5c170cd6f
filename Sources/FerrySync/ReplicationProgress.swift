import FerryCore
import FerryStore
import Foundation
import Logging

/// The single owner of a replicator's status, summary and document events: every change
/// goes through it, and each status is published in the order it was set.
final class ReplicationProgress: Sendable {
    private let statusState = Locked(ReplicatorStatus.initial)
    let statusBroadcaster = Broadcaster<ReplicatorStatus>()
    let eventBroadcaster = Broadcaster<DocumentEvent>()
    /// Totals of finished connections, and the connection up now (its traffic counts live).
    private let summaryState = Locked(SummaryState())
    let metrics: SyncMetrics?
    let logger: Logger
    let continuous: Bool

    init(metrics: SyncMetrics?, logger: Logger, continuous: Bool) {
        self.metrics = metrics
        self.logger = logger
        self.continuous = continuous
    }

    var status: ReplicatorStatus { statusState.withLock { $0 } }
    var summary: ReplicationSummary { summaryState.withLock { $0.current } }

    /// Changes the status; publishes it, under the same lock, when it differs.
    func update(_ change: (inout ReplicatorStatus) -> Void) {
        statusState.withLock { s in
            let old = s
            change(&s)
            // Sent under the lock so that two updates are published in the order they were made.
            if s != old { statusBroadcaster.send(s) }
        }
    }

    func setActivity(_ activity: ReplicatorStatus.Activity, error: SyncError? = nil) {
        update {
            $0.activity = activity
            if activity != .idle && activity != .busy || error != nil { $0.error = error }
        }
    }

    func markIdleIfCaughtUp() {
        update { if $0.completed >= $0.total && continuous { $0.activity = .idle } }
    }

    /// Updates the summary and reports the difference to the metrics.
    func count(_ change: (inout ReplicationSummary) -> Void) {
        let (old, new) = summaryState.withLock { s -> (ReplicationSummary, ReplicationSummary) in
            let old = s.totals
            change(&s.totals)
            return (old, s.totals)
        }
        guard let m = metrics else { return }
        m.pushed(new.pushed - old.pushed)
        m.pulled(new.pulled - old.pulled)
        m.conflicts(new.conflicts - old.conflicts)
        m.deltas(sent: new.deltasSent - old.deltasSent, received: new.deltasReceived - old.deltasReceived)
    }

    /// Makes `connection`'s traffic count live in the summary.
    func connected(_ connection: Connection) {
        summaryState.withLock {
            $0.live = connection.counters
            $0.baseline = .init()
        }
    }

    /// Makes the traffic a remote without a `Connection` counts (a CouchDB server's HTTP
    /// exchanges, whose client outlives one attempt) count live in the summary, from now on.
    func connected(traffic: Locked<Connection.Counters>) {
        let now = traffic.withLock { $0 }
        summaryState.withLock {
            $0.live = traffic
            $0.baseline = now
        }
    }

    /// Moves the live connection's traffic into the totals.
    func disconnected() {
        summaryState.withLock { s in
            guard let c = s.live?.withLock({ $0 }) else { return }
            s.totals.bytesSent += c.bytesSent - s.baseline.bytesSent
            s.totals.bytesReceived += c.bytesReceived - s.baseline.bytesReceived
            s.live = nil
        }
    }

    func moved(_ direction: DocumentEvent.Direction, id: String, rev: String, deleted: Bool) {
        eventBroadcaster.send(DocumentEvent(direction: direction, id: id, revision: rev, deleted: deleted, rejection: nil))
    }

    /// Counts, logs and reports a revision refused at a trust boundary (this side's or the peer's).
    func reject(_ direction: DocumentEvent.Direction, id: String, rev: String, deleted: Bool, _ rejection: Rejection) {
        count { $0.rejected += 1 }
        metrics?.rejected(stage: rejection.stage.rawValue, direction: direction.rawValue)
        logger.warning(
            "revision rejected",
            metadata: [
                "direction": "\(direction.rawValue)", "id": "\(LogText.escape(id))", "rev": "\(LogText.escape(rev))",
                "reason": "\(LogText.escape(rejection.description))",
            ])
        eventBroadcaster.send(DocumentEvent(direction: direction, id: id, revision: rev, deleted: deleted, rejection: rejection.description))
    }

    /// Reports documents purged here because this node may no longer read them.
    func accessRemoved(_ removals: [AccessRemoval]) {
        for r in removals {
            logger.info("access removed", metadata: ["id": "\(LogText.escape(r.id))", "reason": "\(r.reason)"])
            eventBroadcaster.send(DocumentEvent(direction: .pull, id: r.id, revision: "", deleted: false, rejection: nil, accessRemoved: true))
        }
    }

    func finish() {
        statusBroadcaster.finish()
        eventBroadcaster.finish()
    }
}

/// A replicator's totals, and the connection whose traffic is not in them yet.
struct SummaryState {
    var totals = ReplicationSummary()
    var live: Locked<Connection.Counters>?
    /// What `live` held when it was connected (zero for a `Connection`'s own counters).
    var baseline = Connection.Counters()

    var current: ReplicationSummary {
        guard let live else { return totals }
        var s = totals
        let c = live.withLock { $0 }
        s.bytesSent += c.bytesSent - baseline.bytesSent
        s.bytesReceived += c.bytesReceived - baseline.bytesReceived
        return s
    }
}

extension ReplicationSummary {
    /// The document counts only: what says an attempt got somewhere (traffic alone does not).
    var documentProgress: [Int] { [pushed, pulled, rejected, conflicts, resolved, blobsSent, blobsReceived] }
}
