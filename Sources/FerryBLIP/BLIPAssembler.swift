import FerryCore

/// Joins the frames one side receives into whole messages, and says when to acknowledge
/// bytes received (BLIP's flow control: a sender pauses a message whose unacknowledged bytes
/// pass its window). Bytes are counted as Couchbase Lite counts them: each frame's bytes on
/// the wire after its header. Requests and replies are numbered apart: a request's number is
/// the peer's, a reply's is the number of this side's request.
public struct BLIPAssembler: Sendable {
    /// A message partly received.
    struct Partial {
        var type: BLIPMessageType
        var flags: BLIPFrameFlags
        var data: [UInt8]
        /// Wire bytes received, and those received since the last ACK.
        var received: Int
        var unacknowledged: Int
    }

    /// What one frame gave: a whole message, an acknowledgement to send, or nothing yet.
    public struct Outcome: Sendable, Equatable {
        public var message: BLIPMessage?
        /// An ACK frame to send back (its data: the varint bytes received of that message).
        public var ack: BLIPFrame?
        /// Bytes the peer acknowledged of one of this side's messages: (type, number, bytes).
        public var acknowledged: (type: BLIPMessageType, number: UInt64, bytes: UInt64)?

        public static func == (a: Outcome, b: Outcome) -> Bool {
            a.message == b.message && a.ack == b.ack && a.acknowledged?.type == b.acknowledged?.type
                && a.acknowledged?.number == b.acknowledged?.number && a.acknowledged?.bytes == b.acknowledged?.bytes
        }
    }

    private var requests: [UInt64: Partial] = [:]
    private var replies: [UInt64: Partial] = [:]
    /// The highest request number begun: requests must begin in order.
    private var lastRequest: UInt64 = 0
    /// The most bytes one message may take.
    public let maxMessageSize: Int
    /// Acknowledge every this many bytes received of one message.
    public let ackThreshold: Int

    public init(maxMessageSize: Int = 64 << 20, ackThreshold: Int = 50_000) {
        self.maxMessageSize = maxMessageSize
        self.ackThreshold = ackThreshold
    }

    /// Takes the next frame received.
    public mutating func receive(_ frame: BLIPFrame) throws(BLIPError) -> Outcome {
        if frame.type.isAck {
            guard let (bytes, n) = Varint.read(frame.data, at: 0), n == frame.data.count else { throw BLIPError("ACK frame is malformed") }
            // An ACK of requests acknowledges a request this side sent; of responses, a reply it sent.
            return Outcome(acknowledged: (frame.type == .ackRequest ? .request : .response, frame.number, bytes))
        }
        let isRequest = frame.type == .request
        var partial: Partial
        if let existing = isRequest ? requests[frame.number] : replies[frame.number] {
            guard existing.type == frame.type else { throw BLIPError("frame of message \(frame.number) changed its type") }
            partial = existing
        } else {
            if isRequest {
                guard frame.number > lastRequest else { throw BLIPError("request \(frame.number) begins after request \(lastRequest)") }
                lastRequest = frame.number
            }
            partial = Partial(type: frame.type, flags: frame.flags, data: [], received: 0, unacknowledged: 0)
        }
        guard partial.data.count + frame.data.count <= maxMessageSize else { throw BLIPError("message \(frame.number) exceeds \(maxMessageSize) bytes") }
        partial.data += frame.data
        partial.received += frame.countedSize
        partial.unacknowledged += frame.countedSize
        if frame.flags.contains(.moreComing) {
            var ack: BLIPFrame?
            if partial.unacknowledged >= ackThreshold {
                partial.unacknowledged = 0
                var count: [UInt8] = []
                Varint.write(UInt64(partial.received), into: &count)
                ack = BLIPFrame(number: frame.number, type: isRequest ? .ackRequest : .ackResponse, flags: [.urgent, .noReply], data: count)
            }
            if isRequest { requests[frame.number] = partial } else { replies[frame.number] = partial }
            return Outcome(ack: ack)
        }
        if isRequest { requests[frame.number] = nil } else { replies[frame.number] = nil }
        return Outcome(message: try BLIPMessage(type: frame.type, number: frame.number, flags: partial.flags, encoded: partial.data))
    }
}
