/// A clock whose sleeps end at once (after a yield), so that retry backoff and polling
/// loops in tests never wait on wall time. Its time never advances.
public struct ImmediateClock: Clock {
    public typealias Duration = Swift.Duration
    /// A point on a clock that stays at zero.
    public struct Instant: InstantProtocol {
        public var offset: Swift.Duration
        public func advanced(by d: Swift.Duration) -> Instant { Instant(offset: offset + d) }
        public func duration(to other: Instant) -> Swift.Duration { other.offset - offset }
        public static func < (a: Instant, b: Instant) -> Bool { a.offset < b.offset }
    }
    public init() {}
    public var now: Instant { Instant(offset: .zero) }
    public var minimumResolution: Swift.Duration { .nanoseconds(1) }
    public func sleep(until deadline: Instant, tolerance: Swift.Duration?) async throws {
        try Task.checkCancellation()
        await Task.yield()
    }
}
