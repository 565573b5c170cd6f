import FerryPinning
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization
import Testing

@testable import FerryTransport

/// The one pinned-TLS implementation, over real loopback handshakes: a handshake passes
/// exactly when each side's pin admits the other's certificate, with or without system roots.
@Suite(.timeLimit(.minutes(2))) struct PinnedTLSTests {
    /// A fresh self-signed node certificate and key, and its fingerprint.
    static func identity() throws -> (pair: (certificate: NIOSSLCertificate, key: NIOSSLPrivateKey), id: String) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("pinned-tls-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let node = try NodeIdentity.loadOrCreate(directory: dir, name: "pinned-tls-test")
        return (try TLSContexts.sslIdentity(node), node.nodeID)
    }

    /// Fulfils a promise when its side's handshake completes, fails it on any error or close.
    final class Outcome: ChannelInboundHandler, Sendable {
        typealias InboundIn = NIOAny
        let promise: EventLoopPromise<Void>
        init(_ promise: EventLoopPromise<Void>) { self.promise = promise }
        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .handshakeCompleted? = event as? TLSUserEvent { promise.succeed(()) }
            context.fireUserInboundEventTriggered(event)
        }
        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            promise.fail(error)
            context.close(promise: nil)
        }
        func channelInactive(context: ChannelHandlerContext) {
            promise.fail(ChannelError.ioOnClosedChannel)
            context.fireChannelInactive()
        }
    }

    /// Whether the server and the client each completed a handshake (the server's verdict on
    /// the client's certificate comes after the client's own handshake in TLS 1.3).
    func handshake(
        server: (certificate: NIOSSLCertificate, key: NIOSSLPrivateKey), client: (certificate: NIOSSLCertificate, key: NIOSSLPrivateKey)?,
        serverTrusts: @escaping @Sendable (String) -> Bool, clientTrusts: @escaping @Sendable (String) -> Bool,
        roots: PinnedTLS.SystemRoots = .none
    ) async throws -> (server: Bool, client: Bool) {
        let group = MultiThreadedEventLoopGroup.singleton
        let serverContext = try PinnedTLS.serverContext(identity: server, requireClientCertificate: true, minimumVersion: .tlsv13, roots: roots)
        let clientContext = try PinnedTLS.clientContext(identity: client, minimumVersion: .tlsv13, roots: roots)
        let serverDone = group.next().makePromise(of: Void.self)
        let listener = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        NIOSSLServerHandler(context: serverContext, customVerificationCallback: PinnedTLS.verifier { id, _ in serverTrusts(id) }),
                        Outcome(serverDone),
                    ])
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { listener.close(promise: nil) }
        let clientDone = group.next().makePromise(of: Void.self)
        let channel = try await ClientBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        try NIOSSLClientHandler(
                            context: clientContext, serverHostname: nil, customVerificationCallback: PinnedTLS.verifier { id, _ in clientTrusts(id) }),
                        Outcome(clientDone),
                    ])
                }
            }
            .connect(host: "127.0.0.1", port: listener.localAddress!.port!).get()
        defer { channel.close(promise: nil) }
        let clientPassed = (try? await clientDone.futureResult.get()) != nil
        let serverPassed = (try? await serverDone.futureResult.get()) != nil
        return (serverPassed, clientPassed)
    }

    @Test func peersPinningEachOthersCertificatesCompleteTheHandshake() async throws {
        let (s, c) = (try Self.identity(), try Self.identity())
        let result = try await handshake(server: s.pair, client: c.pair, serverTrusts: { $0 == c.id }, clientTrusts: { $0 == s.id })
        #expect(result.server && result.client)
    }

    @Test func aClientRefusesAServerWhoseCertificateIsNotThePinnedOne() async throws {
        let (s, c, other) = (try Self.identity(), try Self.identity(), try Self.identity())
        let result = try await handshake(server: s.pair, client: c.pair, serverTrusts: { $0 == c.id }, clientTrusts: { $0 == other.id })
        #expect(!result.client)
        #expect(!result.server)
    }

    @Test func aServerRefusesAClientWhoseCertificateIsNotPinned() async throws {
        let (s, c) = (try Self.identity(), try Self.identity())
        let result = try await handshake(server: s.pair, client: c.pair, serverTrusts: { _ in false }, clientTrusts: { $0 == s.id })
        #expect(!result.server)
    }

    @Test func aServerThatRequiresACertificateRefusesAClientWithout() async throws {
        let s = try Self.identity()
        let asked = Counted()
        let result = try await handshake(
            server: s.pair, client: nil, serverTrusts: { _ in asked.add(); return true }, clientTrusts: { $0 == s.id })
        #expect(!result.server)
        #expect(asked.value == 0, "the pin is never asked about a certificate that was not presented")
    }

    @Test func contextsWithSystemRootsStillDecideByThePinAlone() async throws {
        let (s, c) = (try Self.identity(), try Self.identity())
        let refused = try await handshake(
            server: s.pair, client: c.pair, serverTrusts: { $0 == c.id }, clientTrusts: { _ in false }, roots: .defaults)
        #expect(!refused.client)
        let admitted = try await handshake(
            server: s.pair, client: c.pair, serverTrusts: { $0 == c.id }, clientTrusts: { $0 == s.id }, roots: .defaults)
        #expect(admitted.server && admitted.client)
    }

    @Test func aFingerprintIsTheSHA256OfTheCertificateDER() throws {
        let s = try Self.identity()
        #expect(PinnedTLS.fingerprint(s.pair.certificate) == s.id)
        #expect(PinnedTLS.fingerprint(der: try s.pair.certificate.toDERBytes()) == s.id)
        #expect(s.id.count == 64)
    }

    @Test func serverNamesAreHostNamesNeverAddresses() {
        #expect(PinnedTLS.serverName("couch.example") == "couch.example")
        #expect(PinnedTLS.serverName("192.168.1.5") == nil)
        #expect(PinnedTLS.serverName("::1") == nil)
    }
}

/// A thread-safe counter for verification callbacks.
final class Counted: Sendable {
    private let count = Mutex(0)
    func add() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}
