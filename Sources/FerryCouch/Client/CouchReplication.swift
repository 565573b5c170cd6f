import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Crypto

/// Builds replicators whose other side is one CouchDB-protocol database: the entry point
/// for `ferry sync http(s)://…` and persistent replications with a CouchDB URL.
public final class CouchReplication: Sendable {
    public let endpoint: CouchEndpoint
    let logger: Logger
    /// The HTTP client, made at the first connection attempt (a pinned certificate is
    /// fetched and checked then, so a server that is down now is retried like any other).
    private let client = Locked<CouchHTTP?>(nil)

    /// A client for `endpoint`; nothing is contacted until a replicator made by it runs.
    public init(endpoint: CouchEndpoint, logger: Logger) {
        self.endpoint = endpoint
        self.logger = logger
    }

    /// Set by `abort()`: no client is made after it.
    private let aborted = Locked(false)

    /// Cancels every request in flight and refuses new ones, for a stop that must not wait
    /// on a transfer (what has been stored stays stored; a half-fetched attachment resumes
    /// on the next run).
    public func abort() {
        aborted.withLock { $0 = true }
        client.withLock { $0 }?.abort()
    }

    /// The HTTP client, made on first use.
    func http() async throws -> CouchHTTP {
        if aborted.withLock({ $0 }) { throw CouchClientError.stopped("connecting to \(endpoint.redacted)") }
        if let made = client.withLock({ $0 }) { return made }
        let tls = try await CouchTLS.configuration(for: endpoint, logger: logger)
        let made = CouchHTTP(endpoint: endpoint, tls: tls, logger: logger)
        let (winner, loser) = client.withLock { c -> (CouchHTTP, CouchHTTP?) in
            if let existing = c { return (existing, made) }
            c = made
            return (made, nil)
        }
        if let loser { await loser.shutdown() }
        if aborted.withLock({ $0 }) { winner.abort() }
        return winner
    }

    /// A replicator between `store` and the endpoint's database, shaped by `configuration`
    /// (direction, continuous, document IDs, filters, policy, resolvers, metrics).
    public func replicator(
        store: DocumentStore, configuration: ReplicatorConfiguration, clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger? = nil
    ) -> Replicator {
        let log = logger ?? self.logger
        return Replicator(
            store: store, remote: { try await CouchRemote.open(http: try await self.http(), store: store, logger: log) },
            configuration: configuration, clock: clock, logger: log)
    }

    /// Closes the client's connections; replicators made by it must have stopped.
    public func shutdown() async {
        if let made = client.withLock({ c -> CouchHTTP? in defer { c = nil }; return c }) { await made.shutdown() }
    }
}

/// The TLS configuration an endpoint's trust calls for.
enum CouchTLS {
    /// nil for http; the system trust store, or exactly the pinned certificate, for https.
    static func configuration(for endpoint: CouchEndpoint, logger: Logger) async throws -> TLSConfiguration? {
        guard endpoint.scheme == "https" else { return nil }
        switch endpoint.trust {
        case .system: return TLSConfiguration.makeClientConfiguration()
        case .pinned(let fingerprint):
            // Checked once here, so that a wrong pin fails the first attempt with a clear,
            // permanent error. Requests then go through `PinnedHTTPS`, which checks the pin on
            // every connection; this configuration (trusting exactly that certificate) is what
            // AsyncHTTPClient would use, and works only for a certificate that may sign
            // certificates (`keyCertSign`), so it is not relied on.
            let leaf = try await pinnedLeaf(endpoint: endpoint, fingerprint: try CouchEndpoint.normalizedPin(fingerprint))
            logger.debug("pinned certificate matched", metadata: ["server": "\(endpoint.serverURL)", "sha256": "\(fingerprint)"])
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .certificates([leaf])
            tls.certificateVerification = .noHostnameVerification
            return tls
        }
    }

    /// The host as SNI carries it: host names only, never addresses.
    static func serverName(_ host: String) -> String? {
        host.contains(":") || host.allSatisfy({ $0.isNumber || $0 == "." }) ? nil : host
    }

    /// The SHA-256 of a certificate's DER, in lowercase hex.
    static func fingerprint(_ certificate: NIOSSLCertificate) throws -> String {
        Hex.encode(SHA256.hash(data: try certificate.toDERBytes()))
    }

