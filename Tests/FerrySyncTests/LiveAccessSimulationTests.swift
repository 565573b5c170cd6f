import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// A seeded simulation of a live mesh under the group's access rules with everything at once:
/// stations' roles given, changed and taken away in any order (before or after the patients
/// exist, as an admin typing the docs' commands in another order would), links dropping and
/// coming back, nodes restarting (every link of the node ends and is dialled again), a new
/// station joining halfway, and the supervisor and the stations writing throughout.
///
/// A change of roles is applied as a node applies the signed entries that replicate in: the
/// station purges what its new roles do not admit, and every link starts again under the new
/// version of the rules (new policies, new checkpoints). Checked throughout: no station ever
/// holds a document its roles of the moment do not admit. Checked at the end, once every
/// station links to the supervisor and no session is started again: every station holds
/// exactly what its roles admit, at the supervisor's revisions (documents it was purged of
/// come back when its roles admit them again, without another write).
///
/// `FERRY_LIVE_ACCESS_SIM_SEEDS=N` runs N seeds (default 30; `make soak` runs 1,000);
/// `FERRY_SIM_SEED=S` replays one.
@Suite(.timeLimit(.minutes(10))) struct LiveAccessSimulationTests {
    @Test func stationsOfALiveMeshHoldWhatTheirRolesAdmitWhateverTheOrderOfChanges() async throws {
        let seeds = simulationSeeds(count: "FERRY_LIVE_ACCESS_SIM_SEEDS", default: 30)
        let returned = Counter()
        await runSeeds(seeds, name: "live access simulation", filter: "LiveAccessSimulationTests") { seed in
            let came = try await LiveAccessSimulation(seed: seed).run()
            for _ in 0..<came { returned.increment() }
        }
        // Stations were purged and got documents back with their roles (what item this is for).
        if seeds.count >= 20 { #expect(returned.current > 0, "no purged document ever came back") }
        print(
            "live access simulation: \(seeds.count) seeds, \(returned.current) purged documents came back with a role; checks that met the known gap of a branch continued out of reach: \(LiveAccessSimulation.staleBranchesSeen.withLock { $0 })")
    }
}

/// One seeded run.
final class LiveAccessSimulation: @unchecked Sendable {
    let seed: UInt64
    var rng: SeededGenerator
    let ids = (0..<8).map { docID("patient-\($0)") }
    var admitted: [DocumentID] = []
    /// Each node's wards (nil: the supervisor, the last node; []: no role yet or any more),
    /// and the version of the rules they make. Read by policies and validators as they run.
    let roles: Locked<(wards: [[String]?], version: Int)>
    /// The station that joins halfway (no link before).
    let joiner: Int
    var joined = false
    /// Documents a station was purged of by a change of its roles: (station, ID).
    var purged = Set<String>()

    init(seed: UInt64) {
        self.seed = seed
        var rng = SeededGenerator(seed: seed)
        let stations = 3 + Int.random(in: 0..<2, using: &rng)
        // Some stations start with a role, some without (their roles are typed later).
        let wards: [[String]?] = (0..<stations).map { _ in Self.randomWards(&rng) } + [nil]
        roles = Locked((wards, 1))
        joiner = Int.random(in: 0..<stations, using: &rng)
        self.rng = rng
    }

    static func randomWards(_ rng: inout SeededGenerator) -> [String] {
        [[], ["a"], ["b"], ["a", "b"]][Int.random(in: 0..<4, using: &rng)]
    }

    func random(_ n: Int) -> Int { Int.random(in: 0..<n, using: &rng) }
    var supervisor: Int { roles.withLock { $0.wards.count - 1 } }
    func wards(_ n: Int) -> [String]? { roles.withLock { $0.wards[n] } }

    static func policy(wards: [String]?, version: Int) -> PeerPolicy { WardRules.policy(wards: wards, version: "v\(version)") }

    func policy(of n: Int) -> PeerPolicy { roles.withLock { Self.policy(wards: $0.wards[n], version: $0.version) } }

    func storeOptions(_ n: Int) -> StoreOptions {
        WardRules.storeOptions { [roles] in roles.withLock { Self.policy(wards: $0.wards[n], version: $0.version) } }
    }

    /// Runs the seed; returns how many purged documents a station held again at the end.
    func run() async throws -> Int {
        let k = roles.withLock { $0.wards.count }
        var antiEntropy = AntiEntropy()
        antiEntropy.checkInterval = .milliseconds(50)
        antiEntropy.settle = .milliseconds(200)
        antiEntropy.maxBackoff = .seconds(1)
        let roles = self.roles
        let net = try MeshNetwork(
            count: k,
            policy: { _, peer in roles.withLock { Self.policy(wards: $0.wards[peer], version: $0.version) } },
            storeOptions: { self.storeOptions($0) }, antiEntropy: antiEntropy)
        defer { Task { await net.stopAll() } }
        for i in 0..<k where i != joiner {
            for j in (i + 1)..<k where j != joiner && random(3) != 0 { net.connect(i, j) }
        }
        let steps = 20 + random(20)
        for step in 0..<steps {
            if step == steps / 2 { join(net) }
            switch random(14) {
            case 0...2: try write(net.nodes[supervisor].store)
            case 3, 4:
                let n = random(k - 1)
                if n != joiner || joined { try admit(net.nodes[n].store, station: n) }
            case 5:
                let n = random(k - 1)
                if n != joiner || joined { try edit(net.nodes[n].store, station: n) }
            case 6: try delete(net.nodes[supervisor].store)
            case 7: try await changeRole(net, station: random(k - 1))
            case 8:
                if let pair = net.linked.randomElement(using: &rng) { await net.disconnect(pair.low, pair.high) }
            case 9:
                let a = random(k)
                let b = (a + 1 + random(k - 1)) % k
                if joined || (a != joiner && b != joiner) { net.connect(a, b) }
            case 10: await restart(net, node: random(k))
            default:
                for _ in 0..<random(20) { await Task.yield() }
            }
            if let unsafe = try overreach(net) { throw SimulationFailure(description: "step \(step): \(unsafe)") }
        }
        if !joined { join(net) }
        // Heal: every station linked to the supervisor, besides what is left of the mesh; no
        // link is started again.
        for i in 0..<supervisor { net.connect(i, supervisor) }
        do {
            try await waitUntil("every station holds what its roles admit", timeout: 30, every: .milliseconds(5)) {
                if let unsafe = try self.overreach(net) { throw SimulationFailure(description: "while healing: \(unsafe)") }
                return try self.mismatch(net) == nil
            }
        } catch let failure as SimulationFailure {
            throw failure
        } catch {
            let report = ((try? mismatch(net)) ?? nil) ?? "matched at the last look"
            throw SimulationFailure(
                description: "wards \(roles.withLock { $0.wards }.map { $0.map { $0.isEmpty ? "-" : $0.joined() } ?? "*" }), joiner \(joiner), links \(net.linked.map { "\($0.low)-\($0.high)" }.sorted()): \(report)")
        }
        var back = 0
        for key in purged {
            let parts = key.split(separator: "|", maxSplits: 1).map(String.init)
            if try net.nodes[Int(parts[0])!].store.document(docID(parts[1])) != nil { back += 1 }
        }
        await net.stopAll()
        return back
    }

    /// The new station starts dialling: an empty store, linked to one or two members.
    func join(_ net: MeshNetwork) {
        guard !joined else { return }
        joined = true
        let k = net.nodes.count
        let first = (joiner + 1 + random(k - 1)) % k
        net.connect(joiner, first)
        if random(2) == 0 { net.connect(joiner, (joiner + 1 + random(k - 1)) % k) }
    }

    /// A station's roles change (given, changed or taken away), as the signed entries replicate
    /// in: it purges what they no longer admit, and every link starts again under the new rules.
    func changeRole(_ net: MeshNetwork, station n: Int) async throws {
        var next = Self.randomWards(&rng)
        if next == wards(n) { next = next.isEmpty ? ["a"] : [] }
        let version = roles.withLock { r -> Int in
            r.wards[n] = next
            r.version += 1
            return r.version
        }
        let rule = Self.policy(wards: next, version: version).read
        let store = net.nodes[n].store
        let removed = try store.purgeForAccess(store.allDocuments().map(\.id), reason: "roles changed", refusingReturn: false) { id, tree in
            !DocumentAccess(PeerPolicy(read: rule)).mayRead(id, tree: tree)
        }
        for r in removed { purged.insert("\(n)|\(r.id)") }
        let links = net.linked
        await net.stopAll()
        for pair in links { net.connect(pair.low, pair.high) }
    }

    /// A node stops and starts again: every link of it ends, and is dialled again.
    func restart(_ net: MeshNetwork, node n: Int) async {
        let links = net.linked.filter { $0.low == n || $0.high == n }
        for pair in links { await net.disconnect(pair.low, pair.high) }
        for pair in links { net.connect(pair.low, pair.high) }
    }

    func body(_ ward: String) -> JSON { ["ward": .string(ward), "n": .int(Int64(random(1000)))] }

    /// The supervisor creates, edits or moves a patient (never one still on its way to it).
    func write(_ store: DocumentStore) throws {
        let pool = ids + admitted
        let id = pool[random(pool.count)]
        let doc = try store.document(id)
        if doc == nil && !ids.contains(id) { return }
        _ = try? store.put(id, body: body(["a", "b"][random(2)]), parent: doc.flatMap { $0.deleted ? nil : $0.revision })
    }

    /// A station admits a new patient to one of its wards.
    func admit(_ store: DocumentStore, station: Int) throws {
        guard let wards = wards(station), !wards.isEmpty else { return }
        let id = docID("admitted-\(station)-\(admitted.count)")
        admitted.append(id)
        _ = try? store.put(id, body: body(wards[random(wards.count)]))
    }

    /// A station edits a patient it holds, in the patient's ward. (Moving patients is the
    /// supervisor's: a station's move that reached only stations before its roles were taken
    /// away stays with them, docs/operations.md, "Access by content".)
    func edit(_ store: DocumentStore, station: Int) throws {
        guard let wards = wards(station), !wards.isEmpty else { return }
        let held = try store.allDocuments()
        guard !held.isEmpty else { return }
        let doc = held[random(held.count)]
        guard let ward = try store.document(doc.id)?.body["ward"]?.stringValue, wards.contains(ward) else { return }
        _ = try? store.put(doc.id, body: body(ward), parent: doc.revision)
    }

    func delete(_ store: DocumentStore) throws {
        let pool = ids + admitted
        let id = pool[random(pool.count)]
        guard let doc = try store.document(id), !doc.deleted else { return }
        _ = try? store.delete(id, revision: doc.revision)
    }

    /// The first station holding a document its roles of the moment do not admit; nil when none.
    func overreach(_ net: MeshNetwork) throws -> String? {
        for n in 0..<supervisor {
            let access = DocumentAccess(policy(of: n))
            let store = net.nodes[n].store
            for doc in try store.allDocuments() {
                // Judged by the live leaves it holds now (the document may have changed since it was listed).
                guard let tree = try store.revisionTree(doc.id), tree.revisions.contains(where: { $0.isLeaf && !$0.deleted }),
                    !access.mayRead(doc.id, tree: tree)
                else { continue }
                let leaves = tree.leaves.filter { !$0.deleted }.map(\.id.description)
                return "station \(n) (wards \(wards(n) ?? [])) holds \(doc.id) with live leaves \(leaves), which its roles do not admit"
            }
        }
        return nil
    }

    /// Whether the station's copy differs from the supervisor's only by leaves the supervisor
    /// holds as ancestors of revisions the station may not read, beside the supervisor's
    /// current revision, which the station holds too.
    func isStaleBranch(_ id: DocumentID, station: DocumentStore, supervisor: DocumentStore) throws -> Bool {
        guard let mine = try station.revisionTree(id), let theirs = try supervisor.revisionTree(id), let current = theirs.winner else { return false }
        let theirLeaves = Set(theirs.leaves.map(\.id))
        let extra = mine.leaves.filter { leaf in !leaf.deleted && theirs.revision(leaf.id) != nil && !theirLeaves.contains(leaf.id) }
        guard !extra.isEmpty, mine.leaves.contains(where: { $0.id == current.id }) else { return false }
        let others = mine.leaves.filter { l in l.id != current.id && !extra.contains(where: { $0.id == l.id }) && !l.deleted }
        guard others.isEmpty else { return false }
        staleBranches.withLock { $0 += 1 }
        return true
    }

    /// Documents left in the known gap at the end of runs (all seeds).
    static let staleBranchesSeen = Locked(0)
    var staleBranches: Locked<Int> { Self.staleBranchesSeen }

    /// The first station that does not hold exactly what its roles admit at the supervisor's
    /// revisions, described; nil when all do.
    func mismatch(_ net: MeshNetwork) throws -> String? {
        let supervisorStore = net.nodes[supervisor].store
        for n in 0..<supervisor {
            let store = net.nodes[n].store
            let expected = try WardRules.expected(of: policy(of: n), from: supervisorStore)
            var held = try WardRules.live(store)
            // The known gap (docs/operations.md, "Access by content"): a conflicting branch the
            // supervisor continued out of the station's reach is left with the station beside
            // the supervisor's readable one. Counted, not failed.
            for (id, rev) in held where expected[id] != nil && expected[id] != rev {
                if try isStaleBranch(docID(id), station: store, supervisor: supervisorStore) { held[id] = expected[id] }
            }
            if let difference = try WardRules.difference(held: held, expected: expected, station: store, supervisor: supervisorStore) {
                let views = net.nodes[n].digests.flatMap { $0.matches(net.nodes[supervisor].id) }.map { "\($0)" } ?? "unknown"
                return "station \(n) (wards \(wards(n) ?? [])) \(difference); views match \(views)"
            }
        }
        return nil
    }
}
