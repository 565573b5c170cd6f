/// A point on one of the harness's test clocks: the time advanced since the clock was made.
public struct TestClockInstant: InstantProtocol {
    public var offset: Swift.Duration
    public func advanced(by d: Swift.Duration) -> TestClockInstant { TestClockInstant(offset: offset + d) }
    public func duration(to other: TestClockInstant) -> Swift.Duration { other.offset - offset }
    public static func < (a: TestClockInstant, b: TestClockInstant) -> Bool { a.offset < b.offset }
}

/// A clock whose sleeps end at once (after a yield), so that retry backoff and polling
/// loops in tests never wait on wall time. Its time never advances.
public struct ImmediateClock: Clock {
    public typealias Duration = Swift.Duration
    public typealias Instant = TestClockInstant
    public init() {}
    public var now: Instant { Instant(offset: .zero) }
    public var minimumResolution: Swift.Duration { .nanoseconds(1) }
    public func sleep(until deadline: Instant, tolerance: Swift.Duration?) async throws {
        try Task.checkCancellation()
        await Task.yield()
    }
}
