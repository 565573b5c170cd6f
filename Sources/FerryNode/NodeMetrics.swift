import CoreMetrics
import FerrySync
import Prometheus

/// The node's own Prometheus registry, fed through swift-metrics by the replication layer
/// (counters) and sampled at scrape time (gauges). Per node, so several nodes in one
/// process never mix their figures.
public final class NodeMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()
    let factory: PrometheusMetricsFactory
    /// The counters handed to replicators and the responder.
    public let sync: SyncMetrics

    public init() {
        factory = PrometheusMetricsFactory(registry: registry)
        sync = SyncMetrics(factory: factory)
    }

    /// Records the scrape-time gauges, then renders the Prometheus text format.
    func render(connectedPeers: Int, inboundConnections: Int, storeBytes: Int64, documents: Int, lastSequence: UInt64) -> String {
        Gauge(label: "ferry_connected_peers", factory: factory).record(connectedPeers)
        Gauge(label: "ferry_inbound_connections", factory: factory).record(inboundConnections)
        Gauge(label: "ferry_store_size_bytes", factory: factory).record(storeBytes)
        Gauge(label: "ferry_documents", factory: factory).record(documents)
        Gauge(label: "ferry_last_sequence", factory: factory).record(Int64(lastSequence))
        return registry.emitToString()
    }
}