    /// The server's leaf certificate, when its fingerprint is `fingerprint`; a permanent
    /// error naming the fingerprint seen otherwise.
    static func pinnedLeaf(endpoint: CouchEndpoint, fingerprint pin: String) async throws -> NIOSSLCertificate {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.certificateVerification = .noHostnameVerification
        let context = try NIOSSLContext(configuration: tls)
        let seen = Locked<(fingerprint: String, leaf: NIOSSLCertificate)?>(nil)
        let handshake = HandshakeWaiter()
        let sni = serverName(endpoint.host)
        let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let ssl = try NIOSSLClientHandler(
                        context: context, serverHostname: sni,
                        customVerificationCallback: { certificates, promise in
                            guard let leaf = certificates.first, let seenPrint = try? fingerprint(leaf) else {
                                promise.succeed(.failed)
                                return
                            }
                            seen.withLock { $0 = (seenPrint, leaf) }
                            // The verdict is all this connection is for.
                            handshake.finish(nil)
                            promise.succeed(seenPrint == pin ? .certificateVerified : .failed)
                        })
                    try channel.pipeline.syncOperations.addHandlers([ssl, handshake.handler(on: channel.eventLoop)])
                }
            }
        let channel: Channel
        do { channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get() } catch {
            throw CouchClientError(code: "connect_failed", message: "connecting to \(endpoint.serverURL) failed: \(error)", isTransient: true)
        }
        defer { channel.close(promise: nil) }
        // A server that accepts the connection and never answers must not hold the attempt.
        let timer = channel.eventLoop.scheduleTask(in: .seconds(10)) { handshake.finish(PinnedHTTPS.PinnedTimeout()) }
        defer { timer.cancel() }
        let outcome: Error?
        do {
            try await handshake.done.get()
            outcome = nil
        } catch { outcome = error }
        let found = seen.withLock { $0 }
        if let found, found.fingerprint == pin, outcome == nil { return found.leaf }
        if let found, found.fingerprint != pin {
            throw CouchClientError(
                code: "pin_mismatch",
                message: "\(endpoint.serverURL) presented the certificate with SHA-256 \(found.fingerprint), not the pinned \(pin)",
                isTransient: false)
        }
        throw CouchClientError(
            code: "tls_failed", message: "TLS with \(endpoint.serverURL) failed: \(outcome.map { "\($0)" } ?? "no certificate")",
            isTransient: found == nil)
    }
}

/// Completes a future once the pinned-certificate check has seen the server's certificate,
/// or the connection failed first.
final class HandshakeWaiter: Sendable {
    private let state = Locked<(promise: EventLoopPromise<Void>?, finished: Bool)>((nil, false))

    var done: EventLoopFuture<Void> { state.withLock { $0.promise!.futureResult } }

    func finish(_ error: Error?) {
        let promise = state.withLock { s -> EventLoopPromise<Void>? in
            guard !s.finished else { return nil }
            s.finished = true
            return s.promise
        }
        if let error { promise?.fail(error) } else { promise?.succeed(()) }
    }

    func handler(on loop: EventLoop) -> ChannelHandler {
        let p = loop.makePromise(of: Void.self)
        state.withLock { $0.promise = p }
        return Handler(waiter: self)
    }

    private final class Handler: ChannelInboundHandler {
        typealias InboundIn = NIOAny
        let waiter: HandshakeWaiter
        init(waiter: HandshakeWaiter) { self.waiter = waiter }
        func errorCaught(context: ChannelHandlerContext, error: Error) {
            waiter.finish(error)
            context.close(promise: nil)
        }
        func channelInactive(context: ChannelHandlerContext) {
            waiter.finish(ChannelError.ioOnClosedChannel)
            context.fireChannelInactive()
        }
    }
}

