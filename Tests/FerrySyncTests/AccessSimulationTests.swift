import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import Testing

@testable import FerrySync

/// A seeded simulation of access by content: five nodes (a supervisor who reads and writes
/// everything, and stations whose roles give them one ward's patients by a Mango selector) on
/// an in-memory network that breaks, duplicates and reorders messages and partitions nodes,
/// while patients are written, edited, moved between wards and deleted, and stations' roles
/// change. After healing, each node holds exactly the documents its roles admit, no more, no
/// less, at the supervisor's revisions.
///
/// `FERRY_ACCESS_SIM_SEEDS=N` runs N seeds (default 200); `FERRY_SIM_SEED=S` replays one.
@Suite(.timeLimit(.minutes(10))) struct AccessSimulationTests {
    @Test func eachNodeHoldsExactlyWhatItsRolesAdmitAfterHealing() async throws {
        await runSeeds(
            simulationSeeds(count: "FERRY_ACCESS_SIM_SEEDS", default: 200), name: "access simulation", filter: "AccessSimulationTests"
        ) { seed in
            try await AccessSimulation(seed: seed).run()
        }
    }
}

/// One seeded run.
final class AccessSimulation: @unchecked Sendable {
    enum Role: CaseIterable { case supervisor, wardA, wardB, none }

    let seed: UInt64
    var rng: SeededGenerator
    let roles: Locked<[Role]>
    var nodes: [DocumentStore] = []
    var partitioned = Set<Int>()
    let ids = (0..<8).map { docID("patient-\($0)") }
    static let nodeCount = 5

    init(seed: UInt64) throws {
        self.seed = seed
        rng = SeededGenerator(seed: seed)
        let roles = Locked<[Role]>([.supervisor, .wardA, .wardA, .wardB, .wardB])
        self.roles = roles
        nodes = try (0..<Self.nodeCount).map { n in
            var options = StoreOptions()
            // As a node's validator does: hold only what its roles let it read; write locally
            // only what they let it write.
            options.validator = Validator { proposed in
                let policy = Self.policy(roles.withLock { $0[n] })
                let bare = proposed.deleted && (proposed.body.objectValue?.isEmpty ?? true)
                if proposed.origin == .local && proposed.deleted && !policy.mayDelete { return "may not delete" }
                if !bare && proposed.origin == .local && !policy.write.admits(id: proposed.id, body: proposed.body) { return "may not write" }
                if !bare && !policy.read.admits(id: proposed.id, body: proposed.body) { return "may not hold" }
                return nil
            }
            return try DocumentStore.inMemory(options: options)
        }
    }

    static func grant(_ role: Role) -> AccessGrant? {
        switch role {
        case .supervisor: nil
        case .wardA: AccessGrant(clauses: [try! AccessClause(selector: ["ward": "a"])])
        case .wardB: AccessGrant(clauses: [try! AccessClause(selector: ["ward": "b"])])
        case .none: .nothing
        }
    }

    static func policy(_ role: Role) -> PeerPolicy {
        let g = grant(role)
        return PeerPolicy(read: AccessRule.all.restricted(by: g), write: AccessRule.all.restricted(by: g), mayDelete: role == .supervisor)
    }

    func role(_ n: Int) -> Role { roles.withLock { $0[n] } }
    func random(_ n: Int) -> Int { Int.random(in: 0..<n, using: &rng) }

    func run() async throws {
        for _ in 0..<40 {
            switch random(12) {
            case 0...2: try supervisorWrites()
            case 3...4: try stationWrites(node: 1 + random(Self.nodeCount - 1))
            case 5: try supervisorDeletes()
            case 6: try changeRole(node: 1 + random(Self.nodeCount - 1))
            case 7:
                let n = random(Self.nodeCount)
                if partitioned.contains(n) { partitioned.remove(n) } else { partitioned.insert(n) }
            default:
                let a = random(Self.nodeCount)
                var b = random(Self.nodeCount)
                if a == b { b = (b + 1) % Self.nodeCount }
                await syncPair(a, b, faulty: true)
            }
        }
        try await healAndCheck()
    }

    func body(_ ward: String) -> JSON { ["ward": .string(ward), "n": .int(Int64(random(100)))] }

    /// Creates, edits or moves a patient to a random ward.
    func supervisorWrites() throws {
        let store = nodes[0]
        let id = ids[random(ids.count)]
        let ward = ["a", "b"][random(2)]
        let doc = try store.document(id)
        _ = try? store.put(id, body: body(ward), parent: doc.flatMap { $0.deleted ? nil : $0.revision })
    }

