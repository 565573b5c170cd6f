import Foundation
import IntegrationHarness
import Testing

/// Leaks through the CouchDB API replayed by restricted users of a real `ferry serve` under
/// the clinic's access rules (Integration/attacks/test_couch_leaks.py starts its own node
/// from this build's binary): another user's `_local` documents through `_local_docs`, an
/// uploaded HTML attachment run with a reader's session, and JSON refusals that hid their
/// reason.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackCouchScenarios {
    @Test func localDocsAttachmentsAndRefusedJSONLeakNothingToARestrictedUser() async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        var environment = ProcessInfo.processInfo.environment
        environment["FERRY_BINARY"] = Ferry.binary
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let result = try await Shell.run(
            ["-m", "pytest", CouchSuite.root + "/Integration/attacks/test_couch_leaks.py", "-q", "-p", "no:cacheprovider", "-rfE"],
            executable: python, environment: environment, timeout: 500)
        if result.status != 0 {
            Issue.record("pytest test_couch_leaks.py exited \(result.status):\n\(result.stdout.suffix(6000))\n\(result.stderr.suffix(2000))")
        }
    }
}
