import FerryCore
import FerryCouchDocuments
import Foundation
import HummingbirdCore
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOWebSocket

/// The CouchDB API's HTTP/1 connection, which may also become a Couchbase Lite replication
/// (`GET /{db}/_blipsync` upgraded to WebSocket): the front door decides the upgrade with the
/// same rules as any request (Host, origin, credentials); a request it refuses is served as
/// HTTP, so the client reads the usual CouchDB error (401, 403, 400) rather than a bare close.
///
/// Hand-built on NIO's typed upgrader rather than Hummingbird's WebSocket channel: that one
/// answers a refused upgrade with an empty 400 and no way to say why.
public struct CouchHTTPChannel: ServerChildChannel, HTTPChannelHandler {
    /// What a connection became.
    public enum Negotiated: Sendable {
        case http(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>)
        case mobile(NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, MobileAdmission)
    }

    public struct Value: ServerChildChannelValue {
        let negotiated: EventLoopFuture<Negotiated>
        public let channel: any Channel
    }

    public let responder: HTTPChannelHandler.Responder
    let configuration: HTTP1Channel.Configuration
    /// Decides an upgrade request: the admission, or nil to serve the request as HTTP.
    let admit: @Sendable (HTTPRequestHead, _ remoteAddress: SocketAddress?) async -> MobileAdmission?
    /// Runs an upgraded connection to its end.
    let serve: @Sendable (NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, MobileAdmission, Logger) async -> Void
    /// Loopback listeners honour an absolute-form target's authority (see `RequestTargetHandler`).
    let honourTargetAuthority: Bool
    let secure: Bool

    public init(
        responder: @escaping HTTPChannelHandler.Responder, configuration: HTTP1Channel.Configuration, secure: Bool,
        honourTargetAuthority: Bool,
        admit: @escaping @Sendable (HTTPRequestHead, SocketAddress?) async -> MobileAdmission?,
        serve: @escaping @Sendable (NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, MobileAdmission, Logger) async -> Void
    ) {
        self.responder = responder
        self.configuration = configuration
        self.secure = secure
        self.honourTargetAuthority = honourTargetAuthority
        self.admit = admit
        self.serve = serve
    }

    /// Couchbase Lite sends frames of up to 16 KiB of data plus headers; a WebSocket frame past
    /// this closes the connection.
    static let maxWebSocketFrame = 1 << 20

    public func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        channel.eventLoop.makeCompletedFuture {
            let admitted = NIOLockedValueBox<MobileAdmission?>(nil)
            // A graceful stop's quiesce event that came before HTTP was chosen reaches no HTTP
            // handler: it is remembered, and handed on once the first request is in progress.
            let quiesced = NIOLockedValueBox(false)
            try channel.pipeline.syncOperations.addHandler(QuiesceLatch(quiesced: quiesced), position: .first)
            // NIO's upgrader consumes the head of a request it tries to upgrade: a refused one is
            // replayed to the HTTP pipeline, so the front door answers it.
            let attempted = NIOLockedValueBox<HTTPRequestHead?>(nil)
            let admit = self.admit
            let upgrader = NIOTypedWebSocketServerUpgrader<Negotiated>(
                maxFrameSize: Self.maxWebSocketFrame,
                shouldUpgrade: { channel, head in
                    attempted.withLockedValue { $0 = head }
                    let promise = channel.eventLoop.makePromise(of: HTTPHeaders?.self)
                    let address = channel.remoteAddress
                    promise.completeWithTask {
                        guard let admission = await admit(head, address) else { return nil }
                        admitted.withLockedValue { $0 = admission }
                        return HTTPHeaders([("Sec-WebSocket-Protocol", admission.subprotocol)])
                    }
                    return promise.futureResult
                },
                upgradePipelineHandler: { channel, _ in
                    channel.eventLoop.makeCompletedFuture {
                        if let target = try? channel.pipeline.syncOperations.handler(type: RequestTargetHandler.self) {
                            _ = channel.pipeline.syncOperations.removeHandler(target)
                        }
                        let ws = try NIOAsyncChannel<WebSocketFrame, WebSocketFrame>(
                            wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
                        guard let admission = admitted.withLockedValue({ $0 }) else { throw ChannelError.inputClosed }
                        return .mobile(ws, admission)
                    }
                })
            let upgrade = NIOTypedHTTPServerUpgradeConfiguration<Negotiated>(
                upgraders: [upgrader],
                notUpgradingCompletionHandler: { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let sync = channel.pipeline.syncOperations
                        var replay: ReplayedHeadHandler?
                        if let head = attempted.withLockedValue({ $0 }) {
                            replay = ReplayedHeadHandler(head: head)
                            try sync.addHandler(replay!)
                        }
                        try sync.addHandler(HTTP1ToHTTPServerCodec(secure: secure))
                        try sync.addHandlers(configuration.additionalChannelHandlers())
                        try sync.addHandler(QuiesceAfterFirstHead(quiesced: quiesced))
                        try sync.addHandler(HTTPConnectionStateHandler(idleTimeout: configuration.idleTimeout.map { .init($0) }, logger: logger))
                        let http = try NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>(
                            wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
                        if let replay {
                            // Once the pipeline is whole (this runs inside its set-up).
                            channel.eventLoop.assumeIsolated().execute { replay.replay() }
                        }
                        return .http(http)
                    }
                })
            var pipeline = NIOUpgradableHTTPServerPipelineConfiguration<Negotiated>(upgradeConfiguration: upgrade)
            pipeline.enablePipelining = false  // the async channel serves one request at a time
            pipeline.enableErrorHandling = false  // Hummingbird answers malformed requests
            pipeline.enableResponseHeaderValidation = false
            pipeline.decoderConfiguration.maxHeaderFieldSize = configuration.httpDecoder.maxHeaderFieldSize
            pipeline.decoderConfiguration.maxHeaderListSize = configuration.httpDecoder.maxHeaderListSize
            pipeline.decoderConfiguration.maxHeaderFieldCount = configuration.httpDecoder.maxHeaderFieldCount
            let negotiated = try channel.pipeline.syncOperations.configureUpgradableHTTPServerPipeline(configuration: pipeline)
            let decoder = try channel.pipeline.syncOperations.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
            if honourTargetAuthority {
                try channel.pipeline.syncOperations.addHandler(RequestTargetHandler(), position: .after(decoder))
            }
            // Until the first request's head is whole, nothing else times the connection out or
            // closes it on a graceful stop (Hummingbird's connection handler joins only once HTTP
            // is chosen): a connection that sends nothing, or trickles its headers, is closed at
            // the idle deadline, or at once when the listener stops.
            try channel.pipeline.syncOperations.addHandler(
                BeforeFirstRequest(timeout: configuration.idleTimeout), position: .after(decoder))
            return Value(negotiated: negotiated, channel: channel)
        }
    }

