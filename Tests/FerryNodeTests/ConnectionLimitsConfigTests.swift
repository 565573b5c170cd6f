import FerryCore
import Foundation
import Logging
import Testing

@testable import FerryNode

/// The listeners' connection caps: their config keys, their errors, and how the open-file
/// limit shares descriptors among them.
@Suite struct ConnectionLimitsConfigTests {
    @Test func theCapsHaveTheirDocumentedDefaults() throws {
        let c = try parse("{}")
        #expect(c.limits.maxOpenConnections == 128)
        #expect(c.limits.maxConnectionsPerAddress == 16)
        #expect(c.limits.handshakeTimeoutSeconds == 10)
        #expect(c.couch.maxConnections == 256)
        #expect(c.couch.maxConnectionsPerAddress == 64)
        #expect(c.couch.idleTimeoutSeconds == 30)
    }

    @Test func theCapsAreRead() throws {
        let c = try parse("""
            {"limits":{"maxOpenConnections":500,"maxConnectionsPerAddress":20,"handshakeTimeoutSeconds":3},
             "couch":{"maxConnections":40,"maxConnectionsPerAddress":10,"idleTimeoutSeconds":5}}
            """)
        #expect(c.limits.maxOpenConnections == 500 && c.limits.maxConnectionsPerAddress == 20 && c.limits.handshakeTimeoutSeconds == 3)
        #expect(c.couch.maxConnections == 40 && c.couch.maxConnectionsPerAddress == 10 && c.couch.idleTimeoutSeconds == 5)
    }

    @Test func badCapsAreRefusedNamingTheKey() {
        #expect(configError(#"{"limits":{"handshakeTimeoutSeconds":0}}"#)?.key == "limits.handshakeTimeoutSeconds")
        #expect(configError(#"{"limits":{"maxOpenConnections":"many"}}"#)?.key == "limits.maxOpenConnections")
        #expect(configError(#"{"limits":{"maxOpenConnections":8,"maxConnectionsPerAddress":9}}"#)?.description
            == "test.json: limits.maxOpenConnections: must be at least limits.maxConnectionsPerAddress (9)")
        #expect(configError(#"{"couch":{"maxConnectionsPerAddress":0}}"#)?.key == "couch.maxConnectionsPerAddress")
        #expect(configError(#"{"couch":{"idleTimeoutSeconds":-1}}"#)?.key == "couch.idleTimeoutSeconds")
        #expect(configError(#"{"couch":{"maxConnections":10,"maxConnectionsPerAddress":64}}"#)?.key == "couch.maxConnections")
    }

    @Test func aLimitOf1024LeavesAReserveAndKeepsTheDefaultCaps() {
        let budget = DescriptorBudget(limit: 1024)
        #expect(budget.reserved == 256)
        #expect(budget.replicationTotal(configured: 128) == 128)
        #expect(budget.couchTotal(configured: 256, listeners: 1) == 256)
        // Every listener full still leaves the reserve.
        #expect(budget.replicationTotal(configured: 100_000) + budget.couchTotal(configured: 100_000, listeners: 1) <= 1024 - 256)
    }

    @Test func aSmallLimitShrinksTheCapsButNeverToNothing() {
        let budget = DescriptorBudget(limit: 256)
        #expect(budget.reserved == 128)
        #expect(budget.replicationTotal(configured: 128) == 64)
        #expect(budget.couchTotal(configured: 256, listeners: 2) == 32)
        #expect(DescriptorBudget(limit: 0).replicationTotal(configured: 128) == 1)
    }

    @Test func raisingTheSoftLimitReachesTheHardOne() {
        var r = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r)
        let budget = DescriptorBudget.raiseSoftLimit(logger: .init(label: "test"))
        let expected = r.rlim_max == rlim_t.max ? Int(1 << 20) : Int(clamping: r.rlim_max)
        #expect(budget.limit == expected || budget.limit == Int(clamping: r.rlim_cur))
        #expect(DescriptorBudget.current.limit >= Int(clamping: r.rlim_cur))
    }
}

/// The CouchDB listener's caps and idle deadline on a running node: a flood of silent raw
/// connections is cut to the per-address cap at once and the rest are closed at the idle
/// deadline, while a client on another address is served throughout.
@Suite(.serialized, .timeLimit(.minutes(10))) struct CouchListenerLimitsTests {
    /// A silent connection to 127.0.0.1:port from `source`.
    static func silent(port: Int, from source: String) -> Int32 {
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

    static func closed(_ fd: Int32) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 1024)
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n > 0 { continue }
            return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        }
    }

    /// Polls until `count` of `fds` are closed (or 60 s pass); returns how many are.
    static func closedCount(_ fds: [Int32], reaching count: Int) async throws -> Int {
        var done = Set<Int32>()
        for _ in 0..<3000 {
            for fd in fds where !done.contains(fd) && closed(fd) { done.insert(fd) }
            if done.count >= count { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        return done.count
    }

    @Test func aSilentFloodIsCutToThePerAddressCapThenClosedAtTheIdleDeadline() async throws {
        let n = try await InProcessNode.start {
            $0.discovery = false
            $0.couch.port = 0
            $0.couch.maxConnections = 50
            $0.couch.maxConnectionsPerAddress = 4
            $0.couch.idleTimeoutSeconds = 1
        }
        let port = n.ready.couchPort
        let flood = (0..<20).map { _ in Self.silent(port: port, from: "127.0.0.2") }
        defer { for fd in flood { close(fd) } }
        // A trickler: one byte of a request head now and then never completes it.
        let trickler = Self.silent(port: port, from: "127.0.0.3")
        defer { close(trickler) }
        _ = write(trickler, "G", 1)
        #expect(try await Self.closedCount(flood, reaching: 16) >= 16)
        #expect(try await CouchListenerTests.http(port, "GET", "/_up").status == 200)
        #expect(try await Self.closedCount(flood, reaching: 20) == 20)
        #expect(try await Self.closedCount([trickler], reaching: 1) == 1)
        await n.stop()
    }
}
