import CDNSSD
import FerryCore
import Foundation
import IntegrationHarness
import Logging
import ServiceLifecycle
import Testing

@testable import FerryDiscovery

/// Every event a discovery reported so far, collected by a task of its own.
final class EventLog: Sendable {
    /// The events, shared with the collecting task.
    private final class Store: Sendable {
        let events = Locked<[DiscoveryEvent]>([])
    }

    private let store = Store()
    private let task: Task<Void, Never>

    init(_ stream: AsyncStream<DiscoveryEvent>) {
        let store = self.store
        task = Task { for await event in stream { store.events.withLock { $0.append(event) } } }
    }

    var events: [DiscoveryEvent] { store.events.withLock { $0 } }
    var count: Int { store.events.withLock { $0.count } }

    /// Whether an event after the first `from` satisfies `predicate`.
    func contains(after from: Int = 0, _ predicate: (DiscoveryEvent) -> Bool) -> Bool {
        let all = events
        return all.dropFirst(from).contains(where: predicate)
    }

    deinit { task.cancel() }
}

func appeared(_ nodeID: String) -> (DiscoveryEvent) -> Bool {
    { if case .appeared(let p) = $0 { return p.nodeID == nodeID && !p.addresses.isEmpty }; return false }
}

func isUnavailable(_ event: DiscoveryEvent) -> Bool { if case .unavailable = event { return true }; return false }

/// What Avahi's compat library does when avahi-daemon or D-Bus goes away, and how discovery
/// recovers: no callback reaches freed or uninitialised memory, and the session comes back.
@Suite(.serialized, .timeLimit(.minutes(10)))
struct DNSSDFaultTests {
    /// The size of the compat library's DNSServiceRef (Debian 12, avahi 0.8): the allocation
    /// whose unset callback fields a dead daemon made it call.
    static let refSize = 0xf8

    @Test func avahiAllocationsAreZeroFilledOnceDiscoveryExists() {
        _ = DNSSDDiscovery(configuration: .init(advertisement: nil, group: nil))
        for _ in 0..<32 {
            // Leave the bytes a freed block of that size would hand on to the next malloc.
            let dirty = malloc(Self.refSize)!
            memset(dirty, 0xA5, Self.refSize)
            free(dirty)
            let block = avahi_malloc(Self.refSize)!
            defer { avahi_free(block) }
            let bytes = UnsafeRawBufferPointer(start: block, count: Self.refSize)
            #expect(bytes.allSatisfy { $0 == 0 }, "avahi_malloc handed on leftover bytes")
        }
    }

    @Test func retryDelaysDoubleFromTheIntervalUpToTheMaximum() {
        var c = DNSSDDiscovery.Configuration(advertisement: nil, group: nil)
        c.retryInterval = .seconds(1)
        c.maximumRetryInterval = .seconds(8)
        #expect((0..<6).map { c.retryDelay(attempt: $0) } == [.seconds(1), .seconds(2), .seconds(4), .seconds(8), .seconds(8), .seconds(8)])
        c.maximumRetryInterval = .milliseconds(10)
        #expect(c.retryDelay(attempt: 3) == .seconds(1), "a maximum below the interval never shortens it")
    }
}

