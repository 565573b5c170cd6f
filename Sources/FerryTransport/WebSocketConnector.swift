import FerryCore
import FerryPinning
import FerrySync
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket

/// Dials a peer's listener at `wss://host:port/<db>/sync` (or `ws://` when insecure),
/// pinning the server's certificate inside the TLS handshake, and returns a message endpoint.
public struct WebSocketConnector: Sendable {
    public let host: String
    public let port: Int
    public let path: String
    public let secure: Bool
    /// The server node IDs accepted (`pinnedServerID`); `.acceptAnyPeer` is a logged opt-in.
    public var serverTrust: PeerTrust
    /// This node's identity, presented for mutual TLS.
    public var identity: NodeIdentity?
    /// HTTP Basic credentials for password-protected listeners.
    public var credentials: (user: String, password: String)?
    public var headers: [(String, String)] = []
    public var connectTimeout: TimeAmount = .seconds(10)
    /// Largest message accepted from the listener (`SyncProtocol.maxReplyMessageBytes`).
    public var maxMessageSize = SyncProtocol.maxReplyMessageBytes
    /// WebSocket ping interval while connected; keeps idle links inside listeners' idle timeouts.
    public var pingInterval: Duration? = .seconds(30)
    public var logger = Logger(label: "ferry.connector")

    /// Parses `wss://host:port/db/sync` (port defaults to 4985).
    public init(url: String, serverTrust: PeerTrust, identity: NodeIdentity?) throws(TransportError) {
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
            scheme == "wss" || scheme == "ws", let host = components.host, !host.isEmpty
        else { throw .badURL("\"\(url)\" is not a ws:// or wss:// URL with a host") }
        self.host = host
        port = components.port ?? 4985
        path = components.path.isEmpty ? "/ferry/sync" : components.path
        secure = scheme == "wss"
        self.serverTrust = serverTrust
        self.identity = identity
    }

    /// A Replicator connector that dials this URL for each attempt.
    public var connector: Replicator.Connector {
        let copy = self
        return { try await copy.connect() }
    }

    /// The result of the WebSocket upgrade attempt.
    enum Upgrade: Sendable {
        case websocket(NIOAsyncChannel<WebSocketFrame, WebSocketFrame>)
        /// The server answered without upgrading; the status arrives once the buffered
        /// response head is passed on (after this result is delivered).
        case refused(EventLoopFuture<HTTPResponseStatus>)
    }

