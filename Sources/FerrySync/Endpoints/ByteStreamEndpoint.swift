import FerryCore

/// A raw, ordered byte pipe in both directions (stdio, a Unix socket, a serial line):
/// what a transport provides for a byte-stream message endpoint.
public protocol ByteStream: Sendable {
    func write(_ bytes: [UInt8]) async throws(SyncError)
    /// Received bytes, in arbitrary chunks; finishes when the other side closes.
    var chunks: AsyncThrowingStream<[UInt8], any Error> { get }
    func close() async
}

/// A message endpoint over a byte stream: each message is sent with a varint length
/// prefix, and received messages are reassembled from any chunking (`LengthFramer`).
public final class FramedEndpoint: MessageEndpoint {
    public let transport: EndpointTransport = .byteStream
    public let incoming: AsyncThrowingStream<[UInt8], any Error>
    let stream: any ByteStream
    private let reader: Locked<Task<Void, Never>?> = Locked(nil)
    public let receiveActivity: ReceiveActivity? = ReceiveActivity()

    public init(_ stream: any ByteStream, maximumMessageSize: Int = SyncProtocol.maxReplyMessageBytes) {
        self.stream = stream
        let (incoming, continuation) = AsyncThrowingStream.makeStream(of: [UInt8].self, throwing: (any Error).self)
        self.incoming = incoming
        let activity = receiveActivity
        let task = Task {
            var framer = LengthFramer(maximumMessageSize: maximumMessageSize)
            do {
                for try await chunk in stream.chunks {
                    activity?.bytesArrived()
                    for message in try framer.feed(chunk) { continuation.yield(message) }
                }
                continuation.finish()
            } catch {
                continuation.finish(throwing: SyncError.from(error))
                await stream.close()
            }
        }
        reader.withLock { $0 = task }
        startWriter()
    }

    /// Frames from concurrent senders must not interleave on the byte stream, so every
    /// write goes through one queue drained by a single task, in order.
    private typealias PendingWrite = (bytes: [UInt8], done: CheckedContinuation<SyncError?, Never>)
    private let writes = AsyncStream.makeStream(of: PendingWrite.self)

    private func startWriter() {
        let stream = self.stream
        let queue = writes.stream
        // Unowned: the writer ends when `writes` finishes, which `close` does.
        Task {
            for await pending in queue {
                do {
                    try await stream.write(pending.bytes)
                    pending.done.resume(returning: nil)
                } catch {
                    pending.done.resume(returning: SyncError.from(error))
                }
            }
        }
    }

    public func send(_ message: [UInt8]) async throws(SyncError) {
        let framed = LengthFramer.frame(message)
        let failure = await withCheckedContinuation { (done: CheckedContinuation<SyncError?, Never>) in
            if case .terminated = writes.continuation.yield((framed, done)) {
                done.resume(returning: .disconnected("the endpoint is closed"))
            }
        }
        if let failure { throw failure }
    }

    public func close(error: SyncError?) async {
        writes.continuation.finish()
        await stream.close()
    }
}

/// Two connected in-memory byte streams that deliver writes in random-sized pieces,
/// so framing is exercised as a real pipe would.
public final class InMemoryByteStream: ByteStream {
    public let chunks: AsyncThrowingStream<[UInt8], any Error>
    private let continuation: AsyncThrowingStream<[UInt8], any Error>.Continuation
    private let peer = Locked<InMemoryByteStream?>(nil)
    private let maxChunk: Int

    init(maxChunk: Int) {
        (chunks, continuation) = AsyncThrowingStream.makeStream(of: [UInt8].self, throwing: (any Error).self)
        self.maxChunk = maxChunk
    }

    /// A connected pair; each write arrives split into pieces of at most `maxChunk` bytes.
    public static func pair(maxChunk: Int = 4096) -> (InMemoryByteStream, InMemoryByteStream) {
        let a = InMemoryByteStream(maxChunk: maxChunk)
        let b = InMemoryByteStream(maxChunk: maxChunk)
        a.peer.withLock { $0 = b }
        b.peer.withLock { $0 = a }
        return (a, b)
    }

    public func write(_ bytes: [UInt8]) async throws(SyncError) {
        guard let peer = peer.withLock({ $0 }) else { throw .disconnected("byte stream is closed") }
        var start = 0
        while start < bytes.count {
            let n = Int.random(in: 1...maxChunk)
            let end = min(bytes.count, start + n)
            peer.continuation.yield(Array(bytes[start..<end]))
            start = end
        }
    }

    public func close() async {
        let other = peer.withLock { p -> InMemoryByteStream? in
            defer { p = nil }
            return p
        }
        continuation.finish()
        other?.continuation.finish()
        other?.peer.withLock { $0 = nil }
    }
}
