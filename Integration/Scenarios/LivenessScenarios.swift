import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Dead links: a peer that stops answering (SIGSTOP: its sockets stay open, nothing is
/// closed) is declared dead by heartbeats on both of its links, shown offline in `/peers`
/// and logged once; once it runs again, the links come back and it catches up.
@Suite(.serialized, .timeLimit(.minutes(5))) struct LivenessScenarios {
    /// Whether `observer` lists `peer` as connected (nil when it does not list it).
    func connected(_ observer: Node, _ peer: String) async throws -> Bool? {
        let list = try await observer.admin.get("/peers")["peers"]?.items ?? []
        return list.first { $0["id"]?.stringValue == peer }?["connected"]?.boolValue
    }

    func silentLines(_ node: Node) -> Int {
        node.log.split(separator: "\n").filter { $0.contains("peer went silent; link closed") }.count
    }

    @Test func aStoppedPeerIsDeclaredDeadOnBothLinksAndCatchesUpWhenItRunsAgain() async throws {
        let cluster = Cluster("liveness")
        defer { cluster.cleanUp() }
        let nodes = ["a", "b", "c"].map { cluster.add($0) }
        let ids = try await cluster.ids(nodes)
        // Each pair has one link: node i dials every node after it, so c is dialled by both.
        for (i, node) in nodes.enumerated().reversed() {
            var args: [String] = []
            for (j, id) in ids.enumerated() where j != i { args += ["--trust", id] }
            for j in (i + 1)..<nodes.count { args += ["--peer", "\(nodes[j].url)#\(ids[j])"] }
            try await node.start(args)
        }
        let (a, b, c) = (nodes[0], nodes[1], nodes[2])
        try await waitUntil("the mesh is up", timeout: 60) {
            for (observer, peer) in [(a, ids[1]), (a, ids[2]), (b, ids[2]), (c, ids[0]), (c, ids[1])] {
                guard try await connected(observer, peer) == true else { return false }
            }
            return true
        }
        _ = try await a.admin.call("PUT", "/docs/before", body: #"{"n":1}"#)
        try await cluster.awaitConvergence(timeout: 60)
        #expect(silentLines(a) == 0 && silentLines(b) == 0)

        let pid = try #require(c.pid)
        kill(pid, SIGSTOP)
        let stopped = ContinuousClock.now
        var resumed = false
        defer { if !resumed { kill(pid, SIGCONT) } }
        try await waitUntil("a and b show c offline", timeout: 15, every: .milliseconds(100)) {
            let aSees = try await connected(a, ids[2])
            let bSees = try await connected(b, ids[2])
            return aSees == false && bSees == false
        }
        let detection = stopped.duration(to: .now)
        // The link between a and b is untouched.
        #expect(try await connected(a, ids[1]) == true)
        _ = try await a.admin.call("PUT", "/docs/during", body: #"{"n":2}"#)

        kill(pid, SIGCONT)
        resumed = true
        let continued = ContinuousClock.now
        try await waitUntil("c back on both links", timeout: 30, every: .milliseconds(100)) {
            let aSees = try await connected(a, ids[2])
            let bSees = try await connected(b, ids[2])
            return aSees == true && bSees == true
        }
        try await waitUntil("c has the write made while it was stopped", timeout: 30, every: .milliseconds(100)) {
            try await c.admin.call("GET", "/docs/during").status == 200
        }
        let healed = continued.duration(to: .now)
        try await cluster.awaitConvergence(timeout: 60)
        print("liveness: stopped peer shown offline after \(detection); back and converged \(healed) after SIGCONT")
        // However many redials failed meanwhile, each side logged the dead link once.
        #expect(silentLines(a) == 1, "a logged \(silentLines(a)) silent-peer lines:\n\(a.logTail())")
        #expect(silentLines(b) == 1, "b logged \(silentLines(b)) silent-peer lines:\n\(b.logTail())")
        let cLines = silentLines(c)

        // Now the dialler falls silent: b and c only know a through its connections to them
        // (inbound), and still list it, offline, with why.
        let pidA = try #require(a.pid)
        kill(pidA, SIGSTOP)
        var resumedA = false
        defer { if !resumedA { kill(pidA, SIGCONT) } }
        try await waitUntil("b and c show a offline", timeout: 15, every: .milliseconds(100)) {
            let bSees = try await connected(b, ids[0])
            let cSees = try await connected(c, ids[0])
            return bSees == false && cSees == false
        }
        let entry = try await b.admin.get("/peers")["peers"]?.items.first { $0["id"]?.stringValue == ids[0] }
        #expect(entry?["replication"]?["errorCode"]?.stringValue == "peer_silent", "b lists a as \(String(describing: entry))")
        _ = try await b.admin.call("PUT", "/docs/while-a-stopped", body: #"{"n":3}"#)
        kill(pidA, SIGCONT)
        resumedA = true
        try await waitUntil("a back and caught up", timeout: 30, every: .milliseconds(100)) {
            try await a.admin.call("GET", "/docs/while-a-stopped").status == 200
        }
        try await cluster.awaitConvergence(timeout: 60)
        // The responders noticed too, once each (a's own lines on waking are not counted).
        #expect(silentLines(b) == 2, "b logged \(silentLines(b)) silent-peer lines:\n\(b.logTail())")
        #expect(silentLines(c) == cLines + 1, "c logged \(silentLines(c) - cLines) silent-peer lines for a")
        await finish(cluster, allowing: expectedRefusals)
    }
}
