import FerryCore

/// A bidirectional pipe of whole messages: WebSocket, a framed byte stream, or an
/// in-memory pair. Replication runs over any implementation.
///
/// `incoming` yields each received message once, in order, and finishes (or throws a
/// `SyncError`) when the peer closes or the pipe fails. `close` is idempotent.
public protocol MessageEndpoint: Sendable {
    /// Whether the transport carries whole messages or a byte stream framed by Ferry.
    var transport: EndpointTransport { get }
    func send(_ message: [UInt8]) async throws(SyncError)
    var incoming: AsyncThrowingStream<[UInt8], any Error> { get }
    /// Closes the endpoint; `error` tells the peer why (nil for a normal close).
    func close(error: SyncError?) async
    /// The peer's network address, when the transport has one (for listings, not trust).
    var remoteAddress: String? { get }
    /// Reports bytes as the transport reads them, before they make a whole message; nil
    /// when the transport cannot (then only whole messages show the peer alive).
    var receiveActivity: ReceiveActivity? { get }
}

extension MessageEndpoint {
    public var remoteAddress: String? { nil }
    public var receiveActivity: ReceiveActivity? { nil }
}

/// Tells whoever watches a connection's liveness that bytes arrived, so a large message
/// crossing a slow link counts as life while it is still incomplete.
public final class ReceiveActivity: Sendable {
    private let observer = CallbackSlot<Void, Void>()

    public init() {}

    /// Called by the transport for every read of bytes from the peer.
    public func bytesArrived() {
        observer()
    }

    /// Sets the one observer (the connection's watchdog); replaces any earlier one.
    func observe(_ handler: @escaping @Sendable () -> Void) {
        observer.set(handler)
    }
}

/// The two kinds of transport a message endpoint can sit on.
public enum EndpointTransport: Sendable {
    /// Each send arrives as one message (WebSocket binary messages, in-memory).
    case messageStream
    /// A raw byte pipe (stdio, Unix socket); Ferry adds length framing.
    case byteStream
}

/// Length framing for byte-stream endpoints: each message is preceded by its length as
/// an unsigned LEB128 varint. Feed bytes in any chunking; complete messages come out.
public struct LengthFramer: Sendable {
    public let maximumMessageSize: Int
    private var buffer: [UInt8] = []
    private var start = 0

    public init(maximumMessageSize: Int = SyncProtocol.maxReplyMessageBytes) { self.maximumMessageSize = maximumMessageSize }

    public static func frame(_ message: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(message.count + 5)
        Varint.write(UInt64(message.count), into: &out)
        out.append(contentsOf: message)
        return out
    }

    /// Appends received bytes and returns every message now complete.
    public mutating func feed(_ bytes: some Collection<UInt8>) throws(SyncError) -> [[UInt8]] {
        buffer.append(contentsOf: bytes)
        var messages: [[UInt8]] = []
        while true {
            guard start < buffer.count else { break }
            guard let (length, used) = Varint.read(buffer, at: start) else {
                if buffer.count - start > 10 { throw .protocolViolation("bad frame length") }
                break
            }
            guard length <= UInt64(maximumMessageSize) else {
                throw .protocolViolation("frame of \(length) bytes exceeds the \(maximumMessageSize)-byte limit")
            }
            let end = start + used + Int(length)
            guard end <= buffer.count else { break }
            messages.append(Array(buffer[(start + used)..<end]))
            start = end
        }
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 1 << 16 {
            buffer.removeFirst(start)
            start = 0
        }
        return messages
    }
}
