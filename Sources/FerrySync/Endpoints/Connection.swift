import FerryCore

/// Multiplexes requests and replies over one message endpoint: numbers outgoing
/// requests, matches replies to waiting callers, and hands incoming requests to a handler.
public final class Connection: Sendable {
    /// Answers one incoming request; returns the reply (nil for no-reply requests).
    public typealias RequestHandler = @Sendable (Message) async -> Message?

    let endpoint: any MessageEndpoint
    let state = Locked(State())
    private let handler: RequestHandler?
    /// Bytes sent and received, for summaries.
    public let counters = Locked(Counters())

    /// Traffic totals of one connection.
    public struct Counters: Sendable {
        public var bytesSent = 0
        public var bytesReceived = 0
        public var messagesSent = 0
        public var messagesReceived = 0
        public init() {}
    }

    /// Outstanding requests and lifecycle, behind the mutex.
    struct State {
        var nextNumber: UInt64 = 1
        var pending: [UInt64: CheckedContinuation<Message, any Error>] = [:]
        var closedWith: SyncError?
        var reader: Task<Void, Never>?
        /// Heartbeats and the silence watchdog, once hello showed both sides offer them.
        var liveness: LivenessState?
        /// The latest heartbeat that arrived before this side armed its own (the peer starts
        /// as soon as its hello is done): applied once armed, so the peer's links, which it
        /// sends again only when they change, are not lost.
        var earlyHeartbeat: Message?
    }

    let metrics: SyncMetrics?

    public init(endpoint: any MessageEndpoint, handler: RequestHandler? = nil, metrics: SyncMetrics? = nil) {
        self.endpoint = endpoint
        self.handler = handler
        self.metrics = metrics
    }

    /// Starts reading incoming messages. Returns at once.
    public func start() {
        watchReceiveActivity()
        let task = Task { [self] in await self.readLoop() }
        state.withLock { $0.reader = task }
    }

    /// Runs until the endpoint closes, then fails every waiting request.
    public func run() async {
        watchReceiveActivity()
        await readLoop()
    }

    /// Counts partial reads as life (only while heartbeats run), so a chunk crossing a slow
    /// link never looks like silence.
    private func watchReceiveActivity() {
        endpoint.receiveActivity?.observe { [weak self] in self?.noteTraffic(sent: false) }
    }

    private func readLoop() async {
        var closeError = SyncError.disconnected("the peer closed the connection")
        do {
            for try await bytes in endpoint.incoming {
                counters.withLock {
                    $0.bytesReceived += bytes.count
                    $0.messagesReceived += 1
                }
                metrics?.bytes(received: bytes.count)
                noteTraffic(sent: false)
                let message: Message
                do { message = try Message(decoding: bytes) } catch {
                    closeError = error
                    await endpoint.close(error: error)
                    break
                }
                switch message.kind {
                case .request where message.profile == SyncProtocol.Profile.heartbeat:
                    // Answered by the connection itself, on either side; it never reaches the handler.
                    await receivedHeartbeat(message)
                case .request: dispatch(message)
                case .response, .error:
                    let waiter = state.withLock { $0.pending.removeValue(forKey: message.number) }
                    // A reply nobody waits for (a duplicate, or after a cancel) is ignored.
                    waiter?.resume(returning: message)
                }
            }
        } catch {
            closeError = SyncError.from(error)
        }
        failAll(closeError)
    }

    private func dispatch(_ request: Message) {
        guard let handler else {
            if request.flags & Message.flagNoReply == 0 {
                let reply = Message.errorReply(
                    to: request.number, .protocolViolation("this side does not accept requests"))
                // Unowned: one error reply; a send on a closed endpoint fails at once.
                Task { try? await self.sendRaw(reply) }
            }
            return
        }
        // Unowned: requests are answered concurrently; a handler ends with its reply, and a reply on a closed endpoint fails at once.
        Task {
            let reply = await handler(request)
            if let reply, request.flags & Message.flagNoReply == 0 {
                try? await self.sendRaw(reply)
            }
            // Heartbeats armed by hello start once its reply is out, so the first one never precedes it.
            self.beginArmedLiveness()
        }
    }

    private func failAll(_ error: SyncError) {
        let (waiters, reason) = state.withLock { s -> ([CheckedContinuation<Message, any Error>], SyncError) in
            if s.closedWith == nil { s.closedWith = error }
            let w = Array(s.pending.values)
            s.pending.removeAll()
            return (w, s.closedWith ?? error)
        }
        endLiveness()
        // The first reason wins: a local close's cause, not the stream end it brings about.
        for w in waiters { w.resume(throwing: reason) }
    }

    func sendRaw(_ message: Message) async throws(SyncError) {
        let bytes = message.encoded()
        counters.withLock {
            $0.bytesSent += bytes.count
            $0.messagesSent += 1
        }
        metrics?.bytes(sent: bytes.count)
        noteTraffic(sent: true)
        try await endpoint.send(bytes)
    }

    /// Sends a request and waits for its reply. An error reply throws the error it carries.
    public func request(_ profile: String, properties: [(String, String)] = [], body: [UInt8] = []) async throws(SyncError)
        -> Message
    {
        let (number, closed) = state.withLock { s -> (UInt64, SyncError?) in
            defer { s.nextNumber += 1 }
            return (s.nextNumber, s.closedWith)
        }
        if let closed { throw closed }
        let message = Message(kind: .request, number: number, properties: [("Profile", profile)] + properties, body: body)
        let reply: Message
        do {
            // Cancellation fails the wait at once (a late reply is then ignored), so a task
            // group racing a long-poll against a stop never waits out the heartbeat.
            reply = try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (c: CheckedContinuation<Message, any Error>) in
                    let closed = state.withLock { s -> SyncError? in
                        if let e = s.closedWith { return e }
                        s.pending[number] = c
                        return nil
                    }
                    if let closed {
                        c.resume(throwing: closed)
                        return
                    }
                    if Task.isCancelled {
                        state.withLock { $0.pending.removeValue(forKey: number) }?.resume(throwing: CancellationError())
                        return
                    }
                    // Unowned: one send; on failure it resumes the request's waiter, which `failAll` resumes anyway on close.
                    Task {
                        do { try await self.sendRaw(message) } catch {
                            let w = self.state.withLock { $0.pending.removeValue(forKey: number) }
                            w?.resume(throwing: error)
                        }
                    }
                }
            } onCancel: {
                state.withLock { $0.pending.removeValue(forKey: number) }?.resume(throwing: CancellationError())
            }
        } catch {
            throw SyncError.from(error)
        }
        if reply.kind == .error { throw reply.carriedError }
        return reply
    }

    /// Sends a JSON request and parses the JSON reply.
    public func requestJSON(_ profile: String, _ body: JSON) async throws(SyncError) -> JSON {
        try await request(profile, body: body.canonicalBytes).json()
    }

    /// Why the connection ended; nil while it is open.
    public var closeReason: SyncError? { state.withLock { $0.closedWith } }

    /// Closes the endpoint and fails waiting requests.
    public func close(error: SyncError? = nil) async {
        let reason = error ?? .disconnected("closed locally")
        // Recorded before the endpoint closes, so the read loop's end does not replace it.
        state.withLock { if $0.closedWith == nil { $0.closedWith = reason } }
        await endpoint.close(error: error)
        failAll(reason)
        let reader = state.withLock { $0.reader }
        reader?.cancel()
    }
}
