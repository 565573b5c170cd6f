import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import FerryDiscovery
import Foundation
import Logging
import ServiceLifecycle

/// Collects the admin API's bound port for readiness; a wait for it ends on cancellation,
/// so a node whose admin API never binds can still stop.
final class ReadinessBox: Sendable {
    private let port = Latch<Int>()
    private let unixSocket = Latch<Void>()

    func adminBound(_ port: Int) { self.port.set(port) }

    /// The admin port once bound; throws CancellationError if the task is cancelled first.
    func adminPort() async throws -> Int { try await port.wait() }

    func unixSocketBound() { unixSocket.set(()) }

    private let couch = Latch<Int>()
    private let couchLAN = Latch<Int>()

    func couchBound(_ port: Int) { couch.set(port) }
    func couchLANBound(_ port: Int) { couchLAN.set(port) }

    /// The CouchDB API's loopback port once bound.
    func couchPort() async throws -> Int { try await couch.wait() }

    /// The CouchDB API's LAN port once bound (only awaited when one is configured).
    func couchLANPort() async throws -> Int { try await couchLAN.wait() }

    /// Returns once the Unix socket listens (only awaited when one is configured).
    func unixSocketListening() async throws { try await unixSocket.wait() }
}

/// Writes node.json once the listener and the admin API are bound (and discovery, if on,
/// knows whether it works), and removes it on shutdown. Waiting for readiness ends on
/// shutdown or cancellation, so a node stops in every state.
struct ReadinessService: Service {
    let node: FerryNode
    let listener: WebSocketListener
    let readiness: ReadinessBox
    var discovery: (any PeerDiscovery)? = nil
    let onReady: @Sendable (FerryNode.Ready) -> Void

    func run() async throws {
        let ready: FerryNode.Ready
        do {
            ready = try await cancelWhenGracefulShutdown {
                let port = try await listener.waitUntilBound()
                let adminPort = try await readiness.adminPort()
                // A node is not ready while a configured socket may still fail to bind.
                if node.configuration.unixSocket != nil { try await readiness.unixSocketListening() }
                var ready = node.readyInfo(port: port, adminPort: adminPort)
                ready.couchPort = try await readiness.couchPort()
                ready.couchURL = "http://127.0.0.1:\(ready.couchPort)/"
                if let lan = node.configuration.couch.lan {
                    let lanPort = try await readiness.couchLANPort()
                    let host = lan.interface == "0.0.0.0" || lan.interface == "::" ? "127.0.0.1" : lan.interface
                    ready.couchLANURL = "https://\(host.contains(":") ? "[\(host)]" : host):\(lanPort)/"
                }
                if let discovery {
                    ready.discovery = await Self.firstAvailability(of: discovery, clock: node.clock)
                    try Task.checkCancellation()
                }
                return ready
            }
        } catch {
            // Stopped before ready, or a service failed to start: that service reports its
            // own error, and this one ends with the group.
            try? await gracefulShutdown()
            return
        }
        try node.writeNodeFile(ready)
        // A member that listens somewhere new tells the group (its peers dial it there).
        do { try node.membership.announceOwnAddresses() } catch {
            node.logger.warning("cannot record where this node listens", metadata: ["error": "\(error)"])
        }
        onReady(ready)
        try? await gracefulShutdown()
        node.removeNodeFile()
    }

    /// Discovery's first answer, or `unavailable` when it gives none within the limit.
    static func firstAvailability(of discovery: any PeerDiscovery, clock: any Clock<Duration>) async -> DiscoveryAvailability {
        let limit = FerryNode.discoveryAnswerLimit
        let silent = DiscoveryAvailability.unavailable(reason: "no answer within \(limit.components.seconds) s")
        return await withTaskGroup(of: DiscoveryAvailability?.self) { group in
            group.addTask { try? await discovery.firstAvailability() }
            group.addTask {
                try? await clock.sleep(for: limit)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first ?? silent
        }
    }
}
