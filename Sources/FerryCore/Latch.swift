/// A value set once that any number of tasks await: every waiter, and every later one,
/// gets it; a cancelled waiter stops waiting with `CancellationError`.
public final class Latch<Value: Sendable>: Sendable {
    private struct State {
        var value: Value?
        var nextID = 0
        var waiters: [Int: CheckedContinuation<Value, any Error>] = [:]
    }
    private let state = Locked(State())

    public init() {}

    /// The value, once set.
    public var value: Value? { state.withLock { $0.value } }

    /// Sets the value (a second call changes nothing) and wakes every waiter.
    public func set(_ value: Value) {
        let (value, waiters) = state.withLock { s -> (Value, [CheckedContinuation<Value, any Error>]) in
            let kept = s.value ?? value
            s.value = kept
            defer { s.waiters = [:] }
            return (kept, Array(s.waiters.values))
        }
        for w in waiters { w.resume(returning: value) }
    }

    /// The value once set; throws `CancellationError` if the task is cancelled first.
    public func wait() async throws -> Value {
        let id = state.withLock { s -> Int in
            defer { s.nextID += 1 }
            return s.nextID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { c in
                let now = state.withLock { s -> Result<Value, any Error>? in
                    if let value = s.value { return .success(value) }
                    if Task.isCancelled { return .failure(CancellationError()) }
                    s.waiters[id] = c
                    return nil
                }
                if let now { c.resume(with: now) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume(throwing: CancellationError())
        }
    }
}
