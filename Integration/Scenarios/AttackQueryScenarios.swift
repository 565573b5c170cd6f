import Foundation
import IntegrationHarness
import Testing

/// Attacks on Mango queries replayed against a real `ferry serve`: the pytest file
/// Integration/attacks/test_query.py starts its node from the built binary and asserts each
/// refusal (a 200,000-value `$in`, an abandoned long query, a catastrophic `$regex`, and a
/// restricted user's `execution_stats` and `_explain` probes).
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackQueryScenarios {
    @Test func queryAttacksAreRefusedAndAbandonedQueriesStop() async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        var environment = ProcessInfo.processInfo.environment
        environment["FERRY_BINARY"] = Ferry.binary
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let file = CouchSuite.root + "/Integration/attacks/test_query.py"
        let result = try await Shell.run(
            ["-m", "pytest", file, "-q", "-s", "-p", "no:cacheprovider", "-rfEs"],
            executable: python, environment: environment, timeout: 540)
        let output = result.stdout + (result.stderr.isEmpty ? "" : "\n--- stderr ---\n" + result.stderr)
        print(output)
        if result.status != 0 {
            Attachment.record(output, named: "pytest-test_query.py.txt")
            let tail = output.split(separator: "\n", omittingEmptySubsequences: false).suffix(120).joined(separator: "\n")
            Issue.record("pytest test_query.py exited \(result.status):\n\(tail)")
        }
    }
}
