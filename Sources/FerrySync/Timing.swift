/// Runs `operation` against an optional deadline on `clock` and an optional stop stream;
/// returns its value, or nil when the deadline or the stop came first.
func firstOf<T: Sendable>(
    _ operation: @escaping @Sendable () async throws -> T, timeout limit: Duration?, clock: any Clock<Duration>,
    stop: AsyncStream<Void>? = nil
) async throws -> T? {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await operation() }
        if let limit {
            group.addTask {
                try await clock.sleep(for: limit)
                return nil
            }
        }
        if let stop {
            group.addTask {
                for await _ in stop { return nil }
                return nil
            }
        }
        let first = try await group.next() ?? nil
        group.cancelAll()
        return first
    }
}

/// Time elapsed on a clock since it was started.
struct Stopwatch: Sendable {
    let elapsed: @Sendable () -> Duration

    static func start<C: Clock<Duration>>(on clock: C) -> Stopwatch {
        let start = clock.now
        return Stopwatch { start.duration(to: clock.now) }
    }
}
