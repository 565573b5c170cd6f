import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The descriptor-exhaustion attack replayed against a real `ferry serve` that runs with
/// systemd's default open-file limit (1024, soft and hard): 1,100 idle TCP connections on
/// the replication port and as many on the CouchDB port. The node must close the flood
/// (over the caps at once, the rest at the handshake or idle deadline), and its admin API,
/// its CouchDB API and a real peer's handshake must keep working.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackFloodScenarios {
    static let flood = 1_100
    static let nodeLimit = 1_024

    /// A flood's connection to 127.0.0.1:port from the loopback address `source`; it never sends a byte.
    static func idleConnection(port: Int, from source: String) -> Int32? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var local = sockaddr_in()
        local.sin_family = sa_family_t(AF_INET)
        local.sin_addr.s_addr = inet_addr(source)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, rc == 0 || errno == EINPROGRESS else {
            close(fd)
            return nil
        }
        return fd
    }

    /// Whether the node has closed `fd` (EOF or reset); false while it is open or still connecting.
    static func closedByNode(_ fd: Int32) -> Bool {
        // Whatever the node answered before closing (a 400, a TLS alert) is read and dropped.
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n > 0 { continue }
            if n == 0 { return true }
            return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ENOTCONN
        }
    }

    /// 1,100 connections to each port from `sources` (spread evenly).
    static func openFlood(ports: [Int], sources: [String]) -> [Int32] {
        ports.flatMap { port in (0..<flood).compactMap { i in idleConnection(port: port, from: sources[i % sources.count]) } }
    }

    /// This process holds the flood's client ends: its soft limit goes up to its hard one.
    static func raiseOwnLimit() {
        var r = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r)
        r.rlim_cur = r.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &r)
    }

    /// `ferry serve` under `prlimit --nofile=1024:1024`, trusting `trust`; waits for node.json.
    static func startLimitedNode(root: String, trust: String) async throws -> (ChildProcess, JSON) {
        let data = root + "/victim"
        let args = [
            "--nofile=\(nodeLimit):\(nodeLimit)", Ferry.binary, "--data", data, "serve", "--port", "0", "--admin-port", "0",
            "--couch-port", "0", "--name", "victim", "--interface", "127.0.0.1", "--no-discovery", "--trust", trust,
        ]
        let process = try ChildProcess.spawn("/usr/bin/prlimit", args, stdoutPath: root + "/victim.log", stderrPath: root + "/victim.log")
        var info = JSON.null
        try await waitUntil("the limited node's node.json", timeout: 60) {
            guard let bytes = FileManager.default.contents(atPath: data + "/node.json"), let json = try? JSON.parse(Array(bytes)),
                json["pid"]?.intValue == Int64(process.pid)
            else {
                if !process.isRunning { throw HarnessError("the limited node exited during start-up") }
                return false
            }
            info = json
            return (try? await AdminClient(nodeFile: json).get("/")["id"]) != nil
        }
        return (process, info)
    }

    /// Waits until the node holds no more descriptors than `baseline` (plus a few for links
    /// and requests): every flood connection it accepted is closed. Then wakes the flood's
    /// connections that the kernel never handed to it (an overflowing accept queue answers with
    /// SYN cookies, so the client end looks open while the node knows nothing of it) with
    /// one byte each, and waits until every one is closed.
    static func awaitFloodClosed(_ flood: [Int32], pid: Int32, baseline: Int, _ what: String) async throws {
        try await waitUntil("the node closed every connection of \(what) it accepted", timeout: 180) {
            openDescriptors(pid) <= baseline + 8
        }
        var poked = Set<Int32>()
        try await waitUntil("every connection of \(what) is closed", timeout: 120) {
            var open = 0
            for fd in flood where !closedByNode(fd) {
                open += 1
                if !poked.contains(fd) {
                    _ = send(fd, [0x00], 1, Int32(MSG_NOSIGNAL))
                    poked.insert(fd)
                }
            }
            return open == 0
        }
    }

    /// Descriptors the process holds now.
    static func openDescriptors(_ pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    @Test func aFloodOfIdleConnectionsIsClosedAndTheAdminAPICouchDBAPIAndPeersKeepWorking() async throws {
        Self.raiseOwnLimit()
        let cluster = Cluster("attack-flood")
        defer { cluster.cleanUp() }
        let peer = cluster.add("peer")
        let peerID = try await peer.id
        let (victimProcess, info) = try await Self.startLimitedNode(root: cluster.root, trust: peerID)
        defer { victimProcess.signal(SIGKILL) }
        let victimLog = cluster.root + "/victim.log"
        let admin = AdminClient(nodeFile: info)
        let victimID = info["id"]?.stringValue ?? ""
        let replicationPort = Int(info["port"]?.intValue ?? 0)
        let couchPort = Int(info["couchPort"]?.intValue ?? 0)
        let couchBase = (info["couchURL"]?.stringValue ?? "").trimmingSuffix("/")
        let couch = AdminClient(base: couchBase, host: nil, key: admin.key)
        let limits = try String(contentsOfFile: "/proc/\(victimProcess.pid)/limits", encoding: .utf8)
        let openFiles = limits.split(separator: "\n").first { $0.hasPrefix("Max open files") }?.split(separator: " ") ?? []
        #expect(openFiles.contains("\(Self.nodeLimit)"), "\(limits)")
        try await admin.put("before-flood", #"{"v":1}"#)

        // 1. The flood from one address: the per-address caps close most of it at once, and
        // everyone else is served while it is held.
        let baseline = Self.openDescriptors(victimProcess.pid)
        var flood = Self.openFlood(ports: [replicationPort, couchPort], sources: ["127.0.0.2"])
        #expect(flood.count == 2 * Self.flood)
        #expect(try await admin.call("GET", "/").status == 200)
        #expect(try await couch.call("GET", "/ferry").status == 200)
        try await peer.start(["--trust", victimID, "--peer", "\(info["url"]?.stringValue ?? "")#\(victimID)"])
        try await waitUntil("the peer pulled a document through the flood", timeout: 120) {
            (try? await peer.admin.call("GET", "/docs/before-flood").status) == 200
        }
        #expect(Self.openDescriptors(victimProcess.pid) < Self.nodeLimit / 2)
        try await Self.awaitFloodClosed(flood, pid: victimProcess.pid, baseline: baseline, "the one-address flood")
        for fd in flood { close(fd) }

        // 2. The flood from eleven addresses: now the totals are what bind, and the descriptors
        // they leave free keep the admin API answering at once.
        flood = Self.openFlood(ports: [replicationPort, couchPort], sources: (2...12).map { "127.0.1.\($0)" })
        defer { for fd in flood { close(fd) } }
        #expect(try await admin.call("GET", "/").status == 200)
        #expect(Self.openDescriptors(victimProcess.pid) < Self.nodeLimit / 2)
        try await admin.put("during-flood", #"{"v":2}"#)
        try await waitUntil("the CouchDB API answers again", timeout: 180) {
            (try? await couch.call("GET", "/ferry/during-flood").status) == 200
        }
        try await waitUntil("the peer received a document written during the flood", timeout: 180) {
            (try? await peer.admin.call("GET", "/docs/during-flood").status) == 200
        }
        try await Self.awaitFloodClosed(flood, pid: victimProcess.pid, baseline: baseline, "the eleven-address flood")
        let log = (try? String(contentsOfFile: victimLog, encoding: .utf8)) ?? ""
        // Logged per window with counts, never per connection.
        let capLines = log.split(separator: "\n").filter { $0.contains("closing connections at the listener's limits") }.count
        #expect(capLines >= 1 && capLines <= 20, "\(capLines) lines about the caps")
        #expect(!log.contains("Too many open files"), "the node ran out of descriptors")
        #expect(!log.contains("Fatal error") && !log.contains(" error ferry"), "\(log.suffix(4000))")

        let (status, graceful) = await victimProcess.stop(SIGTERM, grace: 30)
        #expect(graceful && status == 0, "the limited node exited \(status)")
        await finish(cluster)
    }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String { hasSuffix(suffix) ? String(dropLast(suffix.count)) : self }
}
