import FerryCore
import FerrySync
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
import ServiceLifecycle

// One file by design (hence its length): the accept path (bind, handshake, upgrade, refusal, serving),
// `stop` and `disconnect` all work on the listener's private connection table (`state`).

/// The passive side on the network: a TLS 1.3 WebSocket listener that authenticates each
/// peer inside the handshake (or by password), then serves replication on `/<db>/sync`.
public final class WebSocketListener: Service, Sendable {
    /// How the listener runs; every field has a documented default.
    public struct Configuration: Sendable {
        /// Interface to bind. Default all interfaces.
        public var host = "0.0.0.0"
        /// 0 picks an ephemeral port; `boundPort` reports it. Default 4985.
        public var port = 4985
        /// The database name in the URL path `/<databaseName>/sync`. Default "ferry".
        public var databaseName = "ferry"
        public var authentication = Authentication.mutualTLS(.pinned([]))
        /// Plaintext `ws://`, only for development (logged as a warning).
        public var insecure = false
        /// Authenticated connections served at once (counted after the upgrade). Default 64.
        public var maxConnections = 64
        /// TCP connections open at once, counted from accept (handshakes included); more are
        /// closed at once, before TLS. Default 128: `maxConnections` peers plus as many
        /// handshakes in flight. The node lowers it to fit the open-file limit.
        public var maxOpenConnections = 128
        /// TCP connections open at once from one remote address, counted from accept.
        /// Default 16: a peer needs one (one connection per pair) and a host running several
        /// nodes a few, while one address can hold no more than this of `maxOpenConnections`.
        public var maxConnectionsPerAddress = 16
        /// TLS and the WebSocket upgrade must be done within this, or the connection is
        /// closed. Default 10 s: a LAN handshake takes milliseconds, a loaded small board
        /// well under a second, and a client that never handshakes holds a slot only this long.
        public var handshakeTimeout: TimeAmount = .seconds(10)
        /// Largest replication message accepted (`SyncProtocol.defaultMaxMessageBytes`, 16 MiB;
        /// a node sets its `limits.maxMessageBytes`).
        public var maxMessageSize = SyncProtocol.defaultMaxMessageBytes
        /// A connection that sends nothing for this long is closed. Default 120 s.
        public var idleTimeout: TimeAmount = .seconds(120)
        /// The join exchange for new members (mutual TLS only). Default none.
        public var enrollment: Enrollment?
        /// Set to the bound port once the listener is bound (for whoever announces where it listens).
        public var boundPortLatch: Latch<Int>?
        public init() {}
    }

    /// The path of the join exchange (docs/protocol.md, "Joining a group").
    public static let joinPath = "/_ferry/join"

    /// Lets unknown peers through the TLS handshake while an invitation is open, to the
    /// join path only; every other request of theirs is refused with 403.
    public struct Enrollment: Sendable {
        /// Whether an invitation is open now (checked in each handshake).
        public var isOpen: @Sendable () -> Bool
        /// Serves one join connection (the peer's certificate ID, its address); the
        /// listener closes the connection when it returns.
        public var serve: @Sendable (any MessageEndpoint, String, String?) async -> Void
        public init(isOpen: @escaping @Sendable () -> Bool, serve: @escaping @Sendable (any MessageEndpoint, String, String?) async -> Void) {
            self.isOpen = isOpen
            self.serve = serve
        }
    }

    /// How a connecting peer proves who it is.
    public enum Authentication: Sendable {
        /// Mutual TLS: the client certificate's fingerprint must be trusted.
        case mutualTLS(PeerTrust)
        /// HTTP Basic credentials on the WebSocket upgrade (no client certificate needed),
        /// compared in constant time under `throttle` (a wrong guess counts per address and user).
        case password(user: String, password: String, throttle: LoginThrottle = LoginThrottle())
    }

    /// One live connection.
    public struct ConnectionInfo: Sendable, Equatable {
        public let id: Int
        /// The authenticated node ID, or nil with password authentication.
        public let peerID: String?
        public let remoteAddress: String
        public var active: Bool
    }

