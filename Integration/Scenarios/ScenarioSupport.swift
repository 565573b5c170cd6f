import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Whether this machine must run every scenario (as root, and in CI): there a scenario that
/// cannot run fails; elsewhere those that need root are disabled, and the runner reports
/// them as skipped. Use as `.enabled(if: mustRunEverything, "why")`.
let mustRunEverything = getuid() == 0 || ProcessInfo.processInfo.environment["CI"] != nil

/// Ends a scenario: SIGTERM every node (each must exit 0) and check every log for crashes,
/// sanitizer reports and unexpected error lines.
func finish(_ cluster: Cluster, allowing allowed: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) async {
    let failures = await cluster.shutDown(allowedLogLines: allowed)
    for f in failures { Issue.record(Comment(rawValue: f), sourceLocation: sourceLocation) }
    cluster.cleanUp()
}

/// Brings the lab up, runs `body` in it and tears it down even when `body` fails; a lab
/// that cannot come up fails the scenario (the suite runs only where it must).
func withLab(_ k: Int, _ scenario: String, avahi: Bool = true, _ body: (Lab) async throws -> Void) async throws {
    if let why = await Lab.unavailableReason() {
        Issue.record("\(scenario): the LAN lab cannot run here: \(why)")
        return
    }
    let lab: Lab
    do { lab = try await Lab(hosts: k, avahi: avahi) } catch {
        Issue.record("\(scenario): the LAN lab did not come up: \(error)")
        return
    }
    do { try await body(lab) } catch {
        await lab.tearDown()
        throw error
    }
    await lab.tearDown()
}

extension JSON {
    var count: Int {
        switch self {
        case .array(let a): return a.count
        case .object(let o): return o.count
        default: return 0
        }
    }

    var items: [JSON] {
        if case .array(let a) = self { return a }
        return []
    }
}

/// Error lines that scenarios provoke on purpose and that are not node faults.
let expectedRefusals = [
    "revision rejected", "pushed revision rejected", "refused a peer certificate", "replication stopped", "request failed",
]
