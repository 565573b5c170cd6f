import Foundation
import IntegrationHarness
import Testing

/// Attacks on a real `ferry serve`'s admin listener (Integration/attacks/test_admin_paths.py
/// starts its own nodes from this build's binary): every admin route under every spelling of
/// its path (`//`, a trailing `/`, `%2F`, dot segments, letter case) refused without the key,
/// a dashboard login link included, and the CouchDB listener's routes likewise; one dashboard
/// session opening 300 live event streams held to the per-session and total caps, the slots
/// given back when clients drop their connections.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackAdminScenarios {
    /// Runs one test of test_admin_paths.py and records its failures.
    static func pytest(_ test: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        try await CouchSuite.pytest(
            CouchSuite.root + "/Integration/attacks/test_admin_paths.py::" + test, environment: ["FERRY_BINARY": Ferry.binary], timeout: 500,
            sourceLocation: sourceLocation)
    }

    @Test func noSpellingOfAGuardedAdminRouteAnswersWithoutTheKey() async throws {
        try await Self.pytest("test_no_spelling_of_a_guarded_admin_route_answers_without_the_key")
    }

    @Test func noSpellingOfACouchDBRouteAnswersAnAnonymousCaller() async throws {
        try await Self.pytest("test_no_spelling_of_a_couchdb_route_answers_an_anonymous_caller")
    }

    @Test func eventStreamsAreCappedPerSessionAndInTotalAndFreedOnDisconnect() async throws {
        try await Self.pytest("test_event_streams_are_capped_per_session_and_in_total_and_freed_on_disconnect")
    }
}
