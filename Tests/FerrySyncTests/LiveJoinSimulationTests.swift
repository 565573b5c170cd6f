import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// A seeded simulation of what a live group meets: a full mesh of members with catch-up
/// gates and relay suppression takes writes while a new node joins, its links coming up one
/// at a time at random moments of the writes, dialling or dialled. Coverage is checked
/// throughout (every third write, and while the joiner's links come up), not only at the
/// end: no node may cover a feed past a revision it lacks.
/// Anti-entropy is off, so convergence proves the shortcuts (relays, coverage, catch-up)
/// right on their own.
///
/// `FERRY_JOIN_SIM_SEEDS=N` runs N seeds (default 30; `make soak` runs 1,000);
/// `FERRY_SIM_SEED=S` replays one, `FERRY_SIM_TRACE=1` prints its phases' times.
@Suite(.timeLimit(.minutes(liveJoinSimulationMinutes))) struct LiveJoinSimulationTests {
    @Test func seededJoinsDuringLiveWritesConvergeAndCoverageNeverClaimsAMissingRevision() async throws {
        let seeds = simulationSeeds(count: "FERRY_JOIN_SIM_SEEDS", default: 30)
        await runSeeds(seeds, name: "live join simulation", filter: "LiveJoinSimulationTests") { seed in
            try await LiveJoinSimulation(seed: seed).run()
        }
    }
}

/// One seeded run of the live join simulation.
final class LiveJoinSimulation: @unchecked Sendable {
    let seed: UInt64
    var rng: SeededGenerator

    init(seed: UInt64) {
        self.seed = seed
        rng = SeededGenerator(seed: seed)
    }

    func random(_ n: Int) -> Int { Int.random(in: 0..<n, using: &rng) }

    func run() async throws {
        let members = 3 + random(2)
        let k = members + 1
        let net = try MeshNetwork(count: k, gated: true)
        defer { Task { await net.stopAll() } }
        // The joiner is the first node (it dials every member) or the last (every member dials it).
        let joiner = random(2) == 0 ? 0 : k - 1
        let memberIndexes = (0..<k).filter { $0 != joiner }
        for (n, i) in memberIndexes.enumerated() { for j in memberIndexes[(n + 1)...] { net.connect(i, j) } }
        let t0 = ContinuousClock.now
        try await net.viewsSettled()
        if ProcessInfo.processInfo.environment["FERRY_SIM_TRACE"] != nil { print("settled \(ContinuousClock.now - t0)") }
        // Some documents before the writes, held by every member.
        for d in 0..<(5 + random(20)) { _ = try net.nodes[memberIndexes[random(members)]].store.put(docID("pre-\(d)"), body: ["d": .int(Int64(d))]) }
        var pending = memberIndexes.shuffled(using: &rng)
        let writes = 30 + random(40)
        let joinFrom = random(writes / 2)
        for w in 0..<writes {
            let store = net.nodes[memberIndexes[random(members)]].store
            let id = docID("d-\(random(writes))")
            let body: JSON = ["w": .int(Int64(w)), "seed": .int(Int64(seed))]
            if let doc = try store.document(id), !doc.deleted {
                _ = try? store.put(id, body: body, parent: doc.revision)
            } else if try store.document(id) == nil {
                _ = try? store.put(id, body: body)
            }
            if w >= joinFrom, !pending.isEmpty, random(3) == 0 { net.connect(pending.removeFirst(), joiner) }
            for _ in 0..<random(30) { await Task.yield() }
            if random(4) == 0 { try await Task.sleep(for: .milliseconds(random(5))) }
            // Every third step: each check reads every covered feed whole.
            if w % 3 == 0 { try checkCoverage(net) }
        }
        if ProcessInfo.processInfo.environment["FERRY_SIM_TRACE"] != nil { print("writes done \(ContinuousClock.now - t0)") }
        for i in pending { net.connect(i, joiner) }
        for _ in 0..<4 {
            try checkCoverage(net)
            try await Task.sleep(for: .milliseconds(10))
        }
        do {
            try await net.converged(timeout: 30)
        } catch {
            var report = "joiner \(joiner), links \(net.linked.map { "\($0.low)-\($0.high)" }.sorted())"
            for (i, node) in net.nodes.enumerated() {
                report += "\nnode \(i): \(try node.store.info().documentCount) documents, coverage \(try Coverage.all(in: node.store).count) entries"
            }
            throw SimulationFailure(description: "\(error)\n\(report)")
        }
        try checkCoverage(net)
        if ProcessInfo.processInfo.environment["FERRY_SIM_TRACE"] != nil { print("converged \(ContinuousClock.now - t0)") }
        await net.stopAll()
        if ProcessInfo.processInfo.environment["FERRY_SIM_TRACE"] != nil { print("stopped \(ContinuousClock.now - t0)") }
    }

    /// The invariant: for every node and every feed it covers through N, it holds every leaf
    /// of every entry of that feed at or below N. (Read in this order, every step only grows:
    /// coverage, then the feed's stable prefix, then the node's store.)
    func checkCoverage(_ net: MeshNetwork) throws {
        for (i, node) in net.nodes.enumerated() {
            for (database, covered) in try Coverage.all(in: node.store) {
                guard let owner = net.nodes.first(where: { $0.store.uuid == database }) else { continue }
                var asked: [DocumentID: [RevisionID]] = [:]
                var since: UInt64 = 0
                scan: while true {
                    let page = try owner.store.changesWithLeaves(since: since, limit: 500)
                    guard let last = page.last else { break }
                    for (change, leaves) in page {
                        if change.sequence > covered { break scan }
                        asked[change.id] = leaves
                    }
                    since = last.0.sequence
                }
                let missing = try node.store.revsDiff(asked)
                if let (id, entry) = missing.first {
                    throw SimulationFailure(
                        description: "node \(i) covers \(owner.id)'s feed through \(covered) but lacks \(id) \(entry.missing.map(\.description))")
                }
            }
        }
    }
}

/// The time limit: 10 minutes, or a minute per 40 seeds for more (`make soak`'s 1,000 seeds
/// take about 12 minutes on an idle 2-core machine, and hit a fixed 10-minute limit at seed 845).
let liveJoinSimulationMinutes = max(10, (ProcessInfo.processInfo.environment["FERRY_JOIN_SIM_SEEDS"].flatMap(Int.init) ?? 0) / 40)
