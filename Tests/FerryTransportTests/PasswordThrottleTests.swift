import FerryCore
import Foundation
import IntegrationHarness
import NIOHTTP1
import Testing

@testable import FerryTransport

/// The replication listener's HTTP Basic check runs under the shared login throttle.
@Suite struct PasswordThrottleTests {
    static func head(_ user: String, _ password: String) -> HTTPRequestHead {
        var head = HTTPRequestHeadFixture.upgrade("/ferry/sync")
        head.headers.add(name: "Authorization", value: "Basic " + Data("\(user):\(password)".utf8).base64EncodedString())
        return head
    }

    static func configuration(_ throttle: LoginThrottle) -> WebSocketListener.Configuration {
        var config = WebSocketListener.Configuration()
        config.authentication = .password(user: "clinic", password: "s3cret", throttle: throttle)
        return config
    }

    @Test func wrongPasswordsPastTheLimitAreRefusedUnevaluatedAndTheRightOneWaits() {
        let clock = ManualClock()
        let config = Self.configuration(LoginThrottle(clock: clock))
        #expect(WebSocketListener.refusal(for: Self.head("clinic", "s3cret"), config: config, remote: "10.0.0.1") == nil)
        let statuses = (0..<300).map { WebSocketListener.refusal(for: Self.head("clinic", "guess-\($0)"), config: config, remote: "10.0.0.1") }
        #expect(statuses.filter { $0 == .unauthorized }.count == 10)
        #expect(statuses.filter { $0 == .tooManyRequests }.count == 290)
        #expect(WebSocketListener.refusal(for: Self.head("clinic", "s3cret"), config: config, remote: "10.0.0.1") == .tooManyRequests)
        // The account backs off: another address is refused too, until the backoff ends.
        #expect(WebSocketListener.refusal(for: Self.head("clinic", "s3cret"), config: config, remote: "10.0.0.2") == .tooManyRequests)
        clock.advance(by: .seconds(61))
        #expect(WebSocketListener.refusal(for: Self.head("clinic", "s3cret"), config: config, remote: "10.0.0.1") == nil)
    }

    @Test func aRequestWithoutCredentialsIsUnauthorizedWithoutCountingAsAGuess() {
        let config = Self.configuration(LoginThrottle(clock: ManualClock()))
        for _ in 0..<50 {
            #expect(WebSocketListener.refusal(for: HTTPRequestHeadFixture.upgrade("/ferry/sync"), config: config, remote: "10.0.0.1") == .unauthorized)
        }
        #expect(WebSocketListener.refusal(for: Self.head("clinic", "s3cret"), config: config, remote: "10.0.0.1") == nil)
    }
}
