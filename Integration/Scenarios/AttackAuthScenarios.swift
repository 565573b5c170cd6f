import Foundation
import IntegrationHarness
import Testing

/// Password, login-throttle and session attacks replayed against real `ferry serve`
/// processes (Integration/attacks/test_auth.py starts its own nodes from this build's binary):
/// guessing at the replication listener's Basic check and at CouchDB logins, in a row and in
/// parallel, from a second address; a session cookie carried to the other listener; a
/// password looked for in the command line.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackAuthScenarios {
    @Test func passwordGuessingCrossListenerCookiesAndPasswordsInArgvAreRefused() async throws {
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        var environment = ProcessInfo.processInfo.environment
        environment["FERRY_BINARY"] = Ferry.binary
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let result = try await Shell.run(
            ["-m", "pytest", CouchSuite.root + "/Integration/attacks/test_auth.py", "-q", "-p", "no:cacheprovider", "-rfE"],
            executable: python, environment: environment, timeout: 500)
        if result.status != 0 {
            Issue.record("pytest test_auth.py exited \(result.status):\n\(result.stdout.suffix(6000))\n\(result.stderr.suffix(2000))")
        }
    }
}
