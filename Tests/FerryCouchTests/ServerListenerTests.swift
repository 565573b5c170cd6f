import FerryCore
import Foundation
import Glibc
import IntegrationHarness
import Logging
import ServiceLifecycle
import Testing

@testable import FerryCouch

/// The CouchDB API listener as a service.
@Suite(.timeLimit(.minutes(2))) struct ServerListenerTests {
    @Test func aGracefulShutdownFiresTheDatabasesShutdownSignal() async throws {
        let door = try ServerFrontDoorTests.frontDoor()
        let (bound, announce) = AsyncStream.makeStream(of: Int.self)
        let service = try CouchListenerService(
            frontDoor: door, host: "127.0.0.1", port: 0, logger: Logger(label: "test"), onBound: { announce.yield($0) })
        let group = ServiceGroup(configuration: .init(services: [service], logger: Logger(label: "test")))
        let run = Task { try await group.run() }
        var ports = bound.makeAsyncIterator()
        let port = await ports.next()
        #expect((port ?? 0) > 0)
        #expect(!door.database.shutdown.isFired)
        await group.triggerGracefulShutdown()
        try await run.value
        #expect(door.database.shutdown.isFired)
    }

    /// A graceful stop is not held by the connections that are not in a request: one that
    /// has sent nothing yet, and one kept alive after its request (which is closed). Neither
    /// waits for the idle deadline (an hour here), so an HTTP client's pooled connections do
    /// not hold a stopping node past its grace period.
    @Test func aGracefulShutdownClosesConnectionsThatAreBetweenRequests() async throws {
        let door = try ServerFrontDoorTests.frontDoor()
        let (bound, announce) = AsyncStream.makeStream(of: Int.self)
        // Connections the listener took and set up (its admission runs just before the set-up,
        // on the connection's event loop): the stop must come after both, or it would race them.
        let accepted = Locked(0)
        let service = try CouchListenerService(
            frontDoor: door, host: "127.0.0.1", port: 0, logger: Logger(label: "test"), idleTimeout: .hours(1),
            admit: { _ in
                accepted.withLock { $0 += 1 }
                return true
            }, onBound: { announce.yield($0) })
        let group = ServiceGroup(configuration: .init(services: [service], logger: Logger(label: "test")))
        let run = Task { try await group.run() }
        var ports = bound.makeAsyncIterator()
        let port = try #require(await ports.next())
        let silent = Self.connect(port: port)
        let keptAlive = Self.connect(port: port)
        defer { close(silent); close(keptAlive) }
        let request = Array("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n\r\n".utf8)
        #expect(write(keptAlive, request, request.count) == request.count)
        let answer = await Self.offPool { Self.read(keptAlive, until: "}").text }
        #expect(answer.hasPrefix("HTTP/1.1 200"), "\(answer)")
        try await waitUntil("the listener took both connections", timeout: 30, every: .milliseconds(5)) { accepted.withLock { $0 } == 2 }
        await group.triggerGracefulShutdown()
        // Were a connection to hold the stop, the suite's time limit ends the test (a failure).
        try await withTaskCancellationHandler { try await run.value } onCancel: { run.cancel() }
        // The stop did not wait for the silent connection (above). Under load Hummingbird may
        // have taken it too late to quiesce it, and then it stays open until the process ends,
        // so only the kept-alive connection's close is checked here.
        #expect(await Self.offPool { Self.read(keptAlive, until: nil).closed }, "the kept-alive connection was closed")
    }

    /// A Couchbase Lite app with a wrong password is refused the upgrade and answered 401 over
    /// HTTP; the front door sees that request twice (the upgrade, then its HTTP answer), yet
    /// the throttle counts one failed login: with a backoff after two, the right password
    /// still gets in.
    @Test func aRefusedUpgradeWithAWrongPasswordIsOneFailedLogin() async throws {
        var policy = LoginThrottle.Policy()
        policy.accountFailuresBeforeBackoff = 2
        policy.initialBackoff = .seconds(600)
        let door = try ServerFrontDoorTests.frontDoor(throttle: LoginThrottle(policy: policy))
        let (bound, announce) = AsyncStream.makeStream(of: Int.self)
        let service = try CouchListenerService(
            frontDoor: door, host: "127.0.0.1", port: 0, logger: Logger(label: "test"), onBound: { announce.yield($0) })
        let group = ServiceGroup(configuration: .init(services: [service], logger: Logger(label: "test")))
        let run = Task { try await group.run() }
        defer { run.cancel() }
        var ports = bound.makeAsyncIterator()
        let port = try #require(await ports.next())

        @Sendable func ask(_ lines: [String]) async -> String {
            await Self.offPool { askBlocking(lines) }
        }
        @Sendable func askBlocking(_ lines: [String]) -> String {
            let fd = Self.connect(port: port)
            defer { close(fd) }
            let request = Array(([lines[0], "Host: 127.0.0.1:\(port)"] + lines.dropFirst() + ["", ""]).joined(separator: "\r\n").utf8)
            _ = write(fd, request, request.count)
            return Self.read(fd, until: "}").text
        }
        let upgrade = await ask([
            "GET /ferry/_blipsync HTTP/1.1", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol: BLIP_3+CBMobile_3",
            "Authorization: \(ServerFrontDoorTests.basic("writer", "wrong"))",
        ])
        #expect(upgrade.hasPrefix("HTTP/1.1 401"), "\(upgrade)")
        let right = await ask(["GET /ferry HTTP/1.1", "Authorization: \(ServerFrontDoorTests.basic("writer", "w-pass"))"])
        #expect(right.hasPrefix("HTTP/1.1 200"), "one wrong password, one failure: \(right)")
        await group.triggerGracefulShutdown()
        try await withTaskCancellationHandler { try await run.value } onCancel: { run.cancel() }
    }

    /// Runs blocking socket calls on a thread of their own: on the cooperative pool (two
    /// threads here) they would stall the listener under test.
    static func offPool<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: work()) }.start()
        }
    }

    /// A blocking TCP connection to the listener, reads timing out after 30 s.
    static func connect(port: Int) -> Int32 {
        let fd = rawSocket(port: port)
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    /// What arrives until the text (trailing newlines aside) ends with `end` (nil: until the peer closes or a read
    /// times out), and whether the peer closed the connection.
    static func read(_ fd: Int32, until end: String?) -> (text: String, closed: Bool) {
        var received = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        var closed = false
        while true {
            let n = Glibc.read(fd, &buffer, buffer.count)
            if n == 0 || (n < 0 && errno == ECONNRESET) { closed = true }
            if n <= 0 { break }
            received += buffer[0..<n]
            if let end, String(decoding: received, as: UTF8.self).trimmingCharacters(in: .newlines).hasSuffix(end) { break }
        }
        return (String(decoding: received, as: UTF8.self), closed)
    }

    @Test func aTLSListenerRefusesAKeyThatIsNotDER() throws {
        let door = try ServerFrontDoorTests.frontDoor(.lan)
        #expect(throws: (any Error).self) {
            _ = try CouchListenerService(
                frontDoor: door, host: "127.0.0.1", port: 0, tls: .init(certificateDER: [1, 2, 3], privateKeyDER: [4, 5, 6]),
                logger: Logger(label: "test"))
        }
    }
}
