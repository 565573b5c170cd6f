import FerryCore

/// A clock that moves only when a test advances it, so that a test can hold a timed wait
/// open, see it pending, and then let it end.
public final class ManualClock: Clock, Sendable {
    public typealias Duration = Swift.Duration
    public typealias Instant = TestClockInstant

    private struct Sleeper {
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now = Instant(offset: .zero)
        var sleepers: [Int: Sleeper] = [:]
        var nextToken = 0
    }

    private let state = Locked(State())

    public init() {}

    public var now: Instant { state.withLock { $0.now } }
    public var minimumResolution: Swift.Duration { .nanoseconds(1) }

    /// The deadlines of the pending sleeps, as time since the clock was made.
    public var pendingDeadlines: [Swift.Duration] { state.withLock { $0.sleepers.values.map(\.deadline.offset) } }

    public func sleep(until deadline: Instant, tolerance: Swift.Duration?) async throws {
        let token = state.withLock { s -> Int in
            s.nextToken += 1
            return s.nextToken
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let early: Result<Void, any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if deadline <= s.now { return .success(()) }
                    s.sleepers[token] = Sleeper(deadline: deadline, continuation: c)
                    return nil
                }
                if let early { c.resume(with: early) }
            }
        } onCancel: {
            state.withLock { $0.sleepers.removeValue(forKey: token) }?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves the clock on, ending every sleep whose deadline it reaches.
    public func advance(by d: Swift.Duration) {
        let due = state.withLock { s -> [CheckedContinuation<Void, any Error>] in
            s.now = s.now.advanced(by: d)
            let now = s.now
            let ready = s.sleepers.filter { $0.value.deadline <= now }
            for key in ready.keys { s.sleepers.removeValue(forKey: key) }
            return ready.values.map(\.continuation)
        }
        for c in due { c.resume() }
    }
}