    /// A station edits (or creates) a patient of its own ward.
    func stationWrites(node n: Int) throws {
        let ward: String
        switch role(n) {
        case .wardA: ward = "a"
        case .wardB: ward = "b"
        default: return
        }
        let store = nodes[n]
        let id = ids[random(ids.count)]
        let doc = try store.document(id)
        _ = try? store.put(id, body: body(ward), parent: doc.flatMap { $0.deleted ? nil : $0.revision })
    }

    func supervisorDeletes() throws {
        let id = ids[random(ids.count)]
        guard let doc = try nodes[0].document(id), !doc.deleted else { return }
        _ = try? nodes[0].delete(id, revision: doc.revision)
    }

    /// A station's role changes (as a signed assignment replicating in would): it purges what
    /// its new role does not let it read.
    func changeRole(node n: Int) throws {
        let next = [Role.wardA, .wardB, .none][random(3)]
        roles.withLock { $0[n] = next }
        let access = DocumentAccess(Self.policy(next))
        _ = try nodes[n].purgeForAccess(nodes[n].allDocuments(includeDeleted: true).map(\.id), reason: "role", refusingReturn: false) {
            id, tree in !access.mayRead(id, tree: tree)
        }
    }

    func syncPair(_ a: Int, _ b: Int, faulty: Bool) async {
        var config = ReplicatorConfiguration()
        config.maxAttempts = faulty ? 2 : 5
        config.batchSize = 1 + random(6)
        config.remotePolicy = Self.policy(role(b))
        config.checksHeldAccess = Self.policy(role(a)).read.needsBodies
        let roles = self.roles
        config.ownRead = { Self.policy(roles.withLock { $0[a] }).read }
        if faulty { config.direction = [.push, .pull, .pushAndPull][random(3)] }
        var options = ReplicationResponder.Options()
        options.defaultPolicy = Self.policy(role(a))
        options.ownRead = { Self.policy(roles.withLock { $0[b] }).read }
        let connector = simulatedConnector(
            to: nodes[b], options: options, faulty: faulty, unreachable: partitioned.contains(a) || partitioned.contains(b), using: &rng)
        var quiet = Logger(label: "ferry.sim")
        quiet.logLevel = .critical
        await Replicator(store: nodes[a], connector: connector, configuration: config, clock: ImmediateClock(), logger: quiet).run()
    }

    /// Live documents and their revisions.
    func live(_ store: DocumentStore) throws -> [String: String] {
        Dictionary(uniqueKeysWithValues: try store.allDocuments().map { ($0.id.rawValue, $0.revision.description) })
    }

    func healAndCheck() async throws {
        partitioned.removeAll()
        // Every station with the supervisor, then everyone with everyone, until nothing moves.
        var previous: [[String: String]] = []
        for _ in 0..<12 {
            for i in 1..<Self.nodeCount { await syncPair(i, 0, faulty: false) }
            for i in 0..<Self.nodeCount {
                for j in 0..<Self.nodeCount where i != j { await syncPair(i, j, faulty: false) }
            }
            let now = try nodes.map(live)
            if now == previous { break }
            previous = now
        }
        let supervisor = nodes[0]
        for n in 1..<Self.nodeCount {
            let access = DocumentAccess(Self.policy(role(n)))
            var expected: [String: String] = [:]
            for doc in try supervisor.allDocuments() {
                guard let tree = try supervisor.revisionTree(doc.id), access.mayRead(doc.id, tree: tree) else { continue }
                expected[doc.id.rawValue] = doc.revision.description
            }
            let held = try live(nodes[n])
            if held != expected {
                let more = held.keys.filter { expected[$0] == nil }.sorted()
                let fewer = expected.keys.filter { held[$0] == nil }.sorted()
                let stale = held.keys.filter { expected[$0] != nil && expected[$0] != held[$0] }.sorted()
                var detail = ""
                for id in (more + fewer + stale).prefix(3) {
                    let d = docID(id)
                    let mine = try nodes[n].revisionTree(d).map { t in t.revisions.map { "\($0.id.description.prefix(8))\($0.isLeaf ? "*" : "")\($0.deleted ? "x" : "")" } } ?? []
                    let theirs = try supervisor.revisionTree(d).map { t in t.revisions.map { "\($0.id.description.prefix(8))\($0.isLeaf ? "*" : "")\($0.deleted ? "x" : "")" } } ?? []
                    detail += "; \(id): here \(mine), supervisor \(theirs) \(String(describing: try supervisor.document(d)?.body))"
                }
                throw SimulationFailure(
                    description: "node \(n) (\(role(n))) holds more \(more), fewer \(fewer), other revisions of \(stale) than its roles admit\(detail)")
            }
        }
    }
}