    let identity: NodeIdentity
    public let configuration: Configuration
    /// Serves one authenticated connection until it closes.
    let serveConnection: @Sendable (any MessageEndpoint, String?) async -> Void
    let logger: Logger
    /// Refusals already warned about: a client that keeps failing the handshake is one warning a minute.
    let refusals = RepeatedRefusals()
    /// Counts every accepted connection against the caps, from accept to close.
    public let gate: ListenerGate
    private let state = Locked(State())
    private let boundWaiters = Locked<(next: Int, waiting: [Int: CheckedContinuation<Int, any Error>])>((0, [:]))

    /// Bound port, live connections and lifecycle, behind the mutex.
    struct State {
        var boundPort: Int?
        var failure: (any Error)?
        var serverChannel: (any Channel)?
        var connections: [Int: ConnectionInfo] = [:]
        var endpoints: [Int: WebSocketEndpoint] = [:]
        var nextID = 1
        var stopping = false
    }

    /// The responder serving every connection, when the listener was made with one: its
    /// `sessions` list the connected peers with live counters.
    public let responder: ReplicationResponder?

    /// A listener that serves replication with `responder`.
    public convenience init(identity: NodeIdentity, configuration: Configuration, responder: ReplicationResponder, logger: Logger = Logger(label: "ferry.listener")) {
        self.init(identity: identity, configuration: configuration, logger: logger, responder: responder) { endpoint, peer in
            await responder.serve(endpoint, authenticatedPeer: peer)
        }
    }

    /// A listener that hands each authenticated connection to `serveConnection`
    /// (with the peer's node ID, or nil under password authentication).
    public init(
        identity: NodeIdentity, configuration: Configuration, logger: Logger = Logger(label: "ferry.listener"),
        responder: ReplicationResponder? = nil, serveConnection: @escaping @Sendable (any MessageEndpoint, String?) async -> Void
    ) {
        self.responder = responder
        self.identity = identity
        self.configuration = configuration
        self.serveConnection = serveConnection
        self.logger = logger
        gate = ListenerGate(
            name: "replication", limits: .init(total: configuration.maxOpenConnections, perAddress: configuration.maxConnectionsPerAddress),
            logger: logger)
        // A peer whose trust is revoked loses its live connections at once, not only its
        // next handshake.
        if case .mutualTLS(.dynamic(let trusted)) = configuration.authentication {
            trusted.onRevocation { [weak self] revoked in self?.disconnect(peers: revoked) }
        }
    }

    /// Closes every live connection authenticated as one of `peers`, with a permanent
    /// "forbidden" error; returns how many were closed.
    @discardableResult
    public func disconnect(peers: Set<String>) -> Int {
        let doomed = state.withLock { s in
            s.connections.values.filter { $0.peerID.map(peers.contains) ?? false }.compactMap { s.endpoints[$0.id] }
        }
        guard !doomed.isEmpty else { return 0 }
        logger.warning("closing the connections of peers no longer trusted", metadata: ["peers": "\(peers.sorted())", "connections": "\(doomed.count)"])
        let error = SyncError(.forbidden, message: "this node no longer trusts you", isTransient: false)
        // Unowned: closes a fixed list of endpoints; each close is bounded, and the caller must not wait for them.
        Task { for endpoint in doomed { await endpoint.close(error: error) } }
        return doomed.count
    }

    /// Closes every live peer connection with a transient error saying `why`, so that each
    /// peer connects again at once (its replicator redials) and both hellos state what holds
    /// now; returns how many were closed.
    @discardableResult
    public func closeForReconnect(_ why: String) -> Int {
        let open = state.withLock { s in s.connections.values.compactMap { s.endpoints[$0.id] } }
        guard !open.isEmpty else { return 0 }
        logger.info("closing peer connections so that they connect again", metadata: ["reason": "\(why)", "connections": "\(open.count)"])
        let error = SyncError(.disconnected, message: why, isTransient: true)
        // Unowned: closes a fixed list of endpoints; each close is bounded, and the caller must not wait for them.
        Task { for endpoint in open { await endpoint.close(error: error) } }
        return open.count
    }

