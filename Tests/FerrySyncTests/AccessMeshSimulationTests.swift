import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// A seeded simulation of a live mesh under the group's access rules, with relay suppression
/// and anti-entropy on the links both of whose halves follow the rules: a supervisor that
/// reads and writes everything and stations that read and write one ward, or both, by a
/// selector. Links drop and come back while stations admit and edit patients (racing the
/// supervisor's moves: such an edit is refused by every node that holds the move) and the
/// supervisor writes, edits, moves (often out of a ward and back) and deletes them; once
/// every station links to the supervisor, with no session started again, every station
/// holds exactly what its role admits, at the supervisor's revisions.
///
/// `FERRY_ACCESS_MESH_SIM_SEEDS=N` runs N seeds (default 100); `FERRY_SIM_SEED=S` replays one.
@Suite(.timeLimit(.minutes(10))) struct AccessMeshSimulationTests {
    @Test func eachStationOfALiveMeshUnderRulesHoldsExactlyWhatItsRoleAdmits() async throws {
        let seeds = simulationSeeds(count: "FERRY_ACCESS_MESH_SIM_SEEDS", default: 100)
        let skips = Counter()
        await runSeeds(seeds, name: "access mesh simulation", filter: "AccessMeshSimulationTests") { seed in
            let skipped = try await AccessMeshSimulation(seed: seed).run()
            for _ in 0..<skipped { skips.increment() }
        }
        // Relays were skipped on links restricted by the rules (what this simulation is for).
        if seeds.count >= 20 { #expect(skips.current > 0, "no relay was ever skipped") }
        print("access mesh simulation: \(seeds.count) seeds, \(skips.current) relays skipped")
    }
}

/// One seeded run.
final class AccessMeshSimulation: @unchecked Sendable {
    let seed: UInt64
    var rng: SeededGenerator
    let ids = (0..<8).map { docID("patient-\($0)") }
    /// Patients the stations admitted (each station's own, by number).
    var admitted: [DocumentID] = []
    /// Each node's wards; nil for the supervisor (the last node, so that stations dial it).
    let wards: [[String]?]

    init(seed: UInt64) {
        self.seed = seed
        var rng = SeededGenerator(seed: seed)
        let stations = 3 + Int.random(in: 0..<2, using: &rng)
        wards = (0..<stations).map { _ in [["a"], ["b"], ["a", "b"]][Int.random(in: 0..<3, using: &rng)] } + [nil]
        self.rng = rng
    }

    func random(_ n: Int) -> Int { Int.random(in: 0..<n, using: &rng) }

    /// What every node lets `peer` do (one version of the rules everywhere).
    static func policy(wards: [String]?) -> PeerPolicy {
        WardRules.policy(wards: wards, version: "v1", unnarrowed: ProcessInfo.processInfo.environment["FERRY_SIM_NARROWED"] == nil)
    }

    static func storeOptions(wards: [String]?) -> StoreOptions {
        let policy = Self.policy(wards: wards)
        return WardRules.storeOptions { policy }
    }

    /// Runs the seed; returns how many relays were skipped (and still remembered) at the end.
    func run() async throws -> Int {
        let wards = self.wards
        let k = wards.count
        let supervisor = k - 1
        var antiEntropy = AntiEntropy()
        antiEntropy.checkInterval = .milliseconds(50)
        antiEntropy.settle = .milliseconds(200)
        antiEntropy.maxBackoff = .seconds(1)
        let net = try MeshNetwork(
            count: k, policy: { _, peer in Self.policy(wards: wards[peer]) }, storeOptions: { Self.storeOptions(wards: wards[$0]) },
            antiEntropy: antiEntropy)
        defer { Task { await net.stopAll() } }
        for i in 0..<k { for j in (i + 1)..<k where random(3) != 0 { net.connect(i, j) } }
        for _ in 0..<(15 + random(15)) {
            switch random(12) {
            case 0...3: try write(net.nodes[supervisor].store, wards: ["a", "b"])
            case 4, 5:
                let n = random(k - 1)
                try admit(net.nodes[n].store, station: n, wards: wards[n] ?? [])
            case 6:
                let n = random(k - 1)
                try edit(net.nodes[n].store, wards: wards[n] ?? [])
            case 7: try delete(net.nodes[supervisor].store)
            case 8:
                if let pair = net.linked.randomElement(using: &rng) { await net.disconnect(pair.low, pair.high) }
            case 9:
                let a = random(k)
                net.connect(a, (a + 1 + random(k - 1)) % k)
            default:
                for _ in 0..<random(20) { await Task.yield() }
            }
        }
        // Heal: every station linked to the supervisor, besides what is left of the mesh. No
        // link starts again: a stale copy that a lagging station hands another after its
        // check, or an edit refused on one link and relayed on another, is found by the links'
        // digests over what both ends may read.
        for i in 0..<supervisor { net.connect(i, supervisor) }
        do {
            try await waitUntil("every station holds what its role admits", timeout: 30, every: .milliseconds(5)) {
                try self.mismatch(net) == nil
            }
        } catch {
            let report = (try? mismatch(net)) ?? "matched at the last look"
            throw SimulationFailure(
                description: "wards \(wards.map { $0?.joined() ?? "*" }), links \(net.linked.map { "\($0.low)-\($0.high)" }.sorted()): \(report ?? "")")
        }
        let skipped = net.nodes.reduce(0) { n, node in n + net.nodes.reduce(0) { $0 + node.mesh.ledger.rememberedSkips(for: $1.id) } }
        await net.stopAll()
        return skipped
    }

    func body(_ ward: String) -> JSON { ["ward": .string(ward), "n": .int(Int64(random(1000)))] }

    /// The supervisor creates, edits or moves a patient: one of its own, or one a station
    /// admitted that has reached it (it never writes the ID of one still on its way).
    func write(_ store: DocumentStore, wards: [String]) throws {
        let pool = ids + admitted
        let id = pool[random(pool.count)]
        let doc = try store.document(id)
        if doc == nil && !ids.contains(id) { return }
        _ = try? store.put(id, body: body(wards[random(wards.count)]), parent: doc.flatMap { $0.deleted ? nil : $0.revision })
    }

    /// A station admits a new patient to one of its wards.
    func admit(_ store: DocumentStore, station: Int, wards: [String]) throws {
        guard !wards.isEmpty else { return }
        let id = docID("admitted-\(station)-\(admitted.count)")
        admitted.append(id)
        _ = try store.put(id, body: body(wards[random(wards.count)]))
    }

    /// A station edits a patient it holds, keeping it in one of its wards.
    func edit(_ store: DocumentStore, wards: [String]) throws {
        guard !wards.isEmpty else { return }
        let held = try store.allDocuments().filter { !$0.id.rawValue.hasPrefix("_") }
        guard !held.isEmpty else { return }
        let doc = held[random(held.count)]
        _ = try? store.put(doc.id, body: body(wards[random(wards.count)]), parent: doc.revision)
    }

    func delete(_ store: DocumentStore) throws {
        let pool = ids + admitted
        let id = pool[random(pool.count)]
        guard let doc = try store.document(id), !doc.deleted else { return }
        _ = try? store.delete(id, revision: doc.revision)
    }

    /// The first station that does not hold exactly what its role admits at the supervisor's
    /// revisions, described; nil when all do.
    func mismatch(_ net: MeshNetwork) throws -> String? {
        let supervisor = net.nodes[wards.count - 1].store
        for n in 0..<(wards.count - 1) {
            let store = net.nodes[n].store
            let expected = try WardRules.expected(of: Self.policy(wards: wards[n]), from: supervisor)
            if let difference = try WardRules.difference(held: WardRules.live(store), expected: expected, station: store, supervisor: supervisor) {
                return "station \(n) (wards \(wards[n] ?? [])) \(difference)"
            }
        }
        return nil
    }
}
