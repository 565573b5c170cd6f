import FerryCore
import FerryCouchDocuments
import FerryPinning
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL

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

    /// The server's leaf certificate, when its fingerprint is `fingerprint`; a permanent
    /// error naming the fingerprint seen otherwise.
    static func pinnedLeaf(endpoint: CouchEndpoint, fingerprint pin: String) async throws -> NIOSSLCertificate {
        let context = try PinnedTLS.clientContext(roots: .none)
        let seen = Locked<(fingerprint: String, leaf: NIOSSLCertificate)?>(nil)
        let handshake = HandshakeWaiter()
        let sni = PinnedTLS.serverName(endpoint.host)
        let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let ssl = try NIOSSLClientHandler(
                        context: context, serverHostname: sni,
                        customVerificationCallback: PinnedTLS.verifier { seenPrint, leaf in
                            seen.withLock { $0 = (seenPrint, leaf) }
                            // The verdict is all this connection is for.
                            handshake.finish(nil)
                            return seenPrint == pin
                        })
                    try channel.pipeline.syncOperations.addHandlers([ssl, handshake.handler(on: channel.eventLoop)])
                }
            }
        let channel: Channel
        do { channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get() } catch {
            throw CouchClientError(.connectFailed, message: "connecting to \(endpoint.serverURL) failed: \(error)", isTransient: true)
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
                .pinMismatch,
                message: "\(endpoint.serverURL) presented the certificate with SHA-256 \(found.fingerprint), not the pinned \(pin)",
                isTransient: false)
        }
        throw CouchClientError(
            .tlsFailed, message: "TLS with \(endpoint.serverURL) failed: \(outcome.map { "\($0)" } ?? "no certificate")",
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
