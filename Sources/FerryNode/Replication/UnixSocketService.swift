import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import FerryDiscovery
import Foundation
import Logging
import ServiceLifecycle

/// Serves replication on a Unix domain socket until shutdown.
struct UnixSocketService: Service {
    let path: String
    let responder: ReplicationResponder
    let readiness: ReadinessBox

    func run() async throws {
        do {
            try await cancelWhenGracefulShutdown {
                try await ByteStreamTransport.serveUnix(path: path, onBound: { readiness.unixSocketBound() }) { endpoint in
                    await responder.serve(endpoint)
                }
            }
        } catch is CancellationError where Task.isShuttingDownGracefully {
            // Stopped by the node's shutdown: a clean end, not a failure.
        }
    }
}
