import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Whether this machine must run every scenario: as root (CI runs as root), a scenario that
/// cannot run is a failure, not a skip.
let mustRunEverything = getuid() == 0 || ProcessInfo.processInfo.environment["CI"] != nil

/// Reports a scenario that cannot run here: loudly, and as a failure where it must run.
func cannotRun(_ scenario: String, _ why: String) {
    let line = "INTEGRATION SCENARIO SKIPPED: \(scenario): \(why)"
    FileHandle.standardError.write(Data((line + "\n").utf8))
    print(line)
    if mustRunEverything { Issue.record(Comment(rawValue: line)) }
}

/// Polls until a condition holds (state, never a fixed sleep), or fails with `what`.
func waitFor(_ what: String, timeout: Double = 60, _ condition: () async throws -> Bool) async throws {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(50))
    }
    throw HarnessError("timed out after \(timeout) s waiting for: \(what)")
}

/// Ends a scenario: SIGTERM every node (each must exit 0) and check every log for crashes,
/// sanitizer reports and unexpected error lines.
func finish(_ cluster: Cluster, allowing allowed: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) async {
    let failures = await cluster.shutDown(allowedLogLines: allowed)
    for f in failures { Issue.record(Comment(rawValue: f), sourceLocation: sourceLocation) }
    cluster.cleanUp()
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
