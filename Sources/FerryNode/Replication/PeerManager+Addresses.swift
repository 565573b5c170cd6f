import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

extension PeerManager {
    /// Takes the dial URLs of the group's active members (from their signed address records,
    /// else their entries). Every member is listed (offline while not connected), whichever
    /// dials; of two members only the lower node ID dials (as for discovered peers), so each
    /// pair has one link, while a static peer is dialled anyway. A member's URL that changed
    /// is the freshest evidence of where it listens: dialled before a static URL or an older
    /// DNS-SD answer, and the URL it replaced is tried last from then on (`dialCandidates`).
    /// With no avahi-daemon (or discovery off) members are thus still dialled. Members that
    /// left lose the URL, and are no longer listed unless known otherwise (static, DNS-SD).
    public func memberAddressesChanged(_ urls: [String: String]) {
        let (touched, gone) = state.withLock { s -> ([String], [ReplicationLink]) in
            var touched: [String] = []
            var gone: [ReplicationLink] = []
            for (id, p) in s.peers where p.memberURL != nil && urls[id] == nil {
                if p.staticURL == nil && p.instance == nil {
                    s.peers[id] = nil
                    if let link = p.link { gone.append(link) }
                } else {
                    s.peers[id]?.memberURL = nil
                    touched.append(id)
                }
            }
            for (id, url) in urls where id != nodeID {
                var p = s.peers[id] ?? PeerState(nodeID: id)
                guard p.memberURL != url else { continue }
                if let old = p.memberURL { p.superseded.insert(old) }
                p.superseded.remove(url)
                p.memberURL = url
                p.memberLearned = s.learn()
                s.peers[id] = p
                touched.append(id)
            }
            return (touched, gone)
        }
        for link in gone { link.stop() }
        for id in touched { reconcile(id) }
    }
}

extension PeerManager {
    /// Pushes this node's new address record (`document`) to each member that would not
    /// learn it otherwise: those with a lower node ID, which dial this node (at the address
    /// they knew, now stale) rather than being dialled. Each push is one-shot, retried with
    /// backoff for a few minutes; a member offline all that time gets the record from any
    /// other member later, as it gets every document.
    public func deliverAddressRecord(_ document: DocumentID, to urls: [String: String]) {
        for (peerID, url) in urls where !dials(peerID) && peerID != nodeID {
            let connector = dialler(url: url, peerID: peerID)
            let replicator = replicators.replicator(peerID: peerID, connector: connector, logger: logger.with("peer", peerID)) { rc in
                rc.continuous = false
                rc.direction = .push
                rc.documentIDs = [document]
                rc.maxAttempts = 20
                rc.maxAttemptWait = .seconds(15)
            }
            let started = state.withLock { !$0.stopping }
            guard started else { return }
            recordDeliveries.withLock { $0.append(replicator) }
            replicator.start()
            logger.info("telling a member where this node listens now", metadata: ["peer": "\(peerID)", "url": "\(url)"])
        }
    }
}
