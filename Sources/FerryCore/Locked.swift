#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A value guarded by a pthread mutex: `withLock` gives one thread at a time access to it.
///
/// Why not `Synchronization.Mutex`: on Linux it locks with raw futex system calls, which
/// ThreadSanitizer does not see, so it reported every access made under such a lock as a
/// race, and a real race would have drowned among them (Fuzz/README.md, "Sanitizers"). A
/// pthread mutex costs the same when uncontended, and the sanitizers understand it. Like
/// `Mutex`, it is never copied (a class), and a closure read out of it each call still pays
/// reabstraction thunks: keep callbacks in a `CallbackSlot`.
public final class Locked<Value>: @unchecked Sendable {
    // @unchecked: `value` is only touched inside `withLock`, under `mutex`.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    public init(_ value: Value) {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        self.value = value
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with exclusive access to the value; `body` must not call back into this lock.
    public func withLock<Result, E: Error>(_ body: (inout Value) throws(E) -> Result) throws(E) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