    public func handle(value: Value, logger: Logger) async {
        do {
            switch try await value.negotiated.get() {
            case .http(let http): await handleHTTP(asyncChannel: http, logger: logger)
            case .mobile(let ws, let admission): await serve(ws, admission, logger)
            }
        } catch {
            logger.debug("connection ended before its first request", metadata: ["error": "\(error)"])
        }
    }
}

/// An admitted Couchbase Lite replication: who it is, which subprotocol was agreed.
public struct MobileAdmission: Sendable, Equatable {
    public let principal: CouchPrincipal
    /// `BLIP_3+CBMobile_3` or `BLIP_3+CBMobile_2`.
    public let subprotocol: String
    public let remoteAddress: String?

    /// What Couchbase Lite 3 offers, best first: the replication protocol's major versions 3 and 2.
    public static let subprotocols = ["BLIP_3+CBMobile_3", "BLIP_3+CBMobile_2"]

    /// The best subprotocol among those a client offers (`Sec-WebSocket-Protocol`, comma-separated
    /// in one or more headers), or nil when it offers none of them.
    public static func subprotocol(offered headers: [String]) -> String? {
        let offered = Set(headers.flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } })
        return subprotocols.first(where: offered.contains)
    }
}

extension CouchFrontDoor {
    /// Decides a WebSocket upgrade request: a `GET /{db}/_blipsync` of this database, from no
    /// web page (a page may not drive a replication with a user's cookie), addressed as this
    /// listener requires, offering a Couchbase Lite subprotocol, with valid credentials. Nil
    /// refuses: the request is then served as HTTP, which answers why.
    public func admitMobile(_ head: HTTPRequestHead, remoteAddress: String?, connection: String? = nil) async -> MobileAdmission? {
        guard head.method == .GET, head.uri.hasPrefix("/") else { return nil }
        let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
        guard case .databaseSpecial(let db, "blipsync")? = CouchRouting.endpoint(rawPath: path), db == database.name else { return nil }
        guard head.headers["Origin"].isEmpty else { return nil }
        if listener == .loopback {
            let hosts = head.headers["Host"]
            guard !hosts.isEmpty, hosts.allSatisfy(HTTPRequestRules.isLoopbackAuthority), Set(hosts.map { $0.lowercased() }).count == 1 else {
                return nil
            }
        }
        guard let subprotocol = MobileAdmission.subprotocol(offered: head.headers["Sec-WebSocket-Protocol"]) else { return nil }
        let now = access.now()
        let address = remoteAddress ?? "unknown"
        var principal: CouchPrincipal?
        if let authorization = head.headers["Authorization"].first {
            do {
                principal = try await authenticate(authorization, address: address, now: now)
            } catch {
                if let connection { access.upgradeRefusals.remember(error, connection: connection, authorization: authorization) }
                return nil
            }
        } else {
            let cookies = head.headers["Cookie"]
            let cookie = CouchSessionCookies.cookie(in: cookies)
                ?? CouchSessionCookies.cookie(in: cookies, named: CouchSessionCookies.syncGatewayCookieName)
            if let cookie, let found = session(cookie, now: now) { principal = found.0 }
        }
        guard let principal else { return nil }
        return MobileAdmission(principal: principal, subprotocol: subprotocol, remoteAddress: remoteAddress)
    }

