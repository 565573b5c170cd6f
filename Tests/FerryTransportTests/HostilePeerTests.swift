import FerryCore
import FerryStore
import FerrySync
import Foundation
import IntegrationHarness
import NIOCore
import NIOWebSocket
import Testing
@testable import FerryTransport

/// Reads until the peer closes the connection (true), or `timeout` seconds pass (false).
/// Non-blocking reads and async sleeps: a blocking read here would hold one of the
/// cooperative pool's threads, which the server under test needs to run at all.
func readUntilClosed(_ fd: Int32, timeout: Double = 60) async -> Bool {
    _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    var buf = [UInt8](repeating: 0, count: 4096)
    var closed = false
    _ = await eventually(timeout, every: .milliseconds(10)) {
        while true {
            let n = read(fd, &buf, buf.count)
            if n == 0 {
                closed = true
                return true
            }
            if n < 0 {
                guard errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR else {
                    closed = errno == ECONNRESET
                    return true
                }
                return false
            }
        }
    }
    return closed
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct HostilePeerTests {
    func connect(_ client: TestNode, _ server: TestNode, port: Int) async throws -> WebSocketEndpoint {
        var c = try WebSocketConnector(url: "wss://127.0.0.1:\(port)/ferry/sync", serverTrust: .pinned([server.identity.nodeID]), identity: client.identity)
        c.logger = quietLogger()
        return try #require(try await c.connect() as? WebSocketEndpoint)
    }

    func closedWithError(_ endpoint: WebSocketEndpoint) async -> Bool {
        do {
            for try await _ in endpoint.incoming {}
            return false
        } catch {
            return true
        }
    }

    @Test func aTextFrameAnOversizedMessageAndGarbageEnvelopesCloseOnlyThatConnection() async throws {
        let server = try TestNode()
        let client = try TestNode()
        let (_, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID])) {
            $0.maxMessageSize = 4096
        }
        defer { task.cancel() }
        let text = try await connect(client, server, port: port)
        try await text.sendRawFrame(WebSocketFrame(fin: true, opcode: .text, maskKey: .random(), data: ByteBuffer(string: "hello")))
        #expect(await closedWithError(text))

        let big = try await connect(client, server, port: port)
        try? await big.send([UInt8](repeating: 1, count: 10_000))
        #expect(await closedWithError(big))

        let garbage = try await connect(client, server, port: port)
        try await garbage.send([0xDE, 0xAD, 0xBE, 0xEF])
        #expect(await closedWithError(garbage))

        let fragments = try await connect(client, server, port: port)
        try await fragments.sendRawFrame(WebSocketFrame(fin: false, opcode: .binary, maskKey: .random(), data: ByteBuffer(bytes: [UInt8](repeating: 2, count: 3000))))
        try await fragments.sendRawFrame(WebSocketFrame(fin: true, opcode: .continuation, maskKey: .random(), data: ByteBuffer(bytes: [UInt8](repeating: 2, count: 3000))))
        #expect(await closedWithError(fragments))

        // The node keeps serving well-behaved peers.
        try server.store.put(try DocumentID("still-serving"), body: [:])
        // Retries allowed: what is checked is that the node still serves, not that a loaded
        // machine never drops a link.
        let r = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]), attempts: 5)
        #expect(r.status.error == nil)
        #expect(try client.store.document(try DocumentID("still-serving")) != nil)
    }

    @Test func aSlowLorisClientIsClosedAfterTheIdleTimeout() async throws {
        let server = try TestNode()
        let (_, task, port) = try await startListener(server, trust: .acceptAnyPeer) { $0.idleTimeout = .seconds(1) }
        defer { task.cancel() }
        let silent = rawSocket(port: port)
        defer { close(silent) }
        // A few bytes of a TLS record, then nothing: the server must give up on its own.
        _ = [UInt8]([0x16, 0x03, 0x01]).withUnsafeBytes { write(silent, $0.baseAddress, $0.count) }
        #expect(await readUntilClosed(silent))
    }

    @Test func aHugeLengthPrefixOrATruncatedFrameOnAUnixSocketIsClosedCleanly() async throws {
        let server = try TestNode()
        let path = NSTemporaryDirectory() + "ferry-h-\(UUID().uuidString.prefix(8)).sock"
        let responder = ReplicationResponder(store: server.store, logger: quietLogger())
        let serving = Task { try await ByteStreamTransport.serveUnix(path: path) { await responder.serve($0) } }
        defer { serving.cancel() }
        // A connected Unix socket; retried until the server listens (the socket file
        // appears at bind, a moment before listen).
        func unixSocket() async throws -> Int32 {
            var connected: Int32?
            _ = await eventually(60, every: .milliseconds(5)) {
                let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
                var addr = sockaddr_un()
                addr.sun_family = sa_family_t(AF_UNIX)
                withUnsafeMutableBytes(of: &addr.sun_path) { raw in
                    for (i, b) in path.utf8.enumerated() where i < raw.count - 1 { raw[i] = b }
                }
                let rc = withUnsafePointer(to: &addr) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Foundation.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
                }
                if rc == 0 {
                    connected = fd
                    return true
                }
                close(fd)
                return false
            }
            guard let connected else { throw SyncError.disconnected("cannot connect to \(path)") }
            return connected
        }
        let huge = try await unixSocket()
        let prefix: [UInt8] = [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]  // a length of about 2^55
        _ = prefix.withUnsafeBytes { write(huge, $0.baseAddress, $0.count) }
        #expect(await readUntilClosed(huge))
        close(huge)
        let truncated = try await unixSocket()
        let partial: [UInt8] = [0x40, 0xFE, 0x00]  // promises 64 bytes, sends 2
        _ = partial.withUnsafeBytes { write(truncated, $0.baseAddress, $0.count) }
        shutdown(truncated, Int32(SHUT_WR))
        #expect(await readUntilClosed(truncated))
        close(truncated)
        // Still serving.
        try server.store.put(try DocumentID("ok"), body: [:])
        let client = try TestNode()
        let r = Replicator(store: client.store, connector: { try await ByteStreamTransport.connectUnix(path: path) }, logger: quietLogger())
        await r.run()
        #expect(r.status.error == nil)
        #expect(try client.store.document(try DocumentID("ok")) != nil)
    }

    @Test func plaintextIsOnlyAvailableWhenExplicitlyInsecure() async throws {
        let server = try TestNode()
        let client = try TestNode()
        try server.store.put(try DocumentID("plain"), body: [:])
        let (_, task, port) = try await startListener(server, trust: .acceptAnyPeer) { $0.insecure = true }
        defer { task.cancel() }
        let r = try await replicate(client, url: "ws://127.0.0.1:\(port)/ferry/sync", pin: .acceptAnyPeer)
        #expect(r.status.error == nil)
        #expect(try client.store.document(try DocumentID("plain")) != nil)
        // A TLS client cannot talk to it.
        let tls = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        #expect(tls.status.error != nil)
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct RevocationTests {
    @Test func revokingAConnectedPeerClosesItsConnectionAndItsReplicatorNotices() async throws {
        let server = try TestNode()
        let client = try TestNode()
        let trusted = TrustedIDs([client.identity.nodeID])
        let (listener, task, port) = try await startListener(server, trust: .dynamic(trusted))
        defer { task.cancel() }
        var connector = try WebSocketConnector(url: "wss://127.0.0.1:\(port)/ferry/sync", serverTrust: .pinned([server.identity.nodeID]), identity: client.identity)
        connector.logger = quietLogger()
        let dial = connector
        var config = ReplicatorConfiguration()
        config.continuous = true
        config.maxAttempts = 1
        config.wiring.nodeID = client.identity.nodeID
        let replicator = Replicator(store: client.store, connector: { try await dial.connect() }, configuration: config, logger: quietLogger())
        let running = Task { await replicator.run() }
        defer { replicator.stop() }
        try await waitUntil { replicator.status.activity == .idle && listener.connections.count == 1 }
        trusted.replace(with: [])
        try await waitUntil { listener.connections.isEmpty }
        // The replicator sees the close as it happens, not at its next local change.
        try await waitUntil { replicator.status.activity == .stopped }
        // The close says why. On a loaded machine a write (a heartbeat) may hit the closed
        // connection before the close frame is read; the replicator then reports that instead.
        let why = replicator.status.error?.description ?? ""
        #expect(why.contains("no longer trusts") || why.contains("closed channel"), "\(why)")
        await running.value
    }
}
