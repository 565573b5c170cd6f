import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import NIOCore
import Testing
@testable import FerryTransport

/// A raw TCP connection to 127.0.0.1:port from the loopback address `source` (any 127.x.y.z
/// works on Linux), which never says a word: a flood's connection.
func idleConnection(port: Int, from source: String) -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var local = sockaddr_in()
    local.sin_family = sa_family_t(AF_INET)
    local.sin_addr.s_addr = inet_addr(source)
    _ = withUnsafePointer(to: &local) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = in_port_t(UInt16(port).bigEndian)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    _ = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    return fd
}

/// Whether the other side has closed `fd` (a non-blocking read sees EOF or a reset).
func closedByPeer(_ fd: Int32) -> Bool {
    var byte: UInt8 = 0
    let n = read(fd, &byte, 1)
    if n == 0 { return true }
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR
}

/// The replication listener's caps hold from accept: a flood of raw TCP connections that
/// never start TLS is cut to the per-address and total caps at once, the rest are closed at
/// the handshake deadline, and a real peer from another address still gets through.
@Suite(.serialized, .timeLimit(.minutes(10))) struct ListenerLimitsTests {
    /// Waits until `count` of `fds` are closed by the listener; returns how many are.
    func waitForClosed(_ fds: [Int32], count: Int, timeout: Double = 30) async -> Int {
        var closed = Set<Int32>()
        _ = await eventually(timeout, every: .milliseconds(20)) {
            for fd in fds where !closed.contains(fd) && closedByPeer(fd) { closed.insert(fd) }
            return closed.count >= count
        }
        return closed.count
    }

    @Test func connectionsOverThePerAddressCapAreClosedAtOnceBeforeAnyHandshake() async throws {
        let server = try TestNode()
        let (listener, task, port) = try await startListener(server, trust: .pinned([])) {
            $0.maxOpenConnections = 100
            $0.maxConnectionsPerAddress = 4
            // Long: what closes the 16 here is the cap, not the deadline.
            $0.handshakeTimeout = .seconds(600)
        }
        defer { task.cancel() }
        let flood = (0..<20).map { _ in idleConnection(port: port, from: "127.0.0.2") }
        defer { for fd in flood { close(fd) } }
        #expect(await waitForClosed(flood, count: 16) == 16)
        #expect(listener.gate.closed.overAddress == 16)
        #expect(listener.gate.openConnections(from: "127.0.0.2") == 4)
        // The four admitted ones are still open: only the caps closed anything.
        #expect(flood.filter { !closedByPeer($0) }.count == 4)
        #expect(listener.gate.closed.handshakeTimeouts == 0)
    }

    @Test func connectionsOverTheTotalCapAreClosedWhateverTheirAddress() async throws {
        let server = try TestNode()
        let (listener, task, port) = try await startListener(server, trust: .pinned([])) {
            $0.maxOpenConnections = 8
            $0.maxConnectionsPerAddress = 4
            $0.handshakeTimeout = .seconds(600)
        }
        defer { task.cancel() }
        // Five addresses, four each: each is within its own cap, together 12 over the total.
        let flood = (2...6).flatMap { a in (0..<4).map { _ in idleConnection(port: port, from: "127.0.0.\(a)") } }
        defer { for fd in flood { close(fd) } }
        #expect(await waitForClosed(flood, count: 12) == 12)
        #expect(listener.gate.closed.overTotal == 12)
        #expect(listener.gate.openConnections == 8)
    }

    @Test func connectionsThatNeverHandshakeAreClosedAtTheHandshakeDeadline() async throws {
        let server = try TestNode()
        let client = try TestNode()
        let (listener, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID])) {
            $0.maxOpenConnections = 100
            $0.maxConnectionsPerAddress = 10
            $0.handshakeTimeout = .milliseconds(300)
        }
        defer { task.cancel() }
        let flood = (0..<10).map { _ in idleConnection(port: port, from: "127.0.0.3") }
        defer { for fd in flood { close(fd) } }
        // A client that trickles a TLS record one byte at a time is no better off.
        let trickler = idleConnection(port: port, from: "127.0.0.5")
        defer { close(trickler) }
        let hello: [UInt8] = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC]
        var sent = 0
        let trickled = await eventually(30, every: .milliseconds(20)) {
            if closedByPeer(trickler) { return true }
            if sent < hello.count, write(trickler, [hello[sent]], 1) == 1 { sent += 1 }
            return false
        }
        #expect(trickled)
        #expect(await waitForClosed(flood, count: 10) == 10)
        #expect(await eventually(30) { listener.gate.openConnections == 0 })
        #expect(listener.gate.closed == .init(overTotal: 0, overAddress: 0, handshakeTimeouts: 11))
        // A real peer still handshakes well within the deadline's reach.
        let r = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        #expect(r.status.error == nil)
    }

    @Test func aPeerOnAnotherAddressConnectsWhileAFloodHoldsItsShare() async throws {
        let server = try TestNode()
        let client = try TestNode()
        try server.store.put(try DocumentID("from-server"), body: ["v": 1])
        let (listener, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID])) {
            $0.maxOpenConnections = 16
            $0.maxConnectionsPerAddress = 8
            $0.handshakeTimeout = .seconds(600)
        }
        defer { task.cancel() }
        let flood = (0..<200).map { _ in idleConnection(port: port, from: "127.0.0.4") }
        defer { for fd in flood { close(fd) } }
        #expect(await waitForClosed(flood, count: 192) == 192)
        #expect(listener.gate.openConnections(from: "127.0.0.4") == 8)
        let r = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        #expect(r.status.error == nil)
        #expect(try client.store.document(try DocumentID("from-server")) != nil)
        // The flood's admitted connections were untouched by the peer's success.
        #expect(listener.gate.openConnections(from: "127.0.0.4") == 8)
    }

    @Test func refusalsAreLoggedOncePerWindowWithTheirCount() {
        let sink = CapturedLog()
        let gate = ListenerGate(name: "test", limits: .init(total: 2, perAddress: 1), logger: sink.logger, logWindow: .seconds(3600))
        #expect(gate.admit(address: "a") == .admitted)
        #expect(gate.admit(address: "b") == .admitted)
        for _ in 0..<500 { #expect(gate.admit(address: "c") == .overTotal) }
        #expect(gate.admit(address: "a") == .overTotal)
        gate.release(address: "b")
        #expect(gate.admit(address: "a") == .overAddress)
        #expect(gate.admit(address: "c") == .admitted)
        #expect(gate.closed == .init(overTotal: 501, overAddress: 1, handshakeTimeouts: 0))
        #expect(sink.all.filter { $0.message == "closing connections at the listener's limits" }.count == 1)
    }
}