    public var boundPort: Int? { state.withLock { $0.boundPort } }
    public var connections: [ConnectionInfo] { state.withLock { Array($0.connections.values).sorted { $0.id < $1.id } } }

    /// Waits until the listener is bound and returns the port (or the bind error); throws
    /// CancellationError if the task is cancelled first.
    public func waitUntilBound() async throws -> Int {
        let id = boundWaiters.withLock { w in
            defer { w.next += 1 }
            return w.next
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { c in
                // Registered under the waiters' lock, so `announce` cannot slip in between.
                let outcome = boundWaiters.withLock { w -> Result<Int, any Error>? in
                    let (port, failure) = state.withLock { ($0.boundPort, $0.failure) }
                    if let port { return .success(port) }
                    if let failure { return .failure(failure) }
                    if Task.isCancelled { return .failure(CancellationError()) }
                    w.waiting[id] = c
                    return nil
                }
                if let outcome { c.resume(with: outcome) }
            }
        } onCancel: {
            boundWaiters.withLock { $0.waiting.removeValue(forKey: id) }?.resume(throwing: CancellationError())
        }
    }

    private func announce(port: Int?, error: (any Error)?) {
        if let port { configuration.boundPortLatch?.set(port) }
        let waiters = boundWaiters.withLock { w -> [CheckedContinuation<Int, any Error>] in
            state.withLock {
                $0.boundPort = port
                $0.failure = error
            }
            defer { w.waiting.removeAll() }
            return Array(w.waiting.values)
        }
        for w in waiters {
            if let port { w.resume(returning: port) } else { w.resume(throwing: error ?? TransportError.refused("listener stopped")) }
        }
    }

    /// What an accepted TCP connection turned into.
    enum Upgrade: Sendable {
        case websocket(NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, HandshakeRecord)
        /// A connection to the join path.
        case join(NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, HandshakeRecord)
        case refused
    }

