import FerryCore
import Foundation
import IntegrationHarness
import Logging
import ServiceLifecycle
import Testing

@testable import FerryDiscovery

func id(_ c: Character) -> String { String(repeating: c, count: 64) }

/// Collects events until `predicate` holds over everything seen, or 60 s pass.
func waitFor(_ stream: AsyncStream<DiscoveryEvent>, until predicate: @escaping @Sendable ([DiscoveryEvent]) -> Bool) async -> [DiscoveryEvent] {
    let seen = try? await Race.first(
        { () async -> [DiscoveryEvent]? in
            var seen: [DiscoveryEvent] = []
            for await event in stream {
                seen.append(event)
                if predicate(seen) { break }
            }
            return seen
        },
        {
            try await Task.sleep(for: .seconds(60))
            return nil
        })
    return (seen ?? nil) ?? []
}

/// In this process, against the test run's own avahi-daemon in its private namespace
/// (reached through its bus socket): that daemon's 127.0.0.1 is the namespace's loopback.
@Suite(.serialized, .timeLimit(.minutes(10)), .enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
struct DNSSDDiscoveryTests {
    @Test func twoAdvertisersOnLoopbackFindEachOtherWithTheirNodeIDs() async throws {
        try await LoopbackAvahi.withDaemon { why in
            if let why {
                Issue.record("the test run's avahi-daemon did not start: \(why)")
                return
            }
            let suffix = UInt32.random(in: 0...UInt32.max)
            let a = DNSSDDiscovery(configuration: .init(
                advertisement: .init(instanceName: "ferry-a-\(suffix)", nodeID: id("a"), group: "g\(suffix)", protocolVersion: 1, port: 41001),
                group: "g\(suffix)"))
            let b = DNSSDDiscovery(configuration: .init(
                advertisement: .init(instanceName: "ferry-b-\(suffix)", nodeID: id("b"), group: "g\(suffix)", protocolVersion: 1, port: 41002),
                group: "g\(suffix)"))
            let group = ServiceGroup(services: [a, b], logger: Logger(label: "test"))
            let runner = Task { try await group.run() }
            let seenByA = await waitFor(a.events) { events in
                events.contains { if case .appeared(let p) = $0 { return p.nodeID == id("b") && !p.addresses.isEmpty }; return false }
            }
            guard case .appeared(let peer)? = seenByA.last else { Issue.record("no peer"); return }
            #expect(peer.port == 41002)
            #expect(peer.addresses.contains("127.0.0.1"))
            #expect(peer.group == "g\(suffix)")
            #expect(peer.protocolVersion == 1)
            #expect(peer.source == .dnsSD)
            // A never reports itself.
            #expect(!seenByA.contains { if case .appeared(let p) = $0 { return p.nodeID == id("a") }; return false })
            await group.triggerGracefulShutdown()
            try await runner.value
        }
    }
}
