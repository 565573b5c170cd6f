import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// The headless peer: a TLS WebSocket listener serving replication, continuous
/// push-and-pull replicators to its configured peers, and optionally a Unix-socket
/// listener, run as one ServiceGroup with graceful shutdown on SIGTERM/SIGINT.
public final class FerryNode: Sendable {
    /// A peer to replicate with: its listener URL and pinned node ID.
    public struct Peer: Sendable, Equatable {
        public let url: String
        public let nodeID: String

        /// Parses `wss://host:port/db/sync#<node ID>`.
        public init(parsing text: String) throws(NodeError) {
            guard let hash = text.lastIndex(of: "#") else {
                throw .badConfiguration("peer \"\(text)\" lacks its pinned node ID: use URL#NODEID")
            }
            let id = String(text[text.index(after: hash)...]).lowercased()
            guard id.count == 64, id.allSatisfy(\.isHexDigit) else {
                throw .badConfiguration("peer \"\(text)\": the node ID after # must be 64 hex digits (see `ferry id`)")
            }
            url = String(text[..<hash])
            nodeID = id
        }
    }

    /// How the node runs; every field has a documented default.
    public struct Options: Sendable {
        public var dataDirectory = "ferry-data"
        /// Interface to listen on. Default all interfaces.
        public var host = "0.0.0.0"
        /// Listener port; 0 picks an ephemeral one (reported in node.json). Default 4985.
        public var port = 4985
        public var databaseName = "ferry"
        public var peers: [Peer] = []
        /// Node IDs trusted to connect, beyond the configured peers.
        public var trusted: Set<String> = []
        /// Accept any client certificate (development only; logged).
        public var acceptAnyPeer = false
        /// HTTP Basic credentials instead of client certificates.
        public var password: (user: String, password: String)?
        public var readOnly = false
        /// Plaintext ws:// (development only; logged).
        public var insecure = false
        /// Also serve replication on this Unix domain socket.
        public var unixSocket: String?
        public var nodeName = ProcessInfo.processInfo.hostName
        public init() {}
    }

    public let options: Options
    public let store: DocumentStore
    public let identity: NodeIdentity
    let logger: Logger
    let lock: DataDirectoryLock

    /// Opens the data directory (lock, store, identity). Fails at once if another node
    /// holds the directory, or the identity is bad.
    public init(options: Options, logger: Logger = Logger(label: "ferry.node")) throws {
        self.options = options
        self.logger = logger
        try FileManager.default.createDirectory(atPath: options.dataDirectory, withIntermediateDirectories: true)
        lock = try DataDirectoryLock(directory: options.dataDirectory)
        store = try DocumentStore.open(directory: options.dataDirectory)
        identity = try NodeIdentity.loadOrCreate(directory: options.dataDirectory, name: options.nodeName)
    }

    var nodeFile: String { "\(options.dataDirectory)/node.json" }

    /// The responder serving every incoming connection.
    func makeResponder() -> ReplicationResponder {
        var r = ReplicationResponder.Options()
        r.nodeID = identity.nodeID
        r.readOnly = options.readOnly
        return ReplicationResponder(store: store, options: r, logger: logger)
    }

    /// Runs until SIGTERM/SIGINT (or cancellation); `onReady` gets the bound port.
    public func run(onReady: @escaping @Sendable (Int, String) -> Void = { _, _ in }) async throws {
        let responder = makeResponder()
        var config = WebSocketListener.Configuration()
        config.host = options.host
        config.port = options.port
        config.databaseName = options.databaseName
        config.insecure = options.insecure
        if let password = options.password {
            config.authentication = .password(user: password.user, password: password.password)
        } else if options.acceptAnyPeer {
            config.authentication = .mutualTLS(.acceptAnyPeer)
        } else {
            config.authentication = .mutualTLS(.pinned(options.trusted.union(options.peers.map(\.nodeID))))
        }
        let listener = WebSocketListener(identity: identity, configuration: config, responder: responder, logger: logger)
        var services: [any Service] = [listener]
        for peer in options.peers {
            var connector = try WebSocketConnector(url: peer.url, serverTrust: .pinned([peer.nodeID]), identity: identity)
            connector.logger = logger
            var rc = ReplicatorConfiguration()
            rc.continuous = true
            rc.nodeID = identity.nodeID
            rc.maxAttemptWait = .seconds(30)
            services.append(Replicator(store: store, connector: connector.connector, configuration: rc, logger: logger))
        }
        if let path = options.unixSocket {
            services.append(UnixSocketService(path: path, responder: responder))
        }
        services.append(ReadinessService(node: self, listener: listener, onReady: onReady))
        let group = ServiceGroup(
            configuration: .init(services: services.map { .init(service: $0) }, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
    }

    func writeNodeFile(port: Int) throws {
        let host = options.host == "0.0.0.0" || options.host == "::" ? "127.0.0.1" : options.host
        let scheme = options.insecure ? "ws" : "wss"
        var info: [String: JSON] = [
            "id": .string(identity.nodeID), "pid": .int(Int64(getpid())), "port": .int(Int64(port)),
            "url": .string("\(scheme)://\(host):\(port)/\(options.databaseName)/sync"),
            "database": .string(store.uuid),
        ]
        if let unix = options.unixSocket { info["unix"] = .string(unix) }
        let temp = nodeFile + ".tmp"
        try Data(JSON.object(info).canonicalBytes).write(to: URL(fileURLWithPath: temp))
        guard rename(temp, nodeFile) == 0 else { throw NodeError.badConfiguration("cannot write \(nodeFile)") }
    }

    func removeNodeFile() { try? FileManager.default.removeItem(atPath: nodeFile) }
}

/// Writes node.json once the listener is bound, and removes it on shutdown.
struct ReadinessService: Service {
    let node: FerryNode
    let listener: WebSocketListener
    let onReady: @Sendable (Int, String) -> Void

    func run() async throws {
        let port = try await listener.waitUntilBound()
        try node.writeNodeFile(port: port)
        onReady(port, node.identity.nodeID)
        try? await gracefulShutdown()
        node.removeNodeFile()
    }
}

/// Serves replication on a Unix domain socket until shutdown.
struct UnixSocketService: Service {
    let path: String
    let responder: ReplicationResponder

    func run() async throws {
        try await cancelWhenGracefulShutdown {
            try await ByteStreamTransport.serveUnix(path: path) { endpoint in
                await responder.serve(endpoint)
            }
        }
    }
}

/// Errors of node configuration and start-up.
public enum NodeError: FerryError, Equatable {
    case badConfiguration(String)
    case locked(String)

    public var domain: String { "node" }
    public var code: String {
        switch self {
        case .badConfiguration: return "bad_configuration"
        case .locked: return "locked"
        }
    }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .badConfiguration(let why): return why
        case .locked(let why): return why
        }
    }
}

/// An exclusive lock on a data directory (flock on DATA/serve.lock), held while a node runs.
final class DataDirectoryLock: Sendable {
    let fd: Int32

    init(directory: String) throws(NodeError) {
        let path = "\(directory)/serve.lock"
        fd = open(path, O_RDWR | O_CREAT, 0o644)
        guard fd >= 0 else { throw .locked("cannot open \(path): errno \(errno)") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            var buf = [UInt8](repeating: 0, count: 32)
            let n = pread(fd, &buf, 32, 0)
            let holder = n > 0 ? String(decoding: buf[..<n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) : "?"
            close(fd)
            throw .locked("another ferry serve (pid \(holder)) is already running on \(directory)")
        }
        ftruncate(fd, 0)
        let pid = Array("\(getpid())\n".utf8)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
    }

    deinit { close(fd) }
}