    /// Binds, serves until graceful shutdown or cancellation, then closes every connection.
    public func run() async throws {
        let sslContext: NIOSSLContext?
        if configuration.insecure {
            logger.warning("listener is running WITHOUT TLS (--insecure): development only")
            sslContext = nil
        } else {
            var requireCert = true
            if case .password = configuration.authentication { requireCert = false }
            sslContext = try TLSContexts.server(identity: identity, requireClientCertificate: requireCert)
        }
        if case .mutualTLS(.acceptAnyPeer) = configuration.authentication {
            logger.warning("listener accepts ANY peer certificate (acceptAnyPeer): development only")
        }
        let config = configuration
        let logger = self.logger
        let refusals = self.refusals
        let gate = self.gate
        let serverChannel: NIOAsyncChannel<EventLoopFuture<Upgrade>, Never>
        do {
            serverChannel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .serverChannelOption(.backlog, value: 256)
                .bind(host: config.host, port: config.port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        // Over the caps: closed before any TLS work (a failed initializer is dropped, no task made).
                        guard gate.admit(channel) else { throw ChannelError.inputClosed }
                        let upgrade = try Self.configure(channel: channel, ssl: sslContext, config: config, logger: logger, refusals: refusals)
                        gate.closeUnless(channel, finishes: upgrade, within: config.handshakeTimeout)
                        return upgrade
                    }
                }
        } catch {
            let e = TransportError.bindFailed("port \(config.port)", host: config.host, error: error)
            announce(port: nil, error: e)
            throw e
        }
        let port = serverChannel.channel.localAddress?.port ?? config.port
        state.withLock { $0.serverChannel = serverChannel.channel }
        announce(port: port, error: nil)
        logger.info("listening", metadata: ["port": "\(port)", "tls": "\(!config.insecure)"])
        try await withGracefulShutdownHandler {
            try await withThrowingDiscardingTaskGroup { group in
                try await serverChannel.executeThenClose { inbound in
                    for try await upgrade in inbound {
                        group.addTask { await self.handle(upgrade) }
                    }
                }
            }
        } onGracefulShutdown: {
            self.stop()
        }
        announce(port: nil, error: TransportError.refused("listener stopped"))
    }

    /// Stops accepting, closes the listening socket, and closes every live connection with
    /// a normal WebSocket close (peers see a transient disconnect and retry later).
    public func stop() {
        let (channel, endpoints) = state.withLock { s -> ((any Channel)?, [WebSocketEndpoint]) in
            s.stopping = true
            return (s.serverChannel, Array(s.endpoints.values))
        }
        channel?.close(promise: nil)
        // Unowned: closes the endpoints left at shutdown; each close is bounded.
        Task {
            for e in endpoints { await e.close(error: nil) }
        }
    }

    static func configure(
        channel: any Channel, ssl: NIOSSLContext?, config: Configuration, logger: Logger, refusals: RepeatedRefusals? = nil
    ) throws
        -> EventLoopFuture<Upgrade>
    {
        let record = HandshakeRecord(remote: channel.remoteAddress?.ipAddress)
        let sync = channel.pipeline.syncOperations
        try sync.addHandler(IdleStateHandler(readTimeout: config.idleTimeout))
        try sync.addHandler(IdleCloser(logger: logger))
        if let ssl {
            switch config.authentication {
            case .mutualTLS(let trust):
                try sync.addHandler(
                    NIOSSLServerHandler(
                        context: ssl,
                        customVerificationCallback: TLSContexts.verifier(
                            trust: trust, record: record, logger: logger, refusals: refusals, enrollmentOpen: config.enrollment?.isOpen)))
            case .password:
                try sync.addHandler(NIOSSLServerHandler(context: ssl))
            }
            try sync.addHandler(TLSErrorRecorder(record: record))
        }
        // The upgrade handler consumes the request head, so the refusal is decided here and
        // remembered for the responder that answers a refused request.
        let refusal = RefusalBox()
        let upgrader = NIOTypedWebSocketServerUpgrader<Upgrade>(
            maxFrameSize: min(config.maxMessageSize, Int(UInt32.max)),
            shouldUpgrade: { channel, head in
                let status = Self.refusal(for: head, config: config, enrollmentOnly: record.isEnrollmentOnly, remote: record.remote)
                refusal.set(status, uri: head.uri)
                return channel.eventLoop.makeSucceededFuture(status == nil ? HTTPHeaders() : nil)
            },
            upgradePipelineHandler: { channel, head in
                channel.eventLoop.makeCompletedFuture {
                    try WebSocketMessageHandler.addHandlers(to: channel, isClient: false, limits: .init(maxMessageSize: config.maxMessageSize))
                    let ws = try NIOAsyncChannel<WebSocketFrame, WebSocketFrame>(wrappingChannelSynchronously: channel)
                    if Self.path(of: head) == Self.joinPath { return Upgrade.join(ws, record) }
                    return Upgrade.websocket(ws, record)
                }
            })
        let upgradeConfig = NIOTypedHTTPServerUpgradeConfiguration<Upgrade>(
            upgraders: [upgrader],
            notUpgradingCompletionHandler: { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RefusalResponder(refusal: refusal, logger: logger))
                    return Upgrade.refused
                }
            })
        return try sync.configureUpgradableHTTPServerPipeline(configuration: .init(upgradeConfiguration: upgradeConfig))
            .flatMapErrorThrowing { error in throw RefusedHandshake(underlying: error, record: record) }
    }

    /// A connection that failed before the upgrade, with what its handshake recorded.
    struct RefusedHandshake: Error {
        let underlying: any Error
        let record: HandshakeRecord
    }

    /// Why a connection failed before the upgrade, in user terms.
    static func refusalReason(_ error: any Error) -> String {
        guard let refused = error as? RefusedHandshake else { return "\(error)" }
        if let id = refused.record.refusedID { return "the peer's certificate is not trusted (fingerprint \(id))" }
        if let tls = refused.record.tlsError, let reason = TLSFailure.reason(tls) { return reason }
        if let tls = refused.record.tlsError { return "the TLS handshake failed: \(tls)" }
        return "the connection closed before the WebSocket upgrade"
    }

    static func path(of head: HTTPRequestHead) -> String {
        head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
    }

    /// Why an upgrade request is refused: 404 for a wrong path (or the join path on a
    /// listener without enrollment), 403 for a peer admitted only to join that asks for
    /// anything else, 401 for missing or wrong credentials, 429 while the login throttle
    /// refuses `remote` or the user, 400 for anything that is not a WebSocket upgrade; nil to accept.
    static func refusal(
        for head: HTTPRequestHead, config: Configuration, enrollmentOnly: Bool = false, remote: String? = nil
    ) -> HTTPResponseStatus? {
        let path = Self.path(of: head)
        if path == joinPath {
            guard config.enrollment != nil, !config.insecure, case .mutualTLS = config.authentication else { return .notFound }
            guard head.headers.first(name: "Upgrade")?.lowercased() == "websocket" else { return .badRequest }
            return nil
        }
        if enrollmentOnly { return .forbidden }
        guard path == "/\(config.databaseName)/sync" else { return .notFound }
        if case .password(let user, let password, let throttle) = config.authentication {
            guard let presented = head.headers.first(name: "Authorization") else { return .unauthorized }
            // The attempt is reserved before the comparison, so parallel guesses past the limit are never evaluated.
            switch throttle.reserve(account: Self.basicUser(presented), address: remote ?? "unknown") {
            case .failure: return .tooManyRequests
            case .success(let attempt):
                let expected = "Basic " + Data("\(user):\(password)".utf8).base64EncodedString()
                let matches = LoginThrottle.constantTimeEquals(Array(presented.utf8), Array(expected.utf8))
                throttle.finish(attempt, succeeded: matches)
                guard matches else { return .unauthorized }
            }
        }
        guard head.headers.first(name: "Upgrade")?.lowercased() == "websocket" else { return .badRequest }
        return nil
    }

    /// The user name of a `Basic` header, for the throttle's per-user count ("" when unreadable).
    static func basicUser(_ header: String) -> String {
        guard header.count > 6, header.prefix(6).lowercased() == "basic ",
            let data = Data(base64Encoded: String(header.dropFirst(6)).trimmingCharacters(in: .whitespaces)),
            let text = String(data: data, encoding: .utf8), let colon = text.firstIndex(of: ":")
        else { return "" }
        return String(text[..<colon])
    }

    private func handle(_ upgrade: EventLoopFuture<Upgrade>) async {
        let result: Upgrade
        do {
            result = try await upgrade.get()
        } catch {
            // The upgrade fails with a closed channel; the cause is what the TLS handler saw.
            // A refused certificate is already logged by the verifier (once a minute per peer).
            let record = (error as? RefusedHandshake)?.record
            let reason = Self.refusalReason(error)
            let level: Logger.Level
            if record?.refusedID != nil {
                level = .debug
            } else if record?.tlsError != nil {
                level = refusals.isNews("\(record?.remote ?? "?") \(reason)") ? .warning : .debug
            } else {
                // Once a window per address: a flood of silent connections closed at the
                // handshake deadline is not a line each.
                level = refusals.isNews("\(record?.remote ?? "?") \(reason)") ? .info : .debug
            }
            logger.log(
                level: level, "connection refused during handshake",
                metadata: ["reason": "\(LogText.escape(reason))", "remote": "\(record?.remote ?? "?")"])
            return
        }
        if case .join(let channel, let record) = result {
            await serveJoin(channel, record: record)
            return
        }
        guard case .websocket(let channel, let record) = result else { return }
        let endpoint = WebSocketEndpoint(channel, isClient: false, maximumMessageSize: configuration.maxMessageSize, logger: logger)
        let (id, admitted) = state.withLock { s -> (Int, Bool) in
            let id = s.nextID
            s.nextID += 1
            guard s.connections.count < configuration.maxConnections, !s.stopping else { return (id, false) }
            s.connections[id] = ConnectionInfo(
                id: id, peerID: record.peerID, remoteAddress: channel.channel.remoteAddress?.description ?? "?", active: true)
            s.endpoints[id] = endpoint
            return (id, true)
        }
        guard admitted else {
            logger.warning("refusing connection: too many connections", metadata: ["max": "\(configuration.maxConnections)"])
            await endpoint.close(error: .init(.busy, message: "too many connections", isTransient: true))
            return
        }
        logger.info("peer connected", metadata: ["peer": "\(record.peerID ?? "password")"])
        await serveConnection(endpoint, record.peerID)
        await endpoint.close(error: nil)
        state.withLock {
            $0.connections.removeValue(forKey: id)
            $0.endpoints.removeValue(forKey: id)
        }
        logger.info("peer disconnected", metadata: ["peer": "\(record.peerID ?? "password")"])
    }
}

