import FerryCore
import Testing

/// The login throttle every password door shares: reservations before evaluation, per
/// address and per account, backoff with a cap, on a clock the test moves.
@Suite struct LoginThrottleTests {
    /// A clock that moves only when the test says so.
    final class StepClock: Clock, Sendable {
        struct Instant: InstantProtocol {
            var offset: Duration
            func advanced(by d: Duration) -> Instant { Instant(offset: offset + d) }
            func duration(to other: Instant) -> Duration { other.offset - offset }
            static func < (a: Instant, b: Instant) -> Bool { a.offset < b.offset }
        }
        private let current = Locked(Instant(offset: .zero))
        var now: Instant { current.withLock { $0 } }
        var minimumResolution: Duration { .nanoseconds(1) }
        func advance(_ d: Duration) { current.withLock { $0 = $0.advanced(by: d) } }
        func sleep(until deadline: Instant, tolerance: Duration?) async throws { advance(now.duration(to: deadline)) }
    }

    static func policy(address: Int = 10, account: Int = 5) -> LoginThrottle.Policy {
        var p = LoginThrottle.Policy()
        p.maxFailuresPerAddress = address
        p.accountFailuresBeforeBackoff = account
        return p
    }

    @Test func parallelAttemptsBeyondTheLimitAreRefusedBeforeAnyFinishes() {
        let throttle = LoginThrottle(policy: Self.policy(address: 10, account: 1000), clock: StepClock())
        // 100 attempts reserved at once, none finished yet: only 10 may be evaluated.
        let results = (0..<100).map { _ in throttle.reserve(account: "alice", address: "10.0.0.1") }
        let admitted = results.compactMap { try? $0.get() }
        #expect(admitted.count == 10)
        #expect(results.allSatisfy { if case .failure(let r) = $0 { r.scope == .address } else { true } })
        for attempt in admitted { throttle.finish(attempt, succeeded: false) }
        if case .success = throttle.reserve(account: "alice", address: "10.0.0.1") { Issue.record("an eleventh attempt was admitted") }
    }

    @Test func theAddressWindowSlidesAndOtherAddressesAreUntouched() {
        let clock = StepClock()
        let throttle = LoginThrottle(policy: Self.policy(address: 3, account: 1000), clock: clock)
        for _ in 0..<3 { throttle.finish(try! throttle.reserve(account: "u\(Int.random(in: 0..<1000))", address: "a").get(), succeeded: false) }
        guard case .failure(let refusal) = throttle.reserve(account: "x", address: "a") else {
            Issue.record("a fourth attempt from the same address was admitted")
            return
        }
        #expect(refusal.scope == .address && refusal.retryAfter <= .seconds(60))
        #expect((try? throttle.reserve(account: "x", address: "b").get()) != nil)
        clock.advance(.seconds(61))
        #expect((try? throttle.reserve(account: "x", address: "a").get()) != nil)
    }

    @Test func aSecondAddressIsRefusedForAnAccountUnderAttack() {
        let throttle = LoginThrottle(policy: Self.policy(address: 100, account: 5), clock: StepClock())
        for _ in 0..<5 { throttle.finish(try! throttle.reserve(account: "alice", address: "10.0.0.1").get(), succeeded: false) }
        guard case .failure(let refusal) = throttle.reserve(account: "alice", address: "10.0.0.2") else {
            Issue.record("another address could keep guessing alice's password")
            return
        }
        #expect(refusal.scope == .account)
        #expect(throttle.check(account: "alice", address: "10.0.0.2") != nil)
        // Other accounts from the same addresses are not affected.
        #expect((try? throttle.reserve(account: "bob", address: "10.0.0.2").get()) != nil)
    }

    @Test func parallelGuessesAtOneAccountFromManyAddressesStopAtTheThreshold() {
        let throttle = LoginThrottle(policy: Self.policy(address: 100, account: 5), clock: StepClock())
        let admitted = (0..<50).compactMap { i in try? throttle.reserve(account: "alice", address: "10.0.1.\(i)").get() }
        #expect(admitted.count == 5)
    }

    @Test func anAccountBacksOffExponentiallyUpToTheCapNeverForGood() {
        let clock = StepClock()
        let policy = Self.policy(address: 1_000_000, account: 3)
        let throttle = LoginThrottle(policy: policy, clock: clock)
        var waits: [Duration] = []
        for _ in 0..<60 {
            switch throttle.reserve(account: "alice", address: "attacker") {
            case .success(let attempt): throttle.finish(attempt, succeeded: false)
            case .failure(let refusal):
                waits.append(refusal.retryAfter)
                clock.advance(refusal.retryAfter)
            }
        }
        #expect(waits.first == .seconds(1))
        #expect(waits.contains(.seconds(2)) && waits.contains(.seconds(4)))
        #expect(waits.max() == policy.maximumBackoff)
        #expect(waits.count < 60, "an attempt was admitted after each backoff")
        // After the last backoff, the right password gets in and clears the account.
        clock.advance(policy.maximumBackoff)
        let attempt = try! throttle.reserve(account: "alice", address: "home").get()
        throttle.finish(attempt, succeeded: true)
        #expect(throttle.check(account: "alice", address: "elsewhere") == nil)
    }

    @Test func anAddressThatLoggedInIsNotLockedOutByAnotherAddressesGuesses() {
        let throttle = LoginThrottle(policy: Self.policy(address: 100, account: 3), clock: StepClock())
        throttle.finish(try! throttle.reserve(account: "alice", address: "home").get(), succeeded: true)
        for _ in 0..<3 { throttle.finish(try! throttle.reserve(account: "alice", address: "attacker").get(), succeeded: false) }
        if case .success = throttle.reserve(account: "alice", address: "attacker") { Issue.record("the attacker was not backed off") }
        #expect((try? throttle.reserve(account: "alice", address: "home").get()) != nil)
    }

    @Test func failuresAreSummarisedAtMostOncePerInterval() {
        let clock = StepClock()
        let summaries = Locked<[LoginThrottle.Summary]>([])
        let throttle = LoginThrottle(policy: Self.policy(address: 100, account: 100), clock: clock) { s in summaries.withLock { $0.append(s) } }
        for i in 0..<5 { throttle.finish(try! throttle.reserve(account: "u", address: "a\(i)").get(), succeeded: false) }
        #expect(summaries.withLock { $0.count } == 1)
        clock.advance(.seconds(61))
        throttle.finish(try! throttle.reserve(account: "u", address: "z").get(), succeeded: false)
        #expect(summaries.withLock { $0.map(\.failures) } == [1, 5])
    }

    @Test func secretsCompareEqualOnlyWhenIdentical() {
        #expect(LoginThrottle.constantTimeEquals(Array("s3cret".utf8), Array("s3cret".utf8)))
        #expect(!LoginThrottle.constantTimeEquals(Array("s3cret".utf8), Array("s3cre".utf8)))
        #expect(!LoginThrottle.constantTimeEquals(Array("s3cret".utf8), Array("s3cres".utf8)))
        #expect(!LoginThrottle.constantTimeEquals([UInt8](), Array("x".utf8)))
    }
}
