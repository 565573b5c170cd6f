/// One replaceable callback, set and called from any thread; calling an empty slot does nothing.
///
/// Why not `Locked<(@Sendable (A) -> R)?>` (or a `Mutex`): reading a closure out of
/// `withLock { $0 }` writes it back through a reabstraction thunk, so every call wrapped the stored closure in
/// two more thunks. A callback called per socket read grew a chain of hundreds of thousands
/// of thunks: each call slower than the last, then a stack overflow. Here the closure sits in
/// an immutable box, and only the box's reference passes through the lock.
public final class CallbackSlot<Argument, Output>: Sendable {
    private final class Box: Sendable {
        let call: @Sendable (Argument) -> Output
        init(_ call: @escaping @Sendable (Argument) -> Output) { self.call = call }
    }

    private let box = Locked<Box?>(nil)

    public init() {}

    /// Sets the callback, replacing any earlier one.
    public func set(_ call: @escaping @Sendable (Argument) -> Output) {
        let fresh = Box(call)
        box.withLock { $0 = fresh }
    }

    /// Empties the slot.
    public func clear() { box.withLock { $0 = nil } }

    /// Calls the callback outside the lock; nil when the slot is empty.
    @discardableResult
    public func callAsFunction(_ argument: Argument) -> Output? {
        box.withLock { $0 }?.call(argument)
    }
}

extension CallbackSlot where Argument == Void {
    /// Calls a callback that takes no argument; nil when the slot is empty.
    @discardableResult
    public func callAsFunction() -> Output? { self(()) }
}
