import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import Testing
@testable import FerrySync

/// A seeded simulation of joins: members holding random, partly overlapping documents (and
/// partly recorded coverage of each other), a new node that joins every member at once,
/// dialling some and dialled by others, while members keep writing and one join link may
/// fail half-way. After healing, every node must hold the same documents with the same
/// current revisions and conflicts, and the joiner's catch-up lease must be free.
///
/// `FERRY_SIM_SEEDS=N` runs N seeds (default 20); `FERRY_SIM_SEED=S` replays one seed.
@Suite(.timeLimit(.minutes(10))) struct JoinSimulationTests {
    @Test func seededJoinsWhileMembersWriteConvergeAfterHealing() async throws {
        let env = ProcessInfo.processInfo.environment
        let seeds: [UInt64]
        if let one = env["FERRY_SIM_SEED"].flatMap(UInt64.init) {
            seeds = [one]
        } else {
            let count = env["FERRY_SIM_SEEDS"].flatMap(Int.init) ?? 20
            seeds = (1...UInt64(max(1, count))).map { $0 }
        }
        var failures = 0
        for seed in seeds {
            do {
                try await JoinSimulation(seed: seed).run()
            } catch {
                failures += 1
                Issue.record("join simulation seed \(seed) failed: \(error)\nreplay: FERRY_SIM_SEED=\(seed) swift test --filter JoinSimulationTests")
                if failures >= 3 { break }
            }
        }
    }
}

/// One seeded join.
final class JoinSimulation: @unchecked Sendable {
    /// One member write, drawn before the join starts so the data depend on the seed only.
    struct Write: Sendable {
        let node: Int
        let doc: Int
        let delete: Bool
        let body: JSON
    }

    let seed: UInt64
    var rng: SeededGenerator
    let members: [JoinNode]
    let joiner: JoinNode
    let docCount = 60

    init(seed: UInt64) throws {
        self.seed = seed
        rng = SeededGenerator(seed: seed)
        var r = SeededGenerator(seed: seed)
        let memberCount = 3 + Int.random(in: 0..<3, using: &r)
        members = try (0..<memberCount).map { try JoinNode("m\($0)") }
        joiner = try JoinNode("joiner")
    }

    func random(_ n: Int) -> Int { Int.random(in: 0..<n, using: &rng) }

    func run() async throws {
        // Random documents on each member, partly the same IDs (so some conflict).
        for i in members.indices {
            for _ in 0..<(5 + random(30)) { try apply(Write(node: i, doc: random(docCount), delete: false, body: body("seed"))) }
        }
        // Partial overlap: some members replicate with some others, in some directions.
        for _ in 0..<(members.count + random(members.count * 2)) {
            let a = random(members.count)
            let b = (a + 1 + random(members.count - 1)) % members.count
            await members[a].sync(with: members[b], direction: [.push, .pull, .pushAndPull][random(3)])
            if random(3) == 0 { try apply(Write(node: a, doc: random(docCount), delete: random(4) == 0, body: body("between"))) }
        }
        // The join: every member at once, each link dialled by one side, while members write.
        var links: [Replicator] = []
        let failing = random(2) == 0 ? random(members.count) : -1
        for (i, m) in members.enumerated() {
            let faults: (@Sendable (Int) -> (client: InMemoryEndpoint.Faults, server: InMemoryEndpoint.Faults))?
            if i == failing {
                let after = 3 + random(12)
                faults = { attempt in (attempt == 1 ? .init(failAfterMessages: after) : .init(), .init()) }
            } else {
                faults = nil
            }
            let batch = 1 + random(40)
            if random(2) == 0 {
                links.append(joiner.replicator(to: m, faults: faults) { $0.batchSize = batch })
            } else {
                links.append(m.replicator(to: joiner, faults: faults) { $0.batchSize = batch })
            }
        }
        let writes = (0..<(10 + random(30))).map { _ in
            Write(node: random(members.count), doc: random(docCount), delete: random(5) == 0, body: body("during"))
        }
        await withTaskGroup(of: Void.self) { group in
            for link in links { group.addTask { await link.run() } }
            group.addTask {
                for w in writes {
                    try? self.apply(w)
                    await Task.yield()
                }
            }
        }
        if joiner.gate.snapshot.holder != nil || joiner.gate.snapshot.waiting != 0 {
            throw SimulationFailure(description: "the joiner's catch-up lease is still taken after every link ended")
        }
        try await healAndCheck()
    }

    func body(_ tag: String) -> JSON {
        ["tag": .string(tag), "n": .int(Int64(random(1000))), "f\(random(4))": .string("v\(random(3))")]
    }

    func apply(_ w: Write) throws {
        let store = members[w.node].store
        let id = docID("doc-\(w.doc)")
        if let doc = try store.document(id), !doc.deleted {
            if w.delete {
                _ = try? store.delete(id, revision: doc.revision, keepProperties: false)
            } else {
                _ = try? store.put(id, body: w.body, parent: doc.revision)
            }
        } else if !w.delete {
            _ = try? store.put(id, body: w.body)
        }
    }

    func healAndCheck() async throws {
        let all = members + [joiner]
        var quietRounds = 0
        for _ in 0..<20 {
            var moved = 0
            for i in all.indices {
                let r = await all[i].sync(with: all[(i + 1) % all.count])
                moved += r.summary.pushed + r.summary.pulled
            }
            quietRounds = moved == 0 ? quietRounds + 1 : 0
            if quietRounds >= 2 { break }
        }
        let reference = try digest(joiner.store)
        for m in members {
            let d = try digest(m.store)
            if d != reference {
                let diff = Set(d).symmetricDifference(reference).sorted().prefix(6)
                throw SimulationFailure(description: "\(m.name) differs from the joiner after healing: \(Array(diff))")
            }
        }
    }
}
