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
        try await CouchSuite.pytest(
            CouchSuite.root + "/Integration/attacks/test_couch_leaks.py", environment: ["FERRY_BINARY": Ferry.binary], timeout: 500)
    }
}