    /// Opens one connection. Pin mismatches, 401/403/404 and bad URLs are permanent
    /// errors; refused or reset connections, timeouts and DNS failures are transient.
    public func connect() async throws -> any MessageEndpoint {
        let record = HandshakeRecord()
        let ssl: NIOSSLContext? = secure ? try TLSContexts.client(identity: identity) : nil
        let trust = serverTrust
        let logger = self.logger
        var head = HTTPHeaders()
        head.add(name: "Host", value: "\(host):\(port)")
        head.add(name: "Content-Length", value: "0")
        if let credentials {
            head.add(name: "Authorization", value: "Basic " + Data("\(credentials.user):\(credentials.password)".utf8).base64EncodedString())
        }
        for (k, v) in headers { head.add(name: k, value: v) }
        let requestHead = HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: head)
        let maxFrame = min(maxMessageSize, Int(UInt32.max))
        let limits = WebSocketMessageHandler.Limits(maxMessageSize: maxMessageSize)
        let hostname = host
        let upgrade: EventLoopFuture<Upgrade>
        do {
            upgrade = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(connectTimeout)
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        if let ssl {
                            let sni = PinnedTLS.serverName(hostname)
                            try channel.pipeline.syncOperations.addHandler(
                                try NIOSSLClientHandler(context: ssl, serverHostname: sni, customVerificationCallback: TLSContexts.verifier(trust: trust, record: record, logger: logger)))
                        }
                        let upgrader = NIOTypedWebSocketClientUpgrader<Upgrade>(
                            maxFrameSize: maxFrame,
                            upgradePipelineHandler: { channel, _ in
                                channel.eventLoop.makeCompletedFuture {
                                    try WebSocketMessageHandler.addHandlers(to: channel, isClient: true, limits: limits)
                                    return Upgrade.websocket(try NIOAsyncChannel(wrappingChannelSynchronously: channel))
                                }
                            })
                        let config = NIOTypedHTTPClientUpgradeConfiguration<Upgrade>(
                            upgradeRequestHead: requestHead, upgraders: [upgrader],
                            notUpgradingCompletionHandler: { channel in
                                channel.eventLoop.makeCompletedFuture {
                                    let promise = channel.eventLoop.makePromise(of: HTTPResponseStatus.self)
                                    try channel.pipeline.syncOperations.addHandler(StatusCatcher(promise: promise))
                                    return Upgrade.refused(promise.futureResult)
                                }
                            })
                        return try channel.pipeline.syncOperations.configureUpgradableHTTPClientPipeline(
                            configuration: .init(upgradeConfiguration: config))
                    }
                }
        } catch {
            throw classify(error, record: record)
        }
        // The handshake and upgrade must finish within the connect timeout too.
        let deadline = upgrade.eventLoop.scheduleTask(in: connectTimeout) {
            upgrade.whenSuccess { if case .websocket(let c) = $0 { c.channel.close(promise: nil) } }
        }
        let result: Upgrade
        do {
            result = try await withTimeout(upgrade, connectTimeout)
        } catch {
            throw classify(error, record: record)
        }
        deadline.cancel()
        switch result {
        case .websocket(let channel):
            return WebSocketEndpoint(channel, isClient: true, maximumMessageSize: maxMessageSize, logger: logger, pingInterval: pingInterval)
        case .refused(let statusFuture):
            let status: HTTPResponseStatus
            do { status = try await withTimeout(statusFuture, connectTimeout) } catch { throw classify(error, record: record) }
            switch status.code {
            case 401: throw TransportError.refused("the peer refused our credentials (401 Unauthorized)")
            case 403: throw TransportError.refused("the peer forbids this connection (403 Forbidden)")
            case 404: throw TransportError.refused("no database at \(path) on the peer (404 Not Found)")
            default: throw TransportError.refused("the peer refused the WebSocket upgrade (\(status.code))")
            }
        }
    }

    /// Waits for a future, failing with a transient timeout after `limit`.
    func withTimeout<T: Sendable>(_ future: EventLoopFuture<T>, _ limit: TimeAmount) async throws -> T {
        let promise = future.eventLoop.makePromise(of: T.self)
        future.cascade(to: promise)
        let timer = future.eventLoop.scheduleTask(in: limit) {
            promise.fail(TransportError.connectFailed("timed out after \(limit.nanoseconds / 1_000_000) ms connecting to \(host):\(port)"))
        }
        defer { timer.cancel() }
        return try await promise.futureResult.get()
    }

    func classify(_ error: any Error, record: HandshakeRecord) -> any Error {
        if let e = error as? TransportError, e.kind == .connectFailed, record.refusedID == nil { return e }
        if let refused = record.refusedID {
            return TransportError.untrustedPeer(
                "the server at \(host):\(port) presented certificate \(refused), which is not the pinned one")
        }
        if error is NIOSSLError || error is BoringSSLError {
            // A listener that does not trust our certificate aborts the handshake.
            let reason = TLSFailure.reason("\(error)", ownID: identity?.nodeID)
                ?? "the TLS handshake failed (is this node trusted there?)"
            return TransportError.notTrustedByPeer("\(host):\(port): \(reason)")
        }
        return TransportError.connectFailed("cannot connect to \(host):\(port): \(Self.connectFailureReason(error))")
    }

    /// Why a connection could not be made, in the user's terms: "connection refused",
    /// "timed out", "no route to host", "host not found", or the system's text for the errno.
    static func connectFailureReason(_ error: any Error) -> String {
        switch error {
        case let e as NIOConnectionError:
            // One failure per address tried: the first says it for all but the rarest cases.
            if let first = e.connectionErrors.first { return connectFailureReason(first.error) }
            return "host not found"
        case let e as IOError:
            switch e.errnoCode {
            case ECONNREFUSED: return "connection refused"
            case ETIMEDOUT: return "timed out"
            case EHOSTUNREACH, ENETUNREACH: return "no route to host"
            case ECONNRESET: return "connection reset by the peer"
            default: return String(cString: strerror(e.errnoCode))
            }
        case let e as ChannelError:
            switch e {
            case .connectTimeout: return "timed out"
            case .eof, .ioOnClosedChannel, .alreadyClosed: return "the connection was closed"
            default: return "\(e)"
            }
        case is SocketAddressError:
            return "host not found"
        default:
            return "\(error)"
        }
    }
}

/// Captures the HTTP status of a refused upgrade.
final class StatusCatcher: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPClientResponsePart
    let promise: EventLoopPromise<HTTPResponseStatus>
    init(promise: EventLoopPromise<HTTPResponseStatus>) { self.promise = promise }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let head) = unwrapInboundIn(data) {
            promise.succeed(head.status)
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise.fail(TransportError.connectFailed("the connection closed during the upgrade"))
    }
}