/// One HTTP/1.1 exchange over a fresh TLS connection that is refused unless the server's
/// certificate has the pinned SHA-256: how a pinned endpoint is reached.
///
/// AsyncHTTPClient can only trust a pinned certificate as a trust root, which BoringSSL
/// refuses for a certificate that may not sign certificates (a Ferry node's, and many
/// self-made ones). This exchange checks the pin in the handshake's verification callback
/// instead, with `.noHostnameVerification` (under `.none` the callback's verdict is ignored).
/// One connection per request (`Connection: close`): simple, at the cost of a handshake each.
enum PinnedHTTPS {
    static func exchange(
        endpoint: CouchEndpoint, pin: String, method: HTTPMethod, uri: String, headers: HTTPHeaders, body: [UInt8]?,
        timeout: TimeAmount, maxBytes: Int
    ) async throws -> CouchHTTP.Response {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.certificateVerification = .noHostnameVerification
        let context = try NIOSSLContext(configuration: tls)
        let seen = Locked<String?>(nil)
        let sni = CouchTLS.serverName(endpoint.host)
        let collector = ResponseCollector(maxBytes: maxBytes)
        let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let ssl = try NIOSSLClientHandler(
                        context: context, serverHostname: sni,
                        customVerificationCallback: { certificates, promise in
                            let print = certificates.first.flatMap { try? CouchTLS.fingerprint($0) }
                            seen.withLock { $0 = print }
                            promise.succeed(print == pin ? .certificateVerified : .failed)
                        })
                    try channel.pipeline.syncOperations.addHandler(ssl)
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(collector.handler(on: channel.eventLoop))
                }
            }
        let channel: Channel
        do { channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get() } catch {
            throw CouchClientError(code: "connect_failed", message: "connecting to \(endpoint.serverURL) failed: \(error)", isTransient: true)
        }
        defer { channel.close(promise: nil) }
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: headers)
        head.headers.replaceOrAdd(name: "Host", value: endpoint.port == 443 ? endpoint.host : "\(endpoint.host):\(endpoint.port)")
        head.headers.replaceOrAdd(name: "Connection", value: "close")
        head.headers.replaceOrAdd(name: "Content-Length", value: "\(body?.count ?? 0)")
        let timer = channel.eventLoop.scheduleTask(in: timeout) { collector.finish(.failure(PinnedTimeout())) }
        defer { timer.cancel() }
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        if let body { channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: body))), promise: nil) }
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        do {
            // A stop (task cancellation) ends the wait at once; the deferred close ends the connection.
            return try await withTaskCancellationHandler {
                try await collector.done.get()
            } onCancel: {
                collector.finish(.failure(CancellationError()))
            }
        } catch is CancellationError {
            throw CouchClientError.stopped("\(method) \(uri)")
        } catch is PinnedTimeout {
            throw CouchClientError(code: "timeout", message: "\(method) \(uri): no answer from \(endpoint.serverURL) in time", isTransient: true)
        } catch {
            if let print = seen.withLock({ $0 }), print != pin {
                throw CouchClientError(
                    code: "pin_mismatch",
                    message: "\(endpoint.serverURL) presented the certificate with SHA-256 \(print), not the pinned \(pin)",
                    isTransient: false)
            }
            if error is NIOSSLError {
                throw CouchClientError(code: "tls_failed", message: "TLS with \(endpoint.serverURL) failed: \(error)", isTransient: false)
            }
            throw CouchClientError(
                code: "connect_failed", message: "\(method) \(uri) at \(endpoint.serverURL) failed: \(error)", isTransient: true)
        }
    }

    struct PinnedTimeout: Error {}
    struct TooLarge: Error {}

    /// Gathers one response and completes once, whatever ends it first.
    final class ResponseCollector: Sendable {
        let maxBytes: Int
        private let state = Locked<(promise: EventLoopPromise<CouchHTTP.Response>?, finished: Bool)>((nil, false))
        init(maxBytes: Int) { self.maxBytes = maxBytes }

        var done: EventLoopFuture<CouchHTTP.Response> { state.withLock { $0.promise!.futureResult } }

        func finish(_ result: Result<CouchHTTP.Response, any Error>) {
            let promise = state.withLock { s -> EventLoopPromise<CouchHTTP.Response>? in
                guard !s.finished else { return nil }
                s.finished = true
                return s.promise
            }
            promise?.completeWith(result)
        }

        func handler(on loop: EventLoop) -> ChannelHandler {
            state.withLock { $0.promise = loop.makePromise(of: CouchHTTP.Response.self) }
            return Handler(collector: self)
        }

        /// Lives on its channel's event loop.
        private final class Handler: ChannelInboundHandler {
            typealias InboundIn = HTTPClientResponsePart
            let collector: ResponseCollector
            var head: HTTPResponseHead?
            var body: [UInt8] = []
            init(collector: ResponseCollector) { self.collector = collector }

            func channelRead(context: ChannelHandlerContext, data: NIOAny) {
                switch unwrapInboundIn(data) {
                case .head(let h): head = h
                case .body(var buffer):
                    guard body.count + buffer.readableBytes <= collector.maxBytes else {
                        collector.finish(.failure(TooLarge()))
                        context.close(promise: nil)
                        return
                    }
                    body += buffer.readBytes(length: buffer.readableBytes) ?? []
                case .end:
                    if let head {
                        collector.finish(.success(CouchHTTP.Response(status: Int(head.status.code), headers: head.headers, body: body)))
                    }
                }
            }
            func errorCaught(context: ChannelHandlerContext, error: Error) {
                collector.finish(.failure(error))
                context.close(promise: nil)
            }
            func channelInactive(context: ChannelHandlerContext) {
                collector.finish(.failure(ChannelError.ioOnClosedChannel))
                context.fireChannelInactive()
            }
        }
    }
}
