import CoreMetrics
import FerrySync
import Prometheus

/// The node's own Prometheus registry, fed through swift-metrics by the replication layer
/// (counters) and sampled at scrape time (gauges). Per node, so several nodes in one
/// process never mix their figures. Every documented metric is exported from the start,
/// at zero, with its HELP text.
public final class NodeMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()
    let factory: DocumentedMetricsFactory
    /// The counters handed to replicators and the responder.
    public let sync: SyncMetrics
    /// How late the scheduler lag probe's wakes came (SchedulerLagProbe).
    public let schedulerLag: DurationHistogram

    /// Every metric docs/operations.md lists, with its HELP text.
    static let help: [String: String] = [
        "ferry_documents_pushed_total": "Revisions this node's replicators sent and peers accepted",
        "ferry_documents_pulled_total": "Revisions this node's replicators fetched and stored",
        "ferry_documents_received_total": "Revisions peers pushed here and this node stored",
        "ferry_documents_duplicate_total": "Revisions pulled that this node already had",
        "ferry_documents_rejected_total": "Revisions refused, by trust-boundary stage (reason) and direction",
        "ferry_conflicts_total": "Conflicts created by replication",
        "ferry_sync_unverifiable_revisions_total":
            "Revisions stored whose ID was made elsewhere, so no digest vouched for their body, by source",
        "ferry_deltas_total": "Revisions sent or received as deltas",
        "ferry_bytes_sent_total": "Replication message bytes sent, both roles",
        "ferry_bytes_received_total": "Replication message bytes received, both roles",
        "ferry_replication_errors_total": "Replication attempts that failed, by whether the error was transient",
        "ferry_connected_peers": "Peers with a live connection either way",
        "ferry_inbound_connections": "Live listener connections",
        "ferry_access_rules": "Group access rules in force (0: every member reads and writes everything)",
        "ferry_access_removed_documents": "Documents ever purged here because this node lost access to them (accessRemoved)",
        "ferry_store_size_bytes": "Database files and blobs on disk",
        "ferry_documents": "Live documents",
        "ferry_last_sequence": "The store's last sequence",
        "ferry_blobs_collected_total": "Unreferenced blobs the node deleted",
        "ferry_blobs_collected_bytes_total": "Bytes of unreferenced blobs the node deleted",
    ]

    /// The label sets each labelled counter is exported with from the start.
    static let labelSets: [String: [[(String, String)]]] = [
        "ferry_documents_rejected_total": ["structure", "digest", "policy", "filter", "validation"].flatMap { reason in
            ["pull", "push", "couch"].map { [("reason", reason), ("direction", $0)] }
        },
        "ferry_deltas_total": [[("direction", "sent")], [("direction", "received")]],
        "ferry_replication_errors_total": [[("transient", "true")], [("transient", "false")]],
        "ferry_sync_unverifiable_revisions_total": [[("source", "peer")], [("source", "couch")]],
    ]

    static let gauges: Set<String> = [
        "ferry_connected_peers", "ferry_inbound_connections", "ferry_store_size_bytes", "ferry_documents", "ferry_last_sequence",
        "ferry_access_rules", "ferry_access_removed_documents",
    ]

    public init() {
        factory = DocumentedMetricsFactory(registry: registry, help: Self.help)
        sync = SyncMetrics(factory: factory)
        schedulerLag = registry.makeDurationHistogram(
            descriptor: MetricNameDescriptor(
                metricName: "ferry_scheduler_lag", unitName: "seconds",
                helpText: "How late a task that asks to wake every 100 ms is woken: a blocked cooperative pool shows here"),
            buckets: SchedulerLagProbe.buckets)
        for name in Self.help.keys.sorted() {
            if Self.gauges.contains(name) {
                _ = factory.makeRecorder(label: name, dimensions: [], aggregate: false)
            } else {
                for labels in Self.labelSets[name] ?? [[]] { _ = factory.makeCounter(label: name, dimensions: labels) }
            }
        }
    }

    /// Records the scrape-time gauges, then renders the Prometheus text format.
    func render(
        connectedPeers: Int, inboundConnections: Int, storeBytes: Int64, documents: Int, lastSequence: UInt64, accessRules: Int = 0,
        accessRemoved: Int64 = 0
    ) -> String {
        Gauge(label: "ferry_access_rules", factory: factory).record(accessRules)
        Gauge(label: "ferry_access_removed_documents", factory: factory).record(accessRemoved)
        Gauge(label: "ferry_connected_peers", factory: factory).record(connectedPeers)
        Gauge(label: "ferry_inbound_connections", factory: factory).record(inboundConnections)
        Gauge(label: "ferry_store_size_bytes", factory: factory).record(storeBytes)
        Gauge(label: "ferry_documents", factory: factory).record(documents)
        Gauge(label: "ferry_last_sequence", factory: factory).record(Int64(lastSequence))
        return registry.emitToString()
    }
}

/// swift-prometheus's factory, but counters and gauges are registered with their HELP text
/// (the plain factory registers none, and a registry refuses one name with two texts).
struct DocumentedMetricsFactory: MetricsFactory {
    let registry: PrometheusCollectorRegistry
    let help: [String: String]
    let base: PrometheusMetricsFactory

    init(registry: PrometheusCollectorRegistry, help: [String: String]) {
        self.registry = registry
        self.help = help
        base = PrometheusMetricsFactory(registry: registry)
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        registry.makeCounter(name: label, labels: dimensions, help: help[label] ?? "")
    }

    func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler {
        registry.makeCounter(name: label, labels: dimensions, help: help[label] ?? "")
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        guard !aggregate else { return base.makeRecorder(label: label, dimensions: dimensions, aggregate: true) }
        return registry.makeGauge(name: label, labels: dimensions, help: help[label] ?? "")
    }

    func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
        registry.makeGauge(name: label, labels: dimensions, help: help[label] ?? "")
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        base.makeTimer(label: label, dimensions: dimensions)
    }

    func destroyCounter(_ handler: any CounterHandler) { base.destroyCounter(handler) }
    func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) { base.destroyFloatingPointCounter(handler) }
    func destroyRecorder(_ handler: any RecorderHandler) { base.destroyRecorder(handler) }
    func destroyMeter(_ handler: any MeterHandler) { base.destroyMeter(handler) }
    func destroyTimer(_ handler: any TimerHandler) { base.destroyTimer(handler) }
}
