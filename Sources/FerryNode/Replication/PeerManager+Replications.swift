import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

// Persistent replications (to peers and CouchDB servers): start, pause, resume, stop, list.
extension PeerManager {
    // MARK: persistent replications

    /// Starts a replication; `source` is `.config` or `.api`.
    func startReplication(_ spec: ReplicationSpec, source: PeerSource, resetCheckpoint: Bool = false) {
        let link =
            spec.peerID.map { makeLink(url: spec.url, peerID: $0, spec: spec, resetCheckpoint: resetCheckpoint) }
            ?? makeCouchLink(spec, resetCheckpoint: resetCheckpoint)
        let old = state.withLock { s -> ReplicationLink? in
            let old = s.replications[spec.id]?.link
            s.replications[spec.id] = (spec, source, link)
            s.paused.remove(spec.id)
            return old
        }
        old?.stop()
        link.start()
    }

    /// Stops a replication until it is resumed (not across a restart of the node); false if unknown.
    func pauseReplication(_ id: String) -> Bool {
        guard let link = state.withLock({ s -> ReplicationLink? in
            guard let entry = s.replications[id] else { return nil }
            s.paused.insert(id)
            return entry.link
        }) else { return false }
        link.stop()
        return true
    }

    /// Runs a (paused or running) replication again, from its checkpoint or, with
    /// `resetCheckpoint`, from the beginning; false if unknown.
    func resumeReplication(_ id: String, resetCheckpoint: Bool) -> Bool {
        guard let entry = state.withLock({ $0.replications[id] }) else { return false }
        startReplication(entry.spec, source: entry.source, resetCheckpoint: resetCheckpoint)
        return true
    }

    func isPaused(_ id: String) -> Bool { state.withLock { $0.paused.contains(id) } }

    /// Stops and forgets a replication; false if unknown.
    func stopReplication(_ id: String) -> Bool {
        guard let entry = state.withLock({ $0.replications.removeValue(forKey: id) }) else { return false }
        entry.link.stop()
        return true
    }

    /// Every replicator this node runs now: to peers and persistent replications.
    var activeReplicators: [Replicator] {
        state.withLock { s in
            s.peers.values.compactMap { $0.link?.replicator } + s.replications.values.map { $0.link.replicator }
        }
    }

    public var replications: [(spec: ReplicationSpec, source: PeerSource, status: ReplicatorStatus, summary: ReplicationSummary)] {
        state.withLock { s in
            s.replications.values.sorted { $0.spec.id < $1.spec.id }.map {
                ($0.spec, $0.source, $0.link.replicator.status, $0.link.replicator.summary)
            }
        }
    }
}