    /// `admitMobile` for a connection from `address` (its IP and port name the connection).
    public func admitMobile(_ head: HTTPRequestHead, from address: SocketAddress?) async -> MobileAdmission? {
        await admitMobile(head, remoteAddress: address?.ipAddress, connection: address?.description)
    }

    /// Serves an admitted Couchbase Lite replication to its end.
    public func serveMobile(_ ws: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, admission: MobileAdmission, logger: Logger) async {
        await MobileSession(database: database, admission: admission, users: access.users, logger: database.logger).run(ws)
    }
}

/// The credential failures of refused upgrades, each kept until the HTTP answer of the same
/// request on the same connection takes it: one wrong password is one failed login for the
/// throttle, though the front door sees the request twice.
final class UpgradeRefusals: Sendable {
    private let refusals = Locked<[String: CouchError]>([:])
    /// A connection that closes before its answer leaves its entry: the table is emptied past this.
    static let capacity = 1024

    func remember(_ error: CouchError, connection: String, authorization: String) {
        refusals.withLock {
            if $0.count >= Self.capacity { $0.removeAll() }
            $0[connection + "\u{0}" + authorization] = error
        }
    }

    func take(connection: String, authorization: String) -> CouchError? {
        refusals.withLock { $0.removeValue(forKey: connection + "\u{0}" + authorization) }
    }
}

/// Serves again a request whose upgrade was refused: NIO's upgrader consumed its head and
/// its end (an upgrade request has no body), so this handler sends both on, and drops the
/// original end should the upgrader pass it on too.
final class ReplayedHeadHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    private var head: HTTPRequestHead?
    private var context: ChannelHandlerContext?
    /// Until the next request begins, an `end` is the refused request's own.
    private var dropEnd = true

    init(head: HTTPRequestHead) { self.head = head }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func replay() {
        guard let context, let head else { return }
        self.head = nil
        context.fireChannelRead(wrapInboundOut(.head(head)))
        context.fireChannelRead(wrapInboundOut(.end(nil)))
        context.fireChannelReadComplete()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .end where dropEnd:
            dropEnd = false
            return
        case .head:
            dropEnd = false
        default:
            break
        }
        context.fireChannelRead(data)
    }
}

/// Closes a connection whose first request head is not whole within `timeout`, or that is
/// told to quiesce (a graceful stop) before it began one; then steps aside once the head is
/// whole (what follows is timed and quiesced by the HTTP pipeline, or is a WebSocket).
final class BeforeFirstRequest: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    private let timeout: TimeAmount?
    private var deadline: Scheduled<Void>?

    init(timeout: TimeAmount?) { self.timeout = timeout }

    func handlerAdded(context: ChannelHandlerContext) {
        guard let timeout else { return }
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        deadline = context.eventLoop.scheduleTask(in: timeout) { loopBound.value.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let isHead: Bool
        if case .head = unwrapInboundIn(data) { isHead = true } else { isHead = false }
        context.fireChannelRead(data)
        if isHead {
            deadline?.cancel()
            deadline = nil
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}

/// Remembers that the connection was told to quiesce, whatever its pipeline is at the time.
final class QuiesceLatch: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    private let quiesced: NIOLockedValueBox<Bool>

    init(quiesced: NIOLockedValueBox<Bool>) { self.quiesced = quiesced }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent { quiesced.withLockedValue { $0 = true } }
        context.fireUserInboundEventTriggered(event)
    }
}

/// Hands a quiesce event that came before HTTP was chosen to the HTTP connection handler once
/// the first request is in progress there (so that request is answered, then the connection
/// closes), and holds back one that comes before that head for the same reason.
final class QuiesceAfterFirstHead: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    private let quiesced: NIOLockedValueBox<Bool>
    private var heldBack = false

    init(quiesced: NIOLockedValueBox<Bool>) { self.quiesced = quiesced }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let isHead: Bool
        if case .head = unwrapInboundIn(data) { isHead = true } else { isHead = false }
        context.fireChannelRead(data)
        if isHead {
            if heldBack || quiesced.withLockedValue({ $0 }) { context.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent()) }
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent {
            heldBack = true
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}
