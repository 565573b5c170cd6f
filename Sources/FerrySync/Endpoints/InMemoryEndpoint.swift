import FerryCore

/// Two connected in-memory message endpoints, for tests and simulations, with optional
/// fault injection: a failure after N messages, dropped connections, and a delivery hook
/// that may rewrite, delay or duplicate messages.
public final class InMemoryEndpoint: MessageEndpoint {
    public let transport: EndpointTransport = .messageStream
    public let incoming: AsyncThrowingStream<[UInt8], any Error>
    private let continuation: AsyncThrowingStream<[UInt8], any Error>.Continuation
    private let state: Locked<State>
    let faults: Faults

    /// The link to the peer and send count, behind the mutex.
    struct State {
        weak var peer: InMemoryEndpoint?
        var closed = false
        var sent = 0
    }

    /// Ways to make an in-memory link misbehave.
    public struct Faults: Sendable {
        /// After this many messages sent from this side, the link fails (transiently).
        public var failAfterMessages: Int?
        /// Called for every message this side sends; returns what the peer receives
        /// (empty drops it, two copies duplicate it). It may sleep to add latency.
        public var deliver: (@Sendable ([UInt8]) async -> [[UInt8]])?
        public init(failAfterMessages: Int? = nil, deliver: (@Sendable ([UInt8]) async -> [[UInt8]])? = nil) {
            self.failAfterMessages = failAfterMessages
            self.deliver = deliver
        }
    }

    init(faults: Faults) {
        (incoming, continuation) = AsyncThrowingStream.makeStream(of: [UInt8].self, throwing: (any Error).self)
        state = Locked(State())
        self.faults = faults
    }

    /// A connected pair: what `a` sends, `b` receives, and the reverse.
    public static func pair(faultsA: Faults = Faults(), faultsB: Faults = Faults()) -> (InMemoryEndpoint, InMemoryEndpoint) {
        let a = InMemoryEndpoint(faults: faultsA)
        let b = InMemoryEndpoint(faults: faultsB)
        a.state.withLock { $0.peer = b }
        b.state.withLock { $0.peer = a }
        return (a, b)
    }

    public func send(_ message: [UInt8]) async throws(SyncError) {
        let (peer, count, closed) = state.withLock { s -> (InMemoryEndpoint?, Int, Bool) in
            s.sent += 1
            return (s.peer, s.sent, s.closed)
        }
        if closed { throw .disconnected("endpoint is closed") }
        guard let peer else { throw .disconnected("peer is gone") }
        if let limit = faults.failAfterMessages, count > limit {
            let error = SyncError.disconnected("injected failure after \(limit) messages")
            fail(error)
            peer.fail(error)
            throw error
        }
        let deliveries = await faults.deliver?(message) ?? [message]
        for m in deliveries { peer.receive(m) }
    }

    func receive(_ message: [UInt8]) {
        let closed = state.withLock { $0.closed }
        if !closed { continuation.yield(message) }
    }

    func fail(_ error: SyncError) {
        let already = state.withLock { s -> Bool in
            defer { s.closed = true }
            return s.closed
        }
        if !already { continuation.finish(throwing: error) }
    }

    func finishNormally() {
        let already = state.withLock { s -> Bool in
            defer { s.closed = true }
            return s.closed
        }
        if !already { continuation.finish() }
    }

    public func close(error: SyncError?) async {
        let peer = state.withLock { $0.peer }
        finishNormally()
        if let error { peer?.fail(error) } else { peer?.finishNormally() }
    }
}