extension WebSocketListener {
    /// Hands a join connection to the enrollment handler, then closes it: such a connection
    /// never carries replication.
    func serveJoin(_ channel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, record: HandshakeRecord) async {
        let endpoint = WebSocketEndpoint(channel, isClient: false, maximumMessageSize: 1 << 20, logger: logger)
        guard let enrollment = configuration.enrollment, let peer = record.peerID else {
            await endpoint.close(error: .init(.notFound, message: "this listener takes no joins", isTransient: false))
            return
        }
        let (id, admitted) = state.withLock { s -> (Int, Bool) in
            let id = s.nextID
            s.nextID += 1
            guard s.connections.count < configuration.maxConnections, !s.stopping else { return (id, false) }
            s.connections[id] = ConnectionInfo(id: id, peerID: peer, remoteAddress: channel.channel.remoteAddress?.description ?? "?", active: true)
            s.endpoints[id] = endpoint
            return (id, true)
        }
        if admitted { await enrollment.serve(endpoint, peer, record.remote) }
        await endpoint.close(error: admitted ? nil : .init(.busy, message: "too many connections", isTransient: true))
        state.withLock {
            $0.connections.removeValue(forKey: id)
            $0.endpoints.removeValue(forKey: id)
        }
    }
}

/// The status chosen for a refused upgrade request (set when the request head is seen).
final class RefusalBox: Sendable {
    private let state = Locked<(HTTPResponseStatus?, String)>((nil, ""))
    func set(_ status: HTTPResponseStatus?, uri: String) { state.withLock { $0 = (status, uri) } }
    var value: (HTTPResponseStatus?, String) { state.withLock { $0 } }
}

/// Answers a refused upgrade request with its status (400 if it was no WebSocket
/// upgrade at all) and closes the connection.
final class RefusalResponder: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart
    let refusal: RefusalBox
    let logger: Logger

    init(refusal: RefusalBox, logger: Logger) {
        self.refusal = refusal
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let (decided, uri) = refusal.value
        let status = decided ?? .badRequest
        logger.info("refused an HTTP request", metadata: ["status": "\(status.code)", "uri": "\(LogText.escape(uri))"])
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "0")
        headers.add(name: "Connection", value: "close")
        if status == .unauthorized { headers.add(name: "WWW-Authenticate", value: "Basic realm=\"ferry\"") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in context.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}

/// Closes a connection the IdleStateHandler reports idle (slow or dead peers).
final class IdleCloser: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    let logger: Logger
    init(logger: Logger) { self.logger = logger }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            logger.info("closing an idle connection", metadata: ["peer": "\(context.remoteAddress?.description ?? "?")"])
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}
