import Dispatch

/// Runs a blocking call (a file write, an `fsync`, a rename) on threads made for blocking
/// work, and awaits its result: Swift's cooperative pool has one thread per core, so a call
/// that blocks on it holds up every task of the process (`ferry_scheduler_lag_seconds`
/// shows it). The queue is a labelled concurrent one, which libdispatch lets grow a thread
/// for each blocked item rather than wait for a free one.
public enum BlockingIO {
    static let queue = DispatchQueue(label: "ferry.blocking-io", attributes: .concurrent)

    public static func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<T, any Error>) in
            queue.async { c.resume(with: Result { try work() }) }
        }
    }
}
