import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Crypto
import Synchronization

/// Builds replicators whose other side is one CouchDB-protocol database: the entry point
/// for `ferry sync http(s)://…` and persistent replications with a CouchDB URL.
public final class CouchReplication: Sendable {
    public let endpoint: CouchEndpoint
    let logger: Logger
    /// The HTTP client, made at the first connection attempt (a pinned certificate is
    /// fetched and checked then, so a server that is down now is retried like any other).
    private let client = Mutex<CouchHTTP?>(nil)

    /// A client for `endpoint`; nothing is contacted until a replicator made by it runs.
    public init(endpoint: CouchEndpoint, logger: Logger) {
        self.endpoint = endpoint
        self.logger = logger
    }

    /// The HTTP client, made on first use.
    func http() async throws -> CouchHTTP {
        if let made = client.withLock({ $0 }) { return made }
        let tls = try await CouchTLS.configuration(for: endpoint, logger: logger)
        let made = CouchHTTP(endpoint: endpoint, tls: tls, logger: logger)
        let (winner, loser) = client.withLock { c -> (CouchHTTP, CouchHTTP?) in
            if let existing = c { return (existing, made) }
            c = made
            return (made, nil)
        }
        if let loser { await loser.shutdown() }
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
            // AsyncHTTPClient takes only a TLSConfiguration, which has no verification
            // callback. So the server's leaf certificate is fetched once over a plain NIOSSL
            // connection whose callback compares the SHA-256 of the leaf's DER with the pin
            // (with `.noHostnameVerification`: under `.none` BoringSSL ignores the callback's
            // verdict), and the client then trusts exactly that certificate. BoringSSL accepts
            // a certificate as its own trust root only when it may sign certificates
            // (`keyCertSign`, as self-signed CA certificates made by `openssl req -x509` may).
            let leaf = try await pinnedLeaf(endpoint: endpoint, fingerprint: fingerprint.lowercased())
            logger.debug("pinned certificate matched", metadata: ["server": "\(endpoint.serverURL)", "sha256": "\(fingerprint)"])
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .certificates([leaf])
            tls.certificateVerification = .noHostnameVerification
            return tls
        }
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
        let seen = Mutex<(fingerprint: String, leaf: NIOSSLCertificate)?>(nil)
        let handshake = HandshakeWaiter()
        // SNI carries host names only.
        let sni = endpoint.host.contains(":") || endpoint.host.allSatisfy({ $0.isNumber || $0 == "." }) ? nil : endpoint.host
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
    private let state = Mutex<(promise: EventLoopPromise<Void>?, finished: Bool)>((nil, false))

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
