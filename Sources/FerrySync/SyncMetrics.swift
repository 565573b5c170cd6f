import CoreMetrics
import FerryStore

/// Reports replication counters through swift-metrics; the node plugs in a Prometheus
/// factory, a library user any backend. Names are documented in docs/operations.md.
public struct SyncMetrics: Sendable {
    let factory: any MetricsFactory

    public init(factory: any MetricsFactory = MetricsSystem.factory) { self.factory = factory }

    func add(_ label: String, _ n: Int, _ dimensions: [(String, String)] = []) {
        guard n > 0 else { return }
        Counter(label: label, dimensions: dimensions, factory: factory).increment(by: n)
    }

    /// Revisions this node's replicators sent, and peers accepted.
    func pushed(_ n: Int) { add("ferry_documents_pushed_total", n) }
    /// Revisions this node's replicators fetched and stored.
    func pulled(_ n: Int) { add("ferry_documents_pulled_total", n) }
    /// Revisions fetched that this node already had (re-transferred, e.g. after a crash).
    func duplicates(_ n: Int) { add("ferry_documents_duplicate_total", n) }
    /// Revisions peers pushed into this node and it stored.
    public func received(_ n: Int) { add("ferry_documents_received_total", n) }
    /// Revisions refused at the trust boundary (or by the peer), by stage.
    public func rejected(stage: String, direction: String) {
        add("ferry_documents_rejected_total", 1, [("reason", stage), ("direction", direction)])
    }
    func conflicts(_ n: Int) { add("ferry_conflicts_total", n) }
    func deltas(sent: Int = 0, received: Int = 0) {
        add("ferry_deltas_total", sent, [("direction", "sent")])
        add("ferry_deltas_total", received, [("direction", "received")])
    }
    func bytes(sent: Int = 0, received: Int = 0) {
        add("ferry_bytes_sent_total", sent)
        add("ferry_bytes_received_total", received)
    }
    /// Revisions stored whose ID was made elsewhere (not Ferry's form), so that no digest
    /// vouched for their body: they rest on the sender's authentication, policy, filters and
    /// validation alone.
    public func unverifiable(_ n: Int, source: UnverifiableSource) {
        add("ferry_sync_unverifiable_revisions_total", n, [("source", source.rawValue)])
    }

    /// Counts the revisions of a batch from a Ferry peer that were stored with an ID made elsewhere.
    func unverifiable(stored revisions: [IncomingRevision], outcomes: [InsertOutcome]) {
        var n = 0
        for (rev, outcome) in zip(revisions, outcomes) where rev.isUnverifiable {
            if case .inserted = outcome { n += 1 }
        }
        unverifiable(n, source: .peer)
    }

    /// Where stored revisions that could not be digest-verified came from.
    public enum UnverifiableSource: String, Sendable {
        /// Replication with a Ferry peer, either way.
        case peer
        /// The CouchDB HTTP API.
        case couch
    }

    /// Links that found their peer's digest different from this node's while both were idle,
    /// and reconciled (anti-entropy).
    func reconciliation() { add("ferry_reconciliations_total", 1) }

    func replicationError(transient: Bool) {
        add("ferry_replication_errors_total", 1, [("transient", transient ? "true" : "false")])
    }
}
