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
        /// A streamed reply whose properties were whole and given out (`data` then stays empty).
        var headGiven = false
    }

    /// What one frame gave: a whole message, an acknowledgement to send, or nothing yet.
    public struct Outcome: Sendable, Equatable {
        public var message: BLIPMessage?
        /// An ACK frame to send back (its data: the varint bytes received of that message).
        public var ack: BLIPFrame?
        /// Bytes the peer acknowledged of one of this side's messages: (type, number, bytes).
        public var acknowledged: (type: BLIPMessageType, number: UInt64, bytes: UInt64)?
        /// Part of a reply received as a stream (see `streamReply`).
        public var part: BLIPStreamPart?

        public static func == (a: Outcome, b: Outcome) -> Bool {
            a.message == b.message && a.ack == b.ack && a.part == b.part && a.acknowledged?.type == b.acknowledged?.type
                && a.acknowledged?.number == b.acknowledged?.number && a.acknowledged?.bytes == b.acknowledged?.bytes
        }
    }

    private var requests: [UInt64: Partial] = [:]
    private var replies: [UInt64: Partial] = [:]
    /// The highest request number begun: requests must begin in order.
    private var lastRequest: UInt64 = 0
    /// Replies to be given out as they arrive rather than whole (see `streamReply`).
    private var streamed: Set<UInt64> = []
    /// The most bytes one message may take.
    public let maxMessageSize: Int
    /// Acknowledge every this many bytes received of one message.
    public let ackThreshold: Int

    public init(maxMessageSize: Int = 64 << 20, ackThreshold: Int = 50_000) {
        self.maxMessageSize = maxMessageSize
        self.ackThreshold = ackThreshold
    }

    /// Gives the reply to this side's request `number` out in parts as its frames arrive
    /// (its properties first, then its body as it comes), so a reply as large as a blob never
    /// sits whole in memory and `maxMessageSize` does not bound it: the receiver of the parts
    /// bounds it. An error reply is still given whole.
    public mutating func streamReply(_ number: UInt64) {
        streamed.insert(number)
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
        let streaming = frame.type == .response && streamed.contains(frame.number)
        if !streaming {
            guard partial.data.count + frame.data.count <= maxMessageSize else { throw BLIPError("message \(frame.number) exceeds \(maxMessageSize) bytes") }
        }
        var part: BLIPStreamPart?
        if streaming {
            part = try streamedPart(of: &partial, frame)
        } else {
            partial.data += frame.data
        }
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
            return Outcome(ack: ack, part: part)
        }
        if isRequest {
            requests[frame.number] = nil
        } else {
            replies[frame.number] = nil
            streamed.remove(frame.number)
        }
        if streaming { return Outcome(part: part) }
        return Outcome(message: try BLIPMessage(type: frame.type, number: frame.number, flags: partial.flags, encoded: partial.data))
    }

    /// The part one frame of a streamed reply gives: nothing while its properties are still
    /// incomplete, then the head (properties) with the body bytes that came with it, then body bytes.
    private func streamedPart(of partial: inout Partial, _ frame: BLIPFrame) throws(BLIPError) -> BLIPStreamPart? {
        let last = !frame.flags.contains(.moreComing)
        if partial.headGiven { return BLIPStreamPart(number: frame.number, body: frame.data, isLast: last) }
        partial.data += frame.data
        // The properties' length (a varint of at most 10 bytes), then the properties themselves.
        guard let (length, n) = Varint.read(partial.data, at: 0) else {
            guard partial.data.count < 10, !last else { throw BLIPError("reply \(frame.number) lacks its properties' length") }
            return nil
        }
        guard length <= UInt64(BLIPMessage.maxPropertiesSize) else { throw BLIPError("properties exceed \(BLIPMessage.maxPropertiesSize) bytes") }
        let end = n + Int(length)
        guard partial.data.count >= end else {
            if last { throw BLIPError("reply \(frame.number) is shorter than its properties' length") }
            return nil
        }
        let head = try BLIPMessage(type: partial.type, number: frame.number, flags: partial.flags, encoded: Array(partial.data[..<end]))
        let body = Array(partial.data[end...])
        partial.data = []
        partial.headGiven = true
        return BLIPStreamPart(number: frame.number, head: head, body: body, isLast: last)
    }
}

/// Part of a reply received as a stream: the head (its properties, with an empty body) comes
/// with the first part, then the body bytes in order; `isLast` on the final one.
public struct BLIPStreamPart: Sendable, Equatable {
    public var number: UInt64
    public var head: BLIPMessage?
    public var body: [UInt8]
    public var isLast: Bool

    public init(number: UInt64, head: BLIPMessage? = nil, body: [UInt8], isLast: Bool) {
        self.number = number
        self.head = head
        self.body = body
        self.isLast = isLast
    }
}
