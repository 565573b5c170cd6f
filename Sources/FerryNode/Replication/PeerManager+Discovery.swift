import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

// What DNS-SD reports: peers appearing and going, and trust on first use.
extension PeerManager {
    func handle(_ event: DiscoveryEvent) {
        switch event {
        case .appeared(let peer):
            guard peer.nodeID != nodeID else { return }
            let isNew = state.withLock { s -> Bool in
                let isNew = s.peers[peer.nodeID]?.discovered != true
                var p = s.peers[peer.nodeID] ?? PeerState(nodeID: peer.nodeID)
                // Fresh evidence only when it says something new: a re-appearance, or another address or port.
                if isNew || p.addresses.first != peer.addresses.first || p.port != peer.port { p.discoveredLearned = s.learn() }
                p.instance = peer.instance
                p.name = p.name ?? peer.nodeName
                p.addresses = peer.addresses
                p.port = peer.port
                p.discovered = true
                p.lastSeen = Date()
                s.peers[peer.nodeID] = p
                s.instances[peer.instance] = peer.nodeID
                return isNew
            }
            if isNew {
                logger.info(
                    "peer discovered",
                    metadata: [
                        "peer": "\(LogText.escape(peer.nodeID))", "instance": "\(LogText.escape(peer.instance))",
                        "addresses": "\(LogText.escape(peer.addresses.joined(separator: ",")))",
                        "trusted": "\(trust.isTrusted(peer.nodeID))",
                    ])
            }
            if configuration.trustMode == .tofu, !trust.isTrusted(peer.nodeID), !trust.hasTOFUEntry {
                do {
                    try trust.add(.init(nodeID: peer.nodeID, name: peer.nodeName, policy: .trusted, source: .tofu))
                    logger.notice(
                        "trust on first use: pinned the first peer seen in this group", metadata: ["peer": "\(LogText.escape(peer.nodeID))"])
                } catch {
                    logger.error("could not save the TOFU trust entry", metadata: ["error": "\(LogText.escape(describing: error))"])
                }
                trustChanged()
            }
            // Seen again (after a partition, say): dial now rather than at the end of a backoff wait.
            reconcile(peer.nodeID, redial: isNew)
        case .disappeared(let instance):
            let id = state.withLock { s -> String? in
                guard let id = s.instances.removeValue(forKey: instance) else { return nil }
                s.peers[id]?.discovered = false
                return id
            }
            if let id {
                logger.info("peer went away", metadata: ["peer": "\(LogText.escape(id))", "instance": "\(LogText.escape(instance))"])
                // Where DNS-SD saw it is now the last candidate (the peer may only be restarting,
                // there or elsewhere): its record or static URL, if any, is dialled first.
                reconcile(id)
            }
        case .unavailable(let reason):
            discoveryReport.withLock { $0 = .unavailable(reason: reason) }
        case .available:
            discoveryReport.withLock { $0 = .available }
        }
    }
}