/// Against the test run's own avahi-daemon, held alone: these stop and restart it.
@Suite(.serialized, .timeLimit(.minutes(10)), .enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
struct DNSSDDaemonLossTests {
    func advertiser(_ name: String, _ c: Character, group: String, clock: any Clock<Duration> = ContinuousClock(), retry: Duration)
        -> DNSSDDiscovery
    {
        var configuration = DNSSDDiscovery.Configuration(
            advertisement: .init(instanceName: "ferry-\(name)-\(group)", nodeID: id(c), group: group, protocolVersion: 1, port: 41000),
            group: group)
        configuration.retryInterval = retry
        configuration.maximumRetryInterval = retry * 4
        var logger = Logger(label: "test.\(name)")
        logger.logLevel = .debug
        return DNSSDDiscovery(configuration: configuration, clock: clock, logger: logger)
    }

    var avahiPID: pid_t? {
        (try? String(contentsOfFile: "\(LoopbackAvahi.state)/avahi.pid", encoding: .utf8))
            .flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// Sends `sig` to avahi-daemon and waits until it has exited.
    func stopDaemon(with sig: Int32) async throws {
        let pid = try #require(avahiPID)
        kill(pid, sig)
        _ = await eventually(10, every: .milliseconds(20)) {
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else {
                return true
            }
            return stat[close...].hasPrefix(") Z")
        }
    }

    @Test func daemonKilledUnderOpenResolvesAndQueriesIsReportedAndDiscoveryComesBack() async throws {
        try await LoopbackAvahi.withDaemon(exclusive: true) { why in
            if let why {
                Issue.record("the test run's avahi-daemon did not start: \(why)")
                return
            }
            let group = "g\(UInt32.random(in: 0...UInt32.max))"
            let a = advertiser("a", "a", group: group, retry: .milliseconds(200))
            let b = advertiser("b", "b", group: group, retry: .milliseconds(200))
            let (seenByA, seenByB) = (EventLog(a.events), EventLog(b.events))
            let services = ServiceGroup(services: [a, b], logger: Logger(label: "test"))
            let runner = Task { try await services.run() }
            // SIGKILL leaves each side's resolve and A-record query open when the daemon goes:
            // the case that made the compat library call through garbage.
            for (round, sig) in [SIGKILL, SIGKILL, SIGTERM, SIGKILL, SIGKILL].enumerated() {
                let (fromA, fromB) = (seenByA.count, seenByB.count)
                #expect(await eventually(30) { seenByA.contains(after: fromA, appeared(id("b"))) && seenByB.contains(after: fromB, appeared(id("a"))) },
                    "round \(round): the advertisers did not find each other")
                let (lostA, lostB) = (seenByA.count, seenByB.count)
                try await stopDaemon(with: sig)
                #expect(await eventually(30) { seenByA.contains(after: lostA, isUnavailable) && seenByB.contains(after: lostB, isUnavailable) },
                    "round \(round): losing the daemon (signal \(sig)) was not reported")
                #expect(await LoopbackAvahi.startDaemon() == nil)
            }
            let (backA, backB) = (seenByA.count, seenByB.count)
            #expect(await eventually(30) { seenByA.contains(after: backA, appeared(id("b"))) && seenByB.contains(after: backB, appeared(id("a"))) },
                "the advertisers did not find each other after the last restart")
            await services.triggerGracefulShutdown()
            try await runner.value
            #expect(await a.openHandleCount() == 0, "dns_sd handles left after run returned")
            #expect(await b.openHandleCount() == 0, "dns_sd handles left after run returned")
        }
    }

    @Test func withoutTheDaemonDiscoveryRetriesOnItsClockWithBackoffAndStartsWhenItIsBack() async throws {
        try await LoopbackAvahi.withDaemon(exclusive: true) { why in
            if let why {
                Issue.record("the test run's avahi-daemon did not start: \(why)")
                return
            }
            #expect(await LoopbackAvahi.stopDaemon() == nil)
            let clock = ManualClock()
            let group = "g\(UInt32.random(in: 0...UInt32.max))"
            let a = advertiser("a", "a", group: group, clock: clock, retry: .seconds(10))
            let log = EventLog(a.events)
            let runner = Task { try await a.run() }
            // Each failed attempt waits twice as long as the one before, up to 4 × 10 s.
            var elapsed: Duration = .zero
            for delay in [10, 20, 40, 40].map({ Duration.seconds($0) }) {
                let failures = log.events.filter(isUnavailable).count
                #expect(await eventually(30, every: .milliseconds(10)) { log.events.filter(isUnavailable).count == failures + 1 })
                #expect(await eventually(30, every: .milliseconds(10)) { clock.pendingDeadlines == [elapsed + delay] },
                    "pending: \(clock.pendingDeadlines), expected \(elapsed + delay)")
                clock.advance(by: delay)
                elapsed += delay
            }
            #expect(await eventually(30, every: .milliseconds(10)) { log.events.filter(isUnavailable).count == 5 })
            #expect(await LoopbackAvahi.startDaemon() == nil)
            let waiting = clock.pendingDeadlines
            #expect(waiting == [elapsed + .seconds(40)], "\(waiting)")
            clock.advance(by: .seconds(40))
            #expect(await eventually(30) { log.events.contains(.available) })
            runner.cancel()
            _ = try? await runner.value
            #expect(await a.openHandleCount() == 0)
        }
    }
}
