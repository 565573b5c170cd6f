import FerryCore

/// Fans values out to any number of AsyncStream subscribers.
package final class Broadcaster<T: Sendable>: Sendable {
    private let subscribers = Locked<[Int: AsyncStream<T>.Continuation]>([:])
    private let nextID = Locked(0)

    package init() {}

    package func subscribe() -> AsyncStream<T> {
        let id = nextID.withLock { n -> Int in
            n += 1
            return n
        }
        let (stream, continuation) = AsyncStream.makeStream(of: T.self, bufferingPolicy: .bufferingNewest(10_000))
        continuation.onTermination = { [weak self] _ in
            self?.subscribers.withLock { _ = $0.removeValue(forKey: id) }
        }
        subscribers.withLock { $0[id] = continuation }
        return stream
    }

    /// Builds the value only when someone listens: replication sends one per document.
    package func send(_ value: @autoclosure () -> T) {
        let targets = subscribers.withLock { $0.isEmpty ? [] : Array($0.values) }
        guard !targets.isEmpty else { return }
        let v = value()
        for c in targets { c.yield(v) }
    }

    package func finish() {
        let targets = subscribers.withLock { s -> [AsyncStream<T>.Continuation] in
            defer { s.removeAll() }
            return Array(s.values)
        }
        for c in targets { c.finish() }
    }
}

