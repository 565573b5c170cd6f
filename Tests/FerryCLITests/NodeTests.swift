import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The headless peer end to end: real `ferry serve` processes driven through the admin API.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AdminAPITests {
    @Test func everyEndpointAnswersWithTheRightStatusAndJSON() async throws {
        let node = ServeProcess()
        let info = try await node.start()
        let api = AdminClient(nodeFile: info)

        let root = try await api.get("/")
        #expect(root["id"]?.stringValue == info["id"]?.stringValue)
        for key in ["id", "name", "version", "port", "docCount", "lastSequence", "digest"] { #expect(root[key] != nil, "GET / lacks \(key)") }

        // Documents.
        let created = try await api.call("PUT", "/docs/orders/1", body: #"{"qty":2}"#)
        #expect(created.status == 201)
        let rev1 = try #require(created.json["rev"]?.stringValue)
        #expect(created.json["id"] == "orders/1")
        #expect(try await api.call("PUT", "/docs/orders/1", body: #"{"qty":3}"#).status == 409)  // no rev
        #expect(try await api.call("PUT", "/docs/orders/1", body: #"{"qty":3,"_rev":"1-\#(String(repeating: "0", count: 64))"}"#).status == 409)
        let bad = try await api.call("PUT", "/docs/orders/2", body: #"{"qty": "#)
        #expect(bad.status == 400)
        #expect(bad.json["error"] == "bad_json")
        #expect(try await api.call("PUT", "/docs/_reserved", body: "{}").status == 400)
        #expect(try await api.call("PUT", "/docs/orders/2", body: "[1,2]").status == 400)
        #expect(try await api.call("PUT", "/docs/orders/1?rev=garbage", body: "{}").status == 400)
        let updated = try await api.call("PUT", "/docs/orders/1?rev=\(rev1)", body: #"{"qty":3}"#)
        #expect(updated.status == 201)
        let rev2 = try #require(updated.json["rev"]?.stringValue)
        let doc = try await api.call("GET", "/docs/orders/1?conflicts=true")
        #expect(doc.status == 200)
        #expect(doc.json["qty"] == 3 && doc.json["_rev"]?.stringValue == rev2 && doc.json["_conflicts"] == .array([]))
        #expect(try await api.call("GET", "/docs/nope").status == 404)
        #expect(try await api.call("GET", "/docs/nope").json["error"] == "not_found")
        #expect(try await api.call("DELETE", "/docs/orders/1").status == 400)
        #expect(try await api.call("DELETE", "/docs/orders/1?rev=\(rev1)").status == 409)
        #expect(try await api.call("DELETE", "/docs/missing?rev=\(rev1)").status == 404)
        try await api.call("PUT", "/docs/a", body: "{}")
        try await api.call("PUT", "/docs/b", body: "{}")
        let page1 = try await api.get("/docs?limit=1")
        #expect(page1["rows"]?.arrayCount == 1 && page1["next"] == "a")
        let page2 = try await api.get("/docs?limit=5&after=a")
        #expect(page2["rows"]?.arrayCount == 2 && page2["next"] == .null)
        #expect(try await api.call("GET", "/docs?limit=0").status == 400)
        let deleted = try await api.call("DELETE", "/docs/orders/1?rev=\(rev2)")
        #expect(deleted.status == 200)

        // Changes, normal and long-poll.
        let changes = try await api.get("/changes?since=0")
        #expect(changes["results"]?.arrayCount == 3)
        let last = try #require(changes["last_seq"]?.intValue)
        let timedOut = try await api.get("/changes?since=\(last)&feed=longpoll&timeout=200")
        #expect(timedOut["results"]?.arrayCount == 0 && timedOut["last_seq"]?.intValue == last)
        async let waiting = api.get("/changes?since=\(last)&feed=longpoll&timeout=20000")
        try await waitUntil("the long poll is waiting") { true }
        try await api.call("PUT", "/docs/c", body: "{}")
        let woke = try await waiting
        #expect(woke["results"]?.arrayCount == 1)
        #expect(try await api.call("GET", "/changes?feed=continuous").status == 400)

        // Peers, replications, trust.
        #expect(try await api.get("/peers")["peers"] == .array([]))
        #expect(try await api.call("POST", "/replications", body: "{").status == 400)
        #expect(try await api.call("POST", "/replications", body: #"{"url":"ftp://x"}"#).status == 400)
        let peerID = String(repeating: "c", count: 64)
        let repl = try await api.call(
            "POST", "/replications", body: #"{"id":"r1","url":"wss://127.0.0.1:1/ferry/sync","peer":"\#(peerID)","continuous":false}"#)
        #expect(repl.status == 201)
        try await waitUntil("the replication is listed") { try await api.get("/replications")["replications"]?.arrayCount == 1 }
        #expect(try await api.call("DELETE", "/replications/r1").status == 200)
        #expect(try await api.call("DELETE", "/replications/r1").status == 404)
        #expect(try await api.call("POST", "/trust", body: #"{"id":"short"}"#).status == 400)
        #expect(try await api.call("POST", "/trust", body: #"{"id":"\#(peerID)","policy":{"write":"none"}}"#).status == 201)
        #expect(try await api.get("/trust")["trusted"]?.arrayCount == 1)
        #expect(try await api.call("DELETE", "/trust/\(peerID)").status == 200)
        #expect(try await api.call("DELETE", "/trust/\(peerID)").status == 404)

        // Metrics and unknown routes.
        let metrics = try await api.call("GET", "/metrics")
        #expect(metrics.status == 200)
        for name in ["ferry_documents ", "ferry_store_size_bytes", "ferry_connected_peers", "ferry_last_sequence"] {
            #expect(metrics.text.contains(name), "metrics lack \(name)")
        }
        let unknown = try await api.call("GET", "/nope")
        #expect(unknown.status == 404)
        #expect(unknown.json["error"] == "not_found")
        #expect(await node.stop() == 0)
        #expect(node.logText.contains("Fatal error") == false)
    }

    @Test func cliWritesGoThroughTheRunningNode() async throws {
        let node = ServeProcess()
        let info = try await node.start()
        let put = try await node.cli.run(["put", "via-cli", #"{"v":1}"#, "--json"])
        #expect(put.status == 0, "\(put.stderr)")
        let rev = try #require(try put.json()["rev"]?.stringValue)
        // The node's changes feed saw it at once: the write went through its API.
        let changes = try await AdminClient(nodeFile: info).get("/changes?since=0")
        #expect(changes["results"]?.arrayCount == 1)
        #expect(try await node.cli.run(["put", "via-cli", #"{"v":2}"#]).status == 4)  // conflict
        #expect(try await node.cli.run(["get", "missing"]).status == 3)
        #expect(try await node.cli.run(["rm", "via-cli", "--rev", rev]).status == 0)
        let status = try await node.cli.run(["status", "--json"])
        #expect(status.status == 0)
        #expect(try status.json()["node"]?["id"] == info["id"])
        #expect(try await node.cli.run(["peers"]).status == 0)
        #expect(await node.stop() == 0)
        // With no node running, status says how to start one.
        let offline = try await node.cli.run(["status"])
        #expect(offline.status == 1 && offline.stderr.contains("no ferry serve is running"))
    }

    @Test func adminAPIIsNotReachableOnNonLoopbackAddresses() async throws {
        let node = ServeProcess()
        let info = try await node.start()
        let adminPort = try #require(info["adminPort"]?.intValue)
        let addresses = localIPv4Addresses().filter { !$0.hasPrefix("127.") }
        #expect(!addresses.isEmpty, "this machine has no non-loopback IPv4 address to try")
        for address in addresses {
            #expect(!tcpConnects(address, Int(adminPort)), "admin API answered on \(address)")
        }
        #expect(tcpConnects("127.0.0.1", Int(adminPort)))
        #expect(await node.stop() == 0)
    }

    @Test func badConfigIsRefusedWithFileKeyAndReasonAndNothingStarts() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let path = NSTemporaryDirectory() + "ferry-config-\(UUID().uuidString).json"
        defer { try? FileManager.default.removeItem(atPath: path) }
        try #"{"listen":{"port":"eighty"}}"#.write(toFile: path, atomically: true, encoding: .utf8)
        let r = try await cli.run(["serve", "--config", path, "--admin-port", "0", "--couch-port", "0"])
        #expect(r.status == 1)
        #expect(r.stderr.contains(path) && r.stderr.contains("listen.port") && r.stderr.contains("must be an integer"))
        #expect(!FileManager.default.fileExists(atPath: cli.dataDirectory + "/node.json"))
        try #"{"peers":[{"url":"wss://h:1/ferry/sync"}]}"#.write(toFile: path, atomically: true, encoding: .utf8)
        let missing = try await cli.run(["serve", "--config", path])
        #expect(missing.status == 1 && missing.stderr.contains("peers[0].id"))
        let absent = try await cli.run(["serve", "--config", path + ".absent"])
        #expect(absent.status == 1 && absent.stderr.contains("cannot read"))
    }

    @Test func sigtermStopsWithinFiveSecondsAndExitsZeroWhileReplicating() async throws {
        let node = ServeProcess()
        let peer = ServeProcess()
        // (The DNS-SD teardown is timed in DiscoveryTests, which owns the avahi-daemon.)
        let extra: [String] = []
        let infoPeer = try await peer.start(["--trust", node.id])
        let url = try #require(infoPeer["url"]?.stringValue)
        let info = try await node.start(extra + ["--peer", "\(url)#\(await peer.id)"])
        // A live continuous replication (a long-poll in flight) must not delay the stop.
        try await waitUntil("the link is up") {
            try await AdminClient(nodeFile: info).get("/peers")["peers"]?.first?["replication"]?["activity"] == "idle"
        }
        let started = Date()
        #expect(await node.stop() == 0)
        #expect(Date().timeIntervalSince(started) < 5, "SIGTERM took \(Date().timeIntervalSince(started)) s")
        #expect(await peer.stop() == 0)
    }
}

/// Persistent replications and per-peer policy between real processes.
@Suite(.serialized, .timeLimit(.minutes(10))) struct NodeReplicationTests {
    @Test func aPersistentReplicationSurvivesARestart() async throws {
        let a = ServeProcess()
        let b = ServeProcess()
        let idA = await a.id
        let infoB = try await b.start(["--trust", idA])
        let infoA = try await a.start()
        let apiA = AdminClient(nodeFile: infoA)
        let apiB = AdminClient(nodeFile: infoB)
        let urlB = try #require(infoB["url"]?.stringValue)
        let idB = try #require(infoB["id"]?.stringValue)
        let created = try await apiA.call("POST", "/replications", body: #"{"id":"to-b","url":"\#(urlB)","peer":"\#(idB)"}"#)
        #expect(created.status == 201, "\(created.text)")
        try await apiA.call("PUT", "/docs/before-restart", body: "{}")
        try await waitUntil("B has before-restart") { try await apiB.call("GET", "/docs/before-restart").status == 200 }
        #expect(await a.stop() == 0)
        let again = try await a.start()
        let apiA2 = AdminClient(nodeFile: again)
        let listed = try await apiA2.get("/replications")
        #expect(listed["replications"]?.arrayCount == 1)
        #expect(listed["replications"]?.first?["id"] == "to-b" && listed["replications"]?.first?["source"] == "api")
        try await apiA2.call("PUT", "/docs/after-restart", body: "{}")
        try await waitUntil("B has after-restart") { try await apiB.call("GET", "/docs/after-restart").status == 200 }
        try await waitUntil("A and B converge") {
            let (da, db) = (try await apiA2.digest, try await apiB.digest)
            return da == db
        }
        #expect(await a.stop() == 0)
        #expect(await b.stop() == 0)
    }

    @Test func forbiddenWritesOfARestrictedPeerAreRejectedCountedAndShown() async throws {
        let a = ServeProcess()
        let b = ServeProcess()
        let idA = await a.id
        // B lets A write public/* only, and no deletions.
        let trust = try await b.cli.run(["trust", "add", idA, "--name", "tablet", "--write", "public/*", "--no-delete"])
        #expect(trust.status == 0, "\(trust.stderr)")
        let infoB = try await b.start()
        let urlB = try #require(infoB["url"]?.stringValue)
        let idB = try #require(infoB["id"]?.stringValue)
        try await a.cli.run(["put", "public/1", #"{"v":1}"#])
        try await a.cli.run(["put", "private/1", #"{"v":1}"#])
        let infoA = try await a.start(["--peer", "\(urlB)#\(idB)"])
        let apiA = AdminClient(nodeFile: infoA)
        let apiB = AdminClient(nodeFile: infoB)
        try await waitUntil("B has public/1") { try await apiB.call("GET", "/docs/public/1").status == 200 }
        try await waitUntil("A's replication shows the rejection") {
            let peers = try await apiA.get("/peers")["peers"]
            return (peers?.first?["replication"]?["rejected"]?.intValue ?? 0) >= 1
        }
        #expect(try await apiB.call("GET", "/docs/private/1").status == 404)
        let metrics = try await apiB.call("GET", "/metrics").text
        let rejectedLine = metrics.split(separator: "\n").first {
            $0.hasPrefix("ferry_documents_rejected_total{") && $0.contains(#"reason="policy""#) && $0.contains(#"direction="push""#)
                && !$0.hasSuffix(" 0")
        }
        #expect(rejectedLine != nil, "\(metrics)")
        let aMetrics = try await apiA.call("GET", "/metrics").text
        #expect(aMetrics.split(separator: "\n").contains { $0.hasPrefix("ferry_documents_rejected_total{") && !$0.hasSuffix(" 0") })
        // Allowed documents still flow after the rejection.
        try await apiA.call("PUT", "/docs/public/2", body: "{}")
        try await waitUntil("B has public/2") { try await apiB.call("GET", "/docs/public/2").status == 200 }
        #expect(await a.stop() == 0)
        #expect(await b.stop() == 0)
    }
}

/// DNS-SD discovery against the test run's own avahi-daemon, in its private network namespace
/// (LoopbackAvahi): nodes reach it through its bus socket and dial each other on this
/// machine's loopback; avahi-browse and python-zeroconf run inside the namespace.
@Suite(.serialized, .timeLimit(.minutes(10))) struct DiscoveryTests {
    /// Runs `body` with the test run's avahi-daemon (alone with it when `exclusive`); a
    /// daemon that cannot start is a failure.
    func withAvahi(exclusive: Bool = false, _ body: @Sendable () async throws -> Void) async throws {
        try await LoopbackAvahi.withDaemon(exclusive: exclusive) { why in
            if let why {
                Issue.record("the test run's avahi-daemon did not start: \(why)")
                return
            }
            try await body()
        }
    }

    /// avahi-browse inside the namespace: every resolved `_ferry._tcp` service.
    func browse() async -> String {
        await shell(LoopbackAvahi.inside(["avahi-browse", "-rpt", "_ferry._tcp"]).joined(separator: " "), timeout: 10).output
    }

    @Test(.enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
    func trustingNodesWithoutPeersFindEachOtherAndAnUntrustedOneIsOnlyListed() async throws {
        try await withAvahi {
            let group = "t\(UInt32.random(in: 0...UInt32.max))"
            let a = ServeProcess()
            let b = ServeProcess()
            let c = ServeProcess()
            let (idA, idB, idC) = (await a.id, await b.id, await c.id)
            try await a.cli.run(["put", "from-a", "{}"])
            try await b.cli.run(["put", "from-b", "{}"])
            try await c.cli.run(["put", "from-c", "{}"])
            let apiA = AdminClient(nodeFile: try await a.start(["--discovery", "--group", group, "--name", "a", "--trust", idB]))
            let apiB = AdminClient(nodeFile: try await b.start(["--discovery", "--group", group, "--name", "b", "--trust", idA]))
            let apiC = AdminClient(nodeFile: try await c.start(["--discovery", "--group", group, "--name", "c", "--trust", idA, "--trust", idB]))
            try await waitUntil("A and B converge over discovered links") {
                let ab = try await apiA.call("GET", "/docs/from-b").status
                let ba = try await apiB.call("GET", "/docs/from-a").status
                return ab == 200 && ba == 200
            }
            try await waitUntil("A and B hold the same digest") {
                let (da, db) = (try await apiA.digest, try await apiB.digest)
                return da == db
            }
            try await waitUntil("A lists C as an untrusted dns-sd peer") {
                let peers = try await apiA.get("/peers")["peers"]
                guard case .array(let list)? = peers else { return false }
                return list.contains { $0["id"]?.stringValue == idC && $0["trusted"] == false && $0["source"] == "dns-sd" }
            }
            let peersA = try await apiA.get("/peers")["peers"]
            if case .array(let list)? = peersA {
                let b = list.first { $0["id"]?.stringValue == idB }
                #expect(b?["trusted"] == true && b?["source"] == "dns-sd" && b?["connected"] == true)
                #expect(b?["addresses"]?.arrayCount ?? 0 >= 1)
            }
            // C trusts A and B, but they do not trust C: nothing moves either way.
            #expect(try await apiA.call("GET", "/docs/from-c").status == 404)
            #expect(try await apiB.call("GET", "/docs/from-c").status == 404)
            #expect(try await apiC.call("GET", "/docs/from-a").status == 404)
            #expect(try await apiC.call("GET", "/docs/from-b").status == 404)
            // Exactly one of A and B dialled the other: the lower node ID.
            let dialledByA = try await apiA.get("/peers")["peers"]?.first { $0["id"]?.stringValue == idB }?["dialled"]
            let dialledByB = try await apiB.get("/peers")["peers"]?.first { $0["id"]?.stringValue == idA }?["dialled"]
            #expect(dialledByA == .bool(idA < idB))
            #expect(dialledByB == .bool(idB < idA))
            #expect(await a.stop() == 0)
            #expect(await b.stop() == 0)
            #expect(await c.stop() == 0)
        }
    }

    @Test(.enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
    func avahiBrowseAndPythonZeroconfSeeTheNodeIDInTXT() async throws {
        try await withAvahi {
            let node = ServeProcess()
            let info = try await node.start(["--discovery", "--name", "txt-check"])
            let id = try #require(info["id"]?.stringValue)
            var seen = ""
            _ = await eventually(15, every: .zero) {
                seen = await browse()
                return seen.contains("id=\(id)")
            }
            #expect(seen.contains("\"id=\(id)\""), "avahi-browse saw: \(seen)")
            #expect(seen.contains("\"proto=1\"") && seen.contains("\"group=ferry\""))
            let zc = await shell(LoopbackAvahi.inside(["python3", "\(scriptsDirectory)/zeroconf-browse.py", id, "15"]).joined(separator: " "))
            #expect(zc.status == 0, "python-zeroconf saw: \(zc.output)")
            #expect(await node.stop() == 0)
        }
    }

    @Test(.enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
    func aNodeRegistersAgainWhenAvahiDaemonRestarts() async throws {
        try await withAvahi(exclusive: true) {
            let config = NSTemporaryDirectory() + "ferry-retry-\(UUID().uuidString).json"
            defer { try? FileManager.default.removeItem(atPath: config) }
            try #"{"discovery":{"enabled":true,"retrySeconds":1}}"#.write(toFile: config, atomically: true, encoding: .utf8)
            let node = ServeProcess()
            let info = try await node.start(["--discovery", "--config", config, "--name", "restart-\(getpid())"])
            let id = try #require(info["id"]?.stringValue)
            func advertised() async -> Bool { await browse().contains("id=\(id)") }
            try await waitUntil("the node is advertised") { await advertised() }
            #expect(await LoopbackAvahi.stopDaemon() == nil)
            #expect(await LoopbackAvahi.startDaemon() == nil)
            // A new daemon knows nothing of the old registrations: seeing the service again
            // means the node noticed and registered again by itself.
            try await waitUntil("the node is advertised again", timeout: 60) { await advertised() }
            #expect(node.logText.contains("registering again"))
            // SIGTERM with DNS-SD registered and browsing still stops within 5 s.
            let started = Date()
            #expect(await node.stop() == 0)
            #expect(Date().timeIntervalSince(started) < 5)
        }
    }

    @Test func withoutAvahiTheNodeWarnsOnceAndSyncsWithStaticPeers() async throws {
        // No D-Bus system bus at this address: the compat library cannot reach avahi-daemon.
        let env = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus", "FERRY_LOG_LEVEL": "debug"]
        let config = NSTemporaryDirectory() + "ferry-retry-\(UUID().uuidString).json"
        defer { try? FileManager.default.removeItem(atPath: config) }
        try #"{"discovery":{"enabled":true,"retrySeconds":1}}"#.write(toFile: config, atomically: true, encoding: .utf8)
        let a = ServeProcess()
        let b = ServeProcess()
        let idA = await a.id
        let infoA = try await a.start(["--discovery", "--config", config, "--trust", b.id], environment: env)
        let urlA = try #require(infoA["url"]?.stringValue)
        let infoB = try await b.start(["--discovery", "--config", config, "--peer", "\(urlA)#\(idA)"], environment: env)
        try await b.cli.run(["put", "static-works", "{}"])
        try await waitUntil("A got B's document over the static link") {
            try await AdminClient(nodeFile: infoA).call("GET", "/docs/static-works").status == 200
        }
        try await waitUntil("B retried DNS-SD in the background") { b.logText.contains("DNS-SD still unavailable") }
        let warnings = b.logText.components(separatedBy: "DNS-SD unavailable;").count - 1
        #expect(warnings == 1, "\(b.logText)")
        #expect(!b.logText.contains("*** WARNING *** The program"), "the Avahi compat warning leaked")
        _ = infoB
        #expect(await a.stop() == 0)
        #expect(await b.stop() == 0)
    }
}

extension JSON {
    var arrayCount: Int? {
        if case .array(let a) = self { return a.count }
        return nil
    }

    var first: JSON? {
        if case .array(let a) = self { return a.first }
        return nil
    }

    func first(where predicate: (JSON) -> Bool) -> JSON? {
        if case .array(let a) = self { return a.first(where: predicate) }
        return nil
    }
}

/// IPv4 addresses of this machine's interfaces.
func localIPv4Addresses() -> [String] {
    var out: [String] = []
    var list: UnsafeMutablePointer<ifaddrs>?
    guard getifaddrs(&list) == 0 else { return [] }
    defer { freeifaddrs(list) }
    var p = list
    while let entry = p {
        if let addr = entry.pointee.ifa_addr, addr.pointee.sa_family == sa_family_t(AF_INET) {
            var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            if getnameinfo(addr, socklen_t(MemoryLayout<sockaddr_in>.size), &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0 {
                out.append(String(cString: host))
            }
        }
        p = entry.pointee.ifa_next
    }
    return out
}

/// Whether a TCP connection to address:port succeeds.
func tcpConnects(_ address: String, _ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var sin = sockaddr_in()
    sin.sin_family = sa_family_t(AF_INET)
    sin.sin_port = in_port_t(UInt16(port).bigEndian)
    inet_pton(AF_INET, address, &sin.sin_addr)
    return withUnsafePointer(to: &sin) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}
