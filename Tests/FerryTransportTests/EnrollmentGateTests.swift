import FerryCore
import FerrySync
import Foundation
import NIOHTTP1
import Testing

@testable import FerryTransport

/// The listener's enrollment gate: an unknown certificate passes the TLS handshake only
/// while an invitation is open, and then reaches the join path alone.
@Suite(.timeLimit(.minutes(5))) struct EnrollmentGateTests {
    @Test func unknownCertificateReachesOnlyTheJoinPathWhileAnInvitationIsOpen() async throws {
        let server = try TestNode()
        let stranger = try TestNode()
        let open = Locked(false)
        let served = Locked<[String]>([])
        let (listener, task, port) = try await startListener(server, trust: .pinned([])) { config in
            config.enrollment = .init(
                isOpen: { open.withLock { $0 } },
                serve: { endpoint, peer, _ in
                    served.withLock { $0.append(peer) }
                    var it = endpoint.incoming.makeAsyncIterator()
                    if let m = try? await it.next() { try? await endpoint.send(m) }
                })
        }
        defer { task.cancel() }
        func connect(_ path: String) async throws -> any MessageEndpoint {
            var c = try WebSocketConnector(
                url: "wss://127.0.0.1:\(port)\(path)", serverTrust: .pinned([server.identity.nodeID]), identity: stranger.identity)
            c.logger = quietLogger()
            c.pingInterval = nil
            return try await c.connect()
        }
        // No invitation open: refused in the handshake, as any unknown certificate.
        await #expect(throws: TransportError.self) { _ = try await connect(WebSocketListener.joinPath) }
        // Open: the join path is served (here an echo) ...
        open.withLock { $0 = true }
        let endpoint = try await connect(WebSocketListener.joinPath)
        try await endpoint.send([1, 2, 3])
        var it = endpoint.incoming.makeAsyncIterator()
        #expect(try await it.next() == [1, 2, 3])
        await endpoint.close(error: nil)
        #expect(served.withLock { $0 } == [stranger.identity.nodeID])
        // ... and replication is forbidden to the same certificate.
        do {
            _ = try await connect("/ferry/sync")
            Issue.record("an enrollment-only peer reached replication")
        } catch let e as TransportError {
            #expect(e.message.contains("403"))
        }
        _ = listener
    }

    @Test func aListenerWithoutEnrollmentDoesNotServeTheJoinPath() throws {
        var config = WebSocketListener.Configuration()
        config.authentication = .mutualTLS(.pinned([]))
        let head = HTTPRequestHeadFixture.upgrade(WebSocketListener.joinPath)
        #expect(WebSocketListener.refusal(for: head, config: config) == .notFound)
        config.enrollment = .init(isOpen: { true }, serve: { _, _, _ in })
        #expect(WebSocketListener.refusal(for: head, config: config) == nil)
        #expect(WebSocketListener.refusal(for: HTTPRequestHeadFixture.upgrade("/ferry/sync"), config: config, enrollmentOnly: true) == .forbidden)
    }
}


/// WebSocket upgrade request heads for refusal checks.
enum HTTPRequestHeadFixture {
    static func upgrade(_ path: String) -> HTTPRequestHead {
        var headers = HTTPHeaders()
        headers.add(name: "Upgrade", value: "websocket")
        return HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers)
    }
}
