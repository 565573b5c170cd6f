import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Scenario 32: five `ferry serve` nodes that find each other over DNS-SD (the test run's
/// own avahi-daemon) take random writes, updates, deletes and blobs on every node while
/// nodes are killed with SIGKILL and restarted (on new ports), frozen with SIGSTOP for a few
/// seconds (their peers see a silent link, as across a cut cable), and avahi-daemon is
/// killed and brought back. After the last fault every node must reach one digest, every
/// acknowledged revision must be in every node's trees, and no node may crash.
/// `FERRY_IT_SOAK_SECONDS` sets the length (60 in `make test`, 3,600 in `make soak`).
@Suite(.serialized, .timeLimit(.minutes(80)), .enabled(if: mustRunEverything, "needs root for its own avahi-daemon"))
struct MeshSoakScenarios {
    static let seconds = ProcessInfo.processInfo.environment["FERRY_IT_SOAK_SECONDS"].flatMap(Int.init) ?? 60
    static let nodeCount = 5

    /// What a node is doing: running, killed until a restart, or frozen until resumed.
    enum State {
        case running
        case killed(until: ContinuousClock.Instant)
        case frozen(until: ContinuousClock.Instant)
    }

    /// Counts of what the soak did, printed at the end.
    struct Figures: CustomStringConvertible {
        var writes = 0, deletes = 0, blobs = 0, refusedWrites = 0, kills = 0, freezes = 0, avahiRestarts = 0
        var description: String {
            "\(writes) writes, \(deletes) deletes, \(blobs) blobs (\(refusedWrites) writes refused by a node going down), "
                + "\(kills) SIGKILLs, \(freezes) SIGSTOPs, \(avahiRestarts) avahi-daemon restarts"
        }
    }

    @Test func aMeshUnderWritesKillsFreezesAndAvahiRestartsConvergesWithNothingLost() async throws {
        try await LoopbackAvahi.withDaemon(exclusive: true) { why in
            if let why {
                Issue.record("the test run's avahi-daemon did not start: \(why)")
                return
            }
            let cluster = Cluster("soak")
            defer { cluster.cleanUp() }
            let config = cluster.root + "/soak.json"
            try #"{"discovery":{"enabled":true,"retrySeconds":1}}"#.write(toFile: config, atomically: true, encoding: .utf8)
            let nodes = (0..<Self.nodeCount).map { cluster.add("n\($0)") }
            let ids = try await cluster.ids(nodes)
            let group = "soak-\(UInt32.random(in: 0...UInt32.max))"
            for (i, node) in nodes.enumerated() {
                let trust = ids.enumerated().filter { $0.offset != i }.flatMap { ["--trust", $0.element] }
                try await node.start(["--discovery", "--config", config, "--group", group] + trust)
            }
            var states = [State](repeating: .running, count: nodes.count)
            var figures = Figures()
            /// Every acknowledged revision, by document.
            var acknowledged: [String: Set<String>] = [:]
            var generator = SystemRandomNumberGenerator()
            let blobFile = cluster.root + "/blob.bin"
            let started = ContinuousClock.now
            let end = started + .seconds(Self.seconds)

            func running() -> [Int] { states.indices.filter { if case .running = states[$0] { true } else { false } } }

            /// Brings back the nodes whose time is up (or all, at the end).
            func wake(all: Bool) async throws {
                let now = ContinuousClock.now
                for i in states.indices {
                    switch states[i] {
                    case .running: continue
                    case .killed(let until) where all || until <= now:
                        try await nodes[i].restart()
                        states[i] = .running
                    case .frozen(let until) where all || until <= now:
                        if let pid = nodes[i].pid { kill(pid, SIGCONT) }
                        states[i] = .running
                    default: continue
                    }
                }
            }

            /// One write (a new document, an update or a delete) through a running node's admin API.
            func write(on i: Int) async {
                let minute = Int((ContinuousClock.now - started).components.seconds / 60)
                let id = "s\(minute)-\(Int.random(in: 0..<100, using: &generator))"
                let admin = nodes[i].admin
                do {
                    let current = try await admin.call("GET", "/docs/\(id)")
                    let rev = current.status == 200 ? current.json["_rev"]?.stringValue : nil
                    if let rev, Int.random(in: 0..<20, using: &generator) == 0 {
                        let deleted = try await admin.call("DELETE", "/docs/\(id)?rev=\(rev)")
                        if deleted.status == 200, let r = deleted.json["rev"]?.stringValue {
                            acknowledged[id, default: []].insert(r)
                            figures.deletes += 1
                        }
                        return
                    }
                    var body = #"{"by":"\#(nodes[i].name)","n":\#(figures.writes)"#
                    if Int.random(in: 0..<50, using: &generator) == 0 {
                        let bytes = (0..<Int.random(in: 1000...300_000, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
                        try Data(bytes).write(to: URL(fileURLWithPath: blobFile))
                        let put = try await Ferry.run(["--data", nodes[i].dataDirectory, "blob", "put", blobFile])
                        guard put.status == 0 else { return }
                        body += #","scan":\#(put.stdout.trimmingCharacters(in: .whitespacesAndNewlines))"#
                        figures.blobs += 1
                    }
                    body += "}"
                    let reply = try await admin.call("PUT", "/docs/\(id)\(rev.map { "?rev=\($0)" } ?? "")", body: body)
                    if reply.status == 201, let r = reply.json["rev"]?.stringValue {
                        acknowledged[id, default: []].insert(r)
                        figures.writes += 1
                    }
                } catch {
                    // The node went down under the request: the write was not acknowledged.
                    figures.refusedWrites += 1
                }
            }

            while ContinuousClock.now < end {
                try await wake(all: false)
                let up = running()
                let dice = Int.random(in: 0..<100, using: &generator)
                if dice < 4, up.count > 3, let i = up.randomElement(using: &generator) {
                    _ = await nodes[i].kill()
                    states[i] = .killed(until: .now + .milliseconds(Int.random(in: 500...3000, using: &generator)))
                    figures.kills += 1
                } else if dice < 7, up.count > 3, let i = up.randomElement(using: &generator), let pid = nodes[i].pid {
                    kill(pid, SIGSTOP)
                    states[i] = .frozen(until: .now + .milliseconds(Int.random(in: 2000...8000, using: &generator)))
                    figures.freezes += 1
                } else if dice < 8 {
                    if let avahi = LoopbackAvahi.recordedPID("avahi") {
                        kill(avahi, Bool.random(using: &generator) ? SIGKILL : SIGTERM)
                        _ = await eventually(10, every: .milliseconds(20)) { LoopbackAvahi.hasExited(avahi) }
                    }
                    if let failed = await LoopbackAvahi.startDaemon() { Issue.record("avahi-daemon did not come back: \(failed)") }
                    figures.avahiRestarts += 1
                } else if let i = up.randomElement(using: &generator) {
                    for _ in 0..<Int.random(in: 1...20, using: &generator) { await write(on: i) }
                }
            }
            try await wake(all: true)
            let faultsEnded = ContinuousClock.now
            try await cluster.awaitConvergence(timeout: 240)
            let converged = ContinuousClock.now - faultsEnded

            // Equal digests mean equal trees: one node's leaves and histories tell for all.
            let db = try await CouchDatabaseClient(nodes[0])
            var missing: [String] = []
            var conflicted = 0
            for (id, revs) in acknowledged {
                let leaves = try await db.leaves(id)
                guard case .object(let byRev) = leaves else { continue }
                if byRev.count > 1 { conflicted += 1 }
                var known = Set<String>()
                for leaf in byRev.values {
                    guard let start = leaf["_revisions"]?["start"]?.intValue, case .array(let hashes)? = leaf["_revisions"]?["ids"] else { continue }
                    for (k, hash) in hashes.enumerated() { if let h = hash.stringValue { known.insert("\(start - Int64(k))-\(h)") } }
                }
                missing += revs.subtracting(known).map { "\(id)@\($0)" }
            }
            print(
                "soak: \(Self.seconds) s, \(Self.nodeCount) nodes: \(figures); \(acknowledged.count) documents, \(conflicted) with conflicts; "
                    + "one digest \(converged) after the last fault")
            #expect(missing.isEmpty, "\(missing.count) acknowledged revisions are missing: \(missing.prefix(10))")
            await finish(
                cluster,
                allowing: expectedRefusals + ["DNS-SD", "connect_failed", "peer_silent", "connection closed", "replication failed"])
        }
    }
}
