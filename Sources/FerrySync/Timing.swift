import FerryCore
/// Runs `operation` against an optional deadline on `clock` and an optional stop stream;
/// returns its value, or nil when the deadline or the stop came first.
func firstOf<T: Sendable>(
    _ operation: @escaping @Sendable () async throws -> T, timeout limit: Duration?, clock: any Clock<Duration>,
    stop: AsyncStream<Void>? = nil
) async throws -> T? {
    var racers: [@Sendable () async throws -> T?] = [{ try await operation() }]
    if let limit {
        racers.append {
            try await clock.sleep(for: limit)
            return nil
        }
    }
    if let stop {
        racers.append {
            for await _ in stop { return nil }
            return nil
        }
    }
    return try await Race.first(of: racers)
}

/// Time elapsed on a clock since it was started.
struct Stopwatch: Sendable {
    let elapsed: @Sendable () -> Duration

    static func start<C: Clock<Duration>>(on clock: C) -> Stopwatch {
        let start = clock.now
        return Stopwatch { start.duration(to: clock.now) }
    }
}
