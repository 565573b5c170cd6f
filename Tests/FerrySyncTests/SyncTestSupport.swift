import Testing
import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
@testable import FerrySync

func docID(_ s: String) -> DocumentID { try! DocumentID(s) }

/// Connects replicators to a responder on another store over in-memory endpoint pairs.
struct Link: Sendable {
    let responder: ReplicationResponder
    var faults: @Sendable (Int) -> (client: InMemoryEndpoint.Faults, server: InMemoryEndpoint.Faults) = { _ in (.init(), .init()) }
    let attempts = Counter()

    /// `clock` runs the responder's heartbeats and silence watchdog: a test whose replicator
    /// runs on a `ManualClock` passes the same one, or the responder, on the wall clock, closes
    /// a link whose replicator's heartbeats never come as soon as the test is slower than 4 s.
    init(
        to store: DocumentStore, options: ReplicationResponder.Options = .init(), clock: any Clock<Duration> = ContinuousClock(),
        quiet: Bool = false
    ) {
        var logger = Logger(label: "ferry.sync.responder")
        if quiet { logger.logLevel = .critical }
        responder = ReplicationResponder(store: store, options: options, clock: clock, logger: logger)
    }

    var connector: Replicator.Connector {
        let responder = self.responder
        let faults = self.faults
        let attempts = self.attempts
        return {
            let n = attempts.increment()
            let f = faults(n)
            let (client, server) = InMemoryEndpoint.pair(faultsA: f.client, faultsB: f.server)
            Task { await responder.serve(server) }
            return client
        }
    }
}

final class Counter: Sendable {
    private let value = Locked(0)
    @discardableResult func increment() -> Int { value.withLock { $0 += 1; return $0 } }
    var current: Int { value.withLock { $0 } }
}

/// A settable wall clock (milliseconds) that stores and tests share.
final class TestWallClock: Sendable {
    private let millis: Locked<UInt64>
    init(_ start: UInt64) { millis = Locked(start) }
    var now: UInt64 { millis.withLock { $0 } }
    func set(_ value: UInt64) { millis.withLock { $0 = value } }
    func advance(by delta: UInt64) { millis.withLock { $0 += delta } }
}

/// Runs a one-shot replication to completion and returns the replicator.
@discardableResult
func sync(
    _ local: DocumentStore, _ remote: DocumentStore, direction: ReplicatorConfiguration.Direction = .pushAndPull,
    configure: (inout ReplicatorConfiguration) -> Void = { _ in }, responder: ReplicationResponder.Options = .init()
) async -> Replicator {
    var config = ReplicatorConfiguration()
    config.direction = direction
    configure(&config)
    let link = Link(to: remote, options: responder)
    let replicator = Replicator(store: local, connector: link.connector, configuration: config, clock: ImmediateClock())
    await replicator.run()
    return replicator
}

/// Every document's current revision and conflicts, for comparing nodes.
func digest(_ store: DocumentStore) throws -> [String] {
    try store.allDocuments(includeDeleted: true).map { d in
        let conflicts = try store.conflicts(of: d.id).map(\.description).joined(separator: ",")
        return "\(d.id) \(d.revision) \(d.deleted) [\(conflicts)]"
    }
}

/// Replaces every occurrence of `pattern` in `bytes` (same-length replacements keep
/// binary length prefixes valid).
func replacing(_ pattern: String, with replacement: String, in bytes: [UInt8]) -> [UInt8] {
    let p = Array(pattern.utf8)
    let r = Array(replacement.utf8)
    var out: [UInt8] = []
    var i = 0
    while i < bytes.count {
        if i + p.count <= bytes.count && Array(bytes[i..<i + p.count]) == p {
            out += r
            i += p.count
        } else {
            out.append(bytes[i])
            i += 1
        }
    }
    return out
}

func contains(_ pattern: String, in bytes: [UInt8]) -> Bool {
    replacing(pattern, with: "", in: bytes).count != bytes.count
}

/// The seeds a seeded simulation runs: `FERRY_SIM_SEED` alone when set, else 1 through the
/// number in the environment variable `count` (`defaultCount` when unset).
func simulationSeeds(count variable: String, default defaultCount: Int) -> [UInt64] {
    let env = ProcessInfo.processInfo.environment
    if let one = env["FERRY_SIM_SEED"].flatMap(UInt64.init) { return [one] }
    let count = env[variable].flatMap(Int.init) ?? defaultCount
    return (1...UInt64(max(1, count))).map { $0 }
}

/// Runs `run` for every seed, four at a time (each spends most of its time waiting on its
/// links), records each failure with the command that replays it, and stops after three.
func runSeeds(_ seeds: [UInt64], name: String, filter: String, _ run: @escaping @Sendable (UInt64) async throws -> Void) async {
    var failures = 0
    for start in stride(from: 0, to: seeds.count, by: 4) {
        let batch = seeds[start..<min(start + 4, seeds.count)]
        let failed = await withTaskGroup(of: (UInt64, String?).self) { group in
            for seed in batch {
                group.addTask {
                    do {
                        try await run(seed)
                        return (seed, nil)
                    } catch {
                        return (seed, "\(error)")
                    }
                }
            }
            var failed: [(UInt64, String)] = []
            for await (seed, error) in group { if let error { failed.append((seed, error)) } }
            return failed.sorted { $0.0 < $1.0 }
        }
        for (seed, error) in failed {
            Issue.record("\(name) seed \(seed) failed: \(error)\nreplay: FERRY_SIM_SEED=\(seed) swift test --filter \(filter)")
        }
        failures += failed.count
        if failures >= 3 { break }
    }
}

/// A connector to `store`'s responder through an in-memory link that, when `faulty`, may
/// break after some messages, duplicate every message and reorder them (the seeded
/// simulations' network), and that fails at once while `unreachable` (a partition).
func simulatedConnector(
    to store: DocumentStore, options: ReplicationResponder.Options, faulty: Bool, unreachable: Bool, using rng: inout SeededGenerator
) -> Replicator.Connector {
    let failAfter: Int? = faulty && Int.random(in: 0..<3, using: &rng) == 0 ? 2 + Int.random(in: 0..<20, using: &rng) : nil
    let duplicate = faulty && Int.random(in: 0..<3, using: &rng) == 0
    let yields = faulty ? Int.random(in: 0..<4, using: &rng) : 0
    var link = Link(to: store, options: options, quiet: true)
    link.faults = { _ in
        let deliver: @Sendable ([UInt8]) async -> [[UInt8]] = { bytes in
            for _ in 0..<yields { await Task.yield() }  // reorders against concurrent messages
            return duplicate ? [bytes, bytes] : [bytes]
        }
        return (.init(failAfterMessages: failAfter, deliver: deliver), .init(deliver: deliver))
    }
    let inner = link.connector
    return {
        if unreachable { throw SyncError.disconnected("partitioned") }
        return try await inner()
    }
}
