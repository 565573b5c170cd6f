import FerryCore
import FerrySync
import Foundation
import IntegrationHarness
import Logging
import Synchronization
import Testing

@testable import FerryTransport

/// TLS refusals are named in user terms on both sides, not as BoringSSL error strings.
@Suite(.serialized, .timeLimit(.minutes(5))) struct TLSFailureTests {
    func listener(_ server: TestNode, trust: PeerTrust, logger: Logger) async throws -> (Task<Void, any Error>, Int) {
        var config = WebSocketListener.Configuration()
        config.host = "127.0.0.1"
        config.port = 0
        config.authentication = .mutualTLS(trust)
        let listener = WebSocketListener(
            identity: server.identity, configuration: config,
            responder: ReplicationResponder(store: server.store, options: .init(), logger: quietLogger()), logger: logger)
        let task = Task { try await listener.run() }
        return (task, try await listener.waitUntilBound())
    }

    /// The reason the listener logged for its first refused handshake, once it has logged one.
    func refusalReason(_ sink: CapturedLog) async throws -> String? {
        for _ in 0..<600 {
            if let r = sink.all.first(where: { $0.message == "connection refused during handshake" }) {
                return r.metadata["reason"].map { "\($0)" }
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }

    @Test func aClientWithoutACertificateIsNamedSoOnBothSides() async throws {
        let server = try TestNode()
        let sink = CapturedLog()
        let (task, port) = try await listener(server, trust: .pinned([]), logger: sink.logger)
        defer { task.cancel() }
        var connector = try WebSocketConnector(
            url: "wss://127.0.0.1:\(port)/ferry/sync", serverTrust: .pinned([server.identity.nodeID]), identity: nil)
        connector.logger = quietLogger()
        do {
            _ = try await connector.connect()
            Issue.record("a client without a certificate connected")
        } catch {
            #expect("\(error)".contains("presented none"), "\(error)")
            #expect(!"\(error)".contains("OPENSSL"), "\(error)")
        }
        #expect(try await refusalReason(sink) == "the peer presented no certificate")
    }

    @Test func anUntrustedClientCertificateIsNamedByItsFingerprint() async throws {
        let server = try TestNode()
        let stranger = try TestNode()
        let sink = CapturedLog()
        let (task, port) = try await listener(server, trust: .pinned([]), logger: sink.logger)
        defer { task.cancel() }
        let r = try await replicate(stranger, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        let message = r.status.error?.description ?? ""
        #expect(message.contains("does not trust this node's certificate (fingerprint \(stranger.identity.nodeID))"), "\(message)")
        #expect(!message.contains("OPENSSL"), "\(message)")
        #expect(try await refusalReason(sink) == "the peer's certificate is not trusted (fingerprint \(stranger.identity.nodeID))")
    }

    @Test func boringSSLTextsMapToUserTerms() {
        #expect(TLSFailure.reason("error:10000412:SSL routines:OPENSSL_internal:PEER_DID_NOT_RETURN_A_CERTIFICATE") == "the peer presented no certificate")
        #expect(TLSFailure.reason("sslError([Error: 268435612 error:1000009c:SSL routines:OPENSSL_internal:HTTP_REQUEST])")?.contains("does not speak TLS") == true)
        #expect(TLSFailure.reason("OPENSSL_internal:UNSUPPORTED_PROTOCOL") == "the peer does not offer TLS 1.3")
        #expect(TLSFailure.reason("OPENSSL_internal:SOMETHING_ELSE") == "the TLS handshake failed (something else)")
        #expect(TLSFailure.reason("connection reset by peer") == nil)
    }
}
