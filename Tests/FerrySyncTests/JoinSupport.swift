import CoreMetrics
import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
@testable import FerrySync

/// Counters by label, as a node would export them, for tests that read duplicates.
final class CountingMetrics: MetricsFactory, Sendable {
    private let totals = Locked<[String: Int64]>([:])

    subscript(label: String) -> Int64 { totals.withLock { $0[label] ?? 0 } }
    var duplicates: Int64 { self["ferry_documents_duplicate_total"] }
    var sync: SyncMetrics { SyncMetrics(factory: self) }

    /// Adds to one label's total.
    final class Handler: CounterHandler, FloatingPointCounterHandler, RecorderHandler, TimerHandler, MeterHandler, Sendable {
        let label: String
        let owner: CountingMetrics
        init(_ label: String, _ owner: CountingMetrics) {
            self.label = label
            self.owner = owner
        }
        func increment(by amount: Int64) { owner.totals.withLock { $0[label, default: 0] += amount } }
        func increment(by amount: Double) {}
        func reset() {}
        func record(_ value: Int64) {}
        func record(_ value: Double) {}
        func recordNanoseconds(_ duration: Int64) {}
        func set(_ value: Int64) {}
        func set(_ value: Double) {}
        func decrement(by: Double) {}
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler { Handler(label, self) }
    func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler { Handler(label, self) }
    func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler { Handler(label, self) }
    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler { Handler(label, self) }
    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler { Handler(label, self) }
    func destroyCounter(_ handler: any CounterHandler) {}
    func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {}
    func destroyMeter(_ handler: any MeterHandler) {}
    func destroyRecorder(_ handler: any RecorderHandler) {}
    func destroyTimer(_ handler: any TimerHandler) {}
}

/// One node of a join test: a store, its one catch-up gate, and its counters; its
/// responders and replicators share both, as a node's do.
struct JoinNode: Sendable {
    let name: String
    let store: DocumentStore
    let gate = CatchUpGate()
    let metrics = CountingMetrics()

    init(_ name: String, store: DocumentStore? = nil) throws {
        self.name = name
        self.store = try store ?? DocumentStore.inMemory()
    }

    /// A way in to this node's responder (a new responder per link, sharing the gate).
    func link(policy: PeerPolicy = .trusted, resolvers: ResolverSet = ResolverSet(), faults: (@Sendable (Int) -> (client: InMemoryEndpoint.Faults, server: InMemoryEndpoint.Faults))? = nil) -> Link {
        var options = ReplicationResponder.Options()
        options.nodeID = name
        options.defaultPolicy = policy
        options.catchUpGate = gate
        options.metrics = metrics.sync
        options.resolvers = resolvers
        var link = Link(to: store, options: options, quiet: true)
        if let faults { link.faults = faults }
        return link
    }

    /// A replicator from this node to `other`, sharing this node's gate and counters.
    func replicator(
        to other: JoinNode, direction: ReplicatorConfiguration.Direction = .pushAndPull, gated: Bool = true,
        policy: PeerPolicy = .trusted, faults: (@Sendable (Int) -> (client: InMemoryEndpoint.Faults, server: InMemoryEndpoint.Faults))? = nil,
        configure: (inout ReplicatorConfiguration) -> Void = { _ in }
    ) -> Replicator {
        var config = ReplicatorConfiguration()
        config.wiring.nodeID = name
        config.direction = direction
        config.wiring.catchUpGate = gated ? gate : nil
        config.wiring.metrics = metrics.sync
        config.maxAttempts = 3
        configure(&config)
        var quiet = Logger(label: "ferry.join.\(name)")
        quiet.logLevel = .critical
        return Replicator(store: store, connector: other.link(faults: faults).connector, configuration: config, clock: ImmediateClock(), logger: quiet)
    }

    /// Runs a one-shot replication from this node to `other` to its end.
    @discardableResult
    func sync(with other: JoinNode, direction: ReplicatorConfiguration.Direction = .pushAndPull, configure: (inout ReplicatorConfiguration) -> Void = { _ in }) async -> Replicator {
        let r = replicator(to: other, direction: direction, configure: configure)
        await r.run()
        return r
    }

    func coverage(of other: JoinNode) throws -> UInt64? { try Coverage.of(other.store.uuid, in: store) }
}

/// Runs replicators side by side until each has stopped.
func runTogether(_ replicators: [Replicator]) async {
    await withTaskGroup(of: Void.self) { group in
        for r in replicators { group.addTask { await r.run() } }
    }
}

/// Writes `count` documents of about `size` bytes named `prefix-i`.
func writeDocuments(_ store: DocumentStore, prefix: String, count: Int, size: Int = 64) throws {
    let filler = String(repeating: "x", count: size)
    for i in 0..<count { try store.put(docID("\(prefix)-\(i)"), body: ["n": .int(Int64(i)), "pad": .string(filler)]) }
}

/// Two rounds of one-shot syncs between every pair, so that every node holds everything
/// and has recorded its coverage of every other's feed through its end.
func settle(_ nodes: [JoinNode]) async {
    for _ in 0..<2 {
        for i in nodes.indices {
            for j in nodes.indices where i < j { await nodes[i].sync(with: nodes[j]) }
        }
    }
}
