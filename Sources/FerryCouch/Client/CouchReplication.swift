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
        tls.trustRoots = .certificates([])  // the pin decides; no system CA bundle is read
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
