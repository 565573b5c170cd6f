/// Runs operations side by side and returns the first to finish, cancelling the others:
/// the one form of "wait for this, a deadline, or a stop".
public enum Race {
    /// The result (or error) of whichever operation ends first. The rest are cancelled and
    /// awaited before this returns, so none outlives the call.
    public static func first<T: Sendable>(_ operations: (@Sendable () async throws -> T)...) async throws -> T {
        try await first(of: operations)
    }

    /// `first` for a list built at run time (a deadline or a stop only when there is one).
    public static func first<T: Sendable>(of operations: [@Sendable () async throws -> T]) async throws -> T {
        try await withThrowingTaskGroup(of: T.self) { group in
            for operation in operations { group.addTask(operation: operation) }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { throw CancellationError() }
            return first
        }
    }
}
