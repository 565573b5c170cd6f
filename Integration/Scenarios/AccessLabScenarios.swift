import Foundation
import IntegrationHarness
import Testing

/// The clinic on four LAN-lab hosts (network namespaces on one bridge, real mDNS).
@Suite(
    .serialized, .timeLimit(.minutes(20)),
    .enabled(if: mustRunEverything, "the LAN lab needs root, `ip netns` and avahi-daemon (as root and in CI it always runs)"))
struct AccessLabScenarios {
    @Test func fourHostsEnforceTheWardRulesByEveryRouteAndPurgeWhatLeavesAWard() async throws {
        try await withLab(4, "access by content") { lab in
            let c = try await Clinic.make("lab-access", lab: lab, serve: ["--couch-port", "0"])
            defer { c.cluster.cleanUp() }
            try await c.holdsOnlyEachWardAndRemovesWhatLeavesIt()
            try await c.refusesForgedWritesAndRules()
            await finish(c.cluster, allowing: Clinic.allowedLogLines)
        }
    }
}
