import FerryCore
import FerryDiscovery
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

// Where and how a peer is dialled: candidate URLs in order, pinned dials, links.
extension PeerManager {
    /// Every URL to dial a peer at, best first; empty when this node should not dial it.
    ///
    /// Static URL, where DNS-SD sees the peer, and its signed address record (or entry):
    /// the one learned last comes first, since it is the freshest evidence of where the peer
    /// listens. Two exceptions: a URL the peer's newer record replaced comes last (a cached
    /// DNS-SD answer must not override the record), and so does where DNS-SD saw a peer that
    /// went away. A dial that fails tries the next (`dialler`). Every candidate is dialled
    /// pinned to the peer's ID: a record names only where its own signer listens.
    func dialCandidates(_ p: PeerState) -> [String] {
        guard trust.isTrusted(p.nodeID) else { return [] }
        // A static peer is dialled whatever the IDs; otherwise the lower ID dials.
        guard p.staticURL != nil || dials(p.nodeID) else { return [] }
        var found: [(url: String, rank: (Int, UInt64))] = []
        func add(_ url: String?, _ learned: UInt64) {
            guard let url else { return }
            found.append((url, (p.superseded.contains(url) ? 0 : 1, learned)))
        }
        add(p.staticURL, p.staticLearned)
        add(p.memberURL, p.memberLearned)
        if let address = p.addresses.first, let port = p.port {
            let scheme = configuration.insecure ? "ws" : "wss"
            add("\(scheme)://\(address):\(port)/\(configuration.group)/sync", p.discovered ? p.discoveredLearned : 0)
        }
        var out: [String] = []
        for c in found.sorted(by: { $0.rank > $1.rank }) where !out.contains(c.url) { out.append(c.url) }
        return out
    }

    /// The candidates to dial peer `id` at now (read at each dial, so a link in its retry
    /// wait tries what was learned meanwhile).
    func dialCandidates(_ id: String) -> [String] {
        guard let p = state.withLock({ $0.peers[id] }) else { return [] }
        return dialCandidates(p)
    }

    /// Dials `url` over TLS, accepting only `peerID`'s certificate. With `candidates`, each
    /// dial reads them anew and tries them in order until one connects (`url` when none).
    func dialler(url: String, peerID: String, candidates: (@Sendable () -> [String])? = nil) -> Replicator.Connector {
        let identity = self.identity, logger = self.logger
        return {
            let listed = candidates?() ?? []
            let urls = listed.isEmpty ? [url] : listed
            var failure: (any Error)?
            for (i, candidate) in urls.enumerated() {
                try Task.checkCancellation()
                do {
                    var c = try WebSocketConnector(url: candidate, serverTrust: .pinned([peerID]), identity: identity)
                    c.logger = logger
                    // A dial begun while the network was down must not outlive its healing by long.
                    c.connectTimeout = Self.dialTimeout
                    return try await c.connector()
                } catch {
                    failure = error
                    if i + 1 < urls.count {
                        logger.debug(
                            "dial failed; trying where else the peer may listen",
                            metadata: ["url": "\(LogText.escape(candidate))", "next": "\(LogText.escape(urls[i + 1]))"])
                    }
                }
            }
            throw failure ?? CancellationError()
        }
    }

    func makeLink(
        url: String, peerID: String, spec: ReplicationSpec?, resetCheckpoint: Bool = false, candidates: (@Sendable () -> [String])? = nil
    ) -> ReplicationLink {
        let policy = trust.policy(for: peerID)
        let connector = dialler(url: url, peerID: peerID, candidates: candidates)
        let replicator = replicators.replicator(peerID: peerID, connector: connector, logger: logger.with("peer", peerID)) { rc in
            rc.continuous = spec?.continuous ?? true
            rc.direction = spec?.direction ?? .pushAndPull
            rc.documentIDs = spec?.documentIDs.map { Set($0.compactMap { try? DocumentID($0) }) }
            // The replication's own policy, else the peer's, else the node's.
            if let policy = spec?.blobPolicy ?? self.configuration.blobPolicyByPeer[peerID] { rc.blobPolicy = policy }
            // A dead link must be back within seconds of the network healing; a failed dial
            // every 1.5 s (at most) to a peer that is gone costs nothing measurable.
            rc.maxAttemptWait = Self.maxRedialWait
            rc.resetCheckpoint = resetCheckpoint
        }
        return ReplicationLink(
            url: url, peerID: peerID, policy: policy, ownAccess: replicators.ownAccessStamp, replicator: replicator, clock: clock, logger: logger)
    }

    /// The longest wait between dials of a peer whose link is down.
    static let maxRedialWait: Duration = .milliseconds(1500)
    /// How long one dial (TCP, TLS, WebSocket upgrade) may take.
    static let dialTimeout: TimeAmount = .seconds(3)
}
