import FerryCore

/// The messages one side has to send on a connection, cut into frames and interleaved: each
/// turn sends the next frame of the message at the head of the queue and puts it back at the
/// tail (round robin), urgent messages ahead of normal ones without starving them, and a
/// message whose frames the peer has not acknowledged past `window` bytes waits for its ACK
/// (BLIP's flow control, as Couchbase Lite does it). Requests are numbered here, from 1.
public struct BLIPOutbox: Sendable {
    /// A message being sent: its encoded bytes and how far they went.
    struct Outgoing {
        var message: BLIPMessage
        /// The encoded message, or its head only when `source` gives the body.
        var bytes: [UInt8]
        var source: (any BLIPBodySource)?
        var offset = 0
        var total: Int { bytes.count + (source?.length ?? 0) }
        /// Wire bytes sent (after each frame's header), and those the peer acknowledged.
        var sent = 0
        var acknowledged = 0
        var started: Bool { offset > 0 }
        var urgent: Bool { message.flags.contains(.urgent) }
        var key: Key { Key(reply: message.type != .request, number: message.number) }
    }

    /// Requests and replies are numbered apart.
    struct Key: Hashable {
        var reply: Bool
        var number: UInt64
    }

    private var queue: [Outgoing] = []
    /// Messages waiting for an ACK before their next frame.
    private var waiting: [Key: Outgoing] = [:]
    private var lastRequest: UInt64 = 0
    public let maxFrameData: Int
    /// Unacknowledged wire bytes past which a message waits (Couchbase Lite: 128,000).
    public let window: Int

    public init(maxFrameData: Int = 16 * 1024, window: Int = 128_000) {
        self.maxFrameData = max(1, maxFrameData)
        self.window = window
    }

    /// Whether a frame is ready to send now.
    public var hasFrame: Bool { !queue.isEmpty }
    /// Messages not yet wholly sent (queued or waiting for an ACK).
    public var pending: Int { queue.count + waiting.count }

    /// Queues a message; a request gets the next request number (returned), a reply keeps the
    /// number of the request it answers.
    @discardableResult
    public mutating func enqueue(_ message: BLIPMessage) throws(BLIPError) -> UInt64 {
        var m = message
        if m.type == .request {
            lastRequest += 1
            m.number = lastRequest
        }
        let entry = Outgoing(message: m, bytes: try m.encoded())
        insert(entry, isNew: true)
        return m.number
    }

    /// Queues a reply whose body `source` reads as its frames go (a blob's content), so the
    /// body is never whole in memory; the message's own body is ignored.
    public mutating func enqueue(_ message: BLIPMessage, body source: any BLIPBodySource) throws(BLIPError) {
        var head = message
        head.body = []
        insert(Outgoing(message: head, bytes: try head.encoded(), source: source), isNew: true)
    }

    /// The next frame to send, encoded by `encode` (which holds the direction's checksum and
    /// compression, so frames must be encoded in the order they are sent); nil when none is
    /// ready.
    public mutating func nextFrame(encode: (BLIPFrame) throws(BLIPError) -> [UInt8]) throws(BLIPError) -> [UInt8]? {
        guard !queue.isEmpty else { return nil }
        var entry = queue.removeFirst()
        let total = entry.total
        let end = min(total, entry.offset + maxFrameData)
        var flags = entry.message.flags.subtracting(.moreComing)
        let more = end < total
        if more { flags.insert(.moreComing) }
        var data: [UInt8] = []
        if entry.offset < entry.bytes.count { data = Array(entry.bytes[entry.offset..<min(end, entry.bytes.count)]) }
        if let source = entry.source, end > entry.bytes.count {
            let from = max(entry.offset, entry.bytes.count) - entry.bytes.count
            let count = end - entry.bytes.count - from
            let read = try source.read(offset: from, count: count)
            guard read.count == count else { throw BLIPError("a streamed body gave \(read.count) of \(count) bytes at \(from)") }
            data += read
        }
        let frame = BLIPFrame(number: entry.message.number, type: entry.message.type, flags: flags, data: data)
        let bytes = try encode(frame)
        entry.offset = end
        entry.sent += bytes.count - Self.headerLength(number: frame.number, flags: frame.type.rawValue | flags.rawValue)
        if more {
            if entry.sent - entry.acknowledged >= window { waiting[entry.key] = entry } else { insert(entry, isNew: false) }
        }
        return bytes
    }

    /// The peer acknowledged `bytes` wire bytes of one of this side's messages (an ACK of a
    /// request acknowledges a request sent here; of a response, a reply sent here). A message
    /// that waited for it goes back in the queue.
    public mutating func acknowledged(type: BLIPMessageType, number: UInt64, bytes: UInt64) {
        let key = Key(reply: type != .request, number: number)
        if var entry = waiting[key] {
            guard bytes <= UInt64(entry.sent) else { return }
            entry.acknowledged = max(entry.acknowledged, Int(bytes))
            if entry.sent - entry.acknowledged < window {
                waiting[key] = nil
                insert(entry, isNew: false)
            } else {
                waiting[key] = entry
            }
        } else if let i = queue.firstIndex(where: { $0.key == key }), bytes <= UInt64(queue[i].sent) {
            queue[i].acknowledged = max(queue[i].acknowledged, Int(bytes))
        }
    }

    /// Puts a message in the queue: a normal one at the tail; an urgent one after the last
    /// urgent one and after the first normal one behind it (so normal messages still move),
    /// and a new urgent one never ahead of a message not begun (messages begin in order).
    private mutating func insert(_ entry: Outgoing, isNew: Bool) {
        guard entry.urgent, !queue.isEmpty else {
            queue.append(entry)
            return
        }
        var index = queue.count
        if let lastUrgent = queue.lastIndex(where: \.urgent) {
            index = lastUrgent + 1
            if let normal = queue[index...].firstIndex(where: { !$0.urgent }) { index = normal + 1 }
        } else if let firstNormal = queue.firstIndex(where: { !$0.urgent }) {
            index = firstNormal + 1
        }
        if isNew, let unstarted = queue.lastIndex(where: { !$0.started }) { index = max(index, unstarted + 1) }
        queue.insert(entry, at: min(index, queue.count))
    }

    static func headerLength(number: UInt64, flags: UInt8) -> Int {
        var header: [UInt8] = []
        Varint.write(number, into: &header)
        Varint.write(UInt64(flags), into: &header)
        return header.count
    }
}

/// A body read as its frames are sent: `length` bytes, read `count` at a time from `offset`
/// (a blob file's reader). A failed read fails the connection, since the reply is begun.
public protocol BLIPBodySource: Sendable {
    var length: Int { get }
    func read(offset: Int, count: Int) throws(BLIPError) -> [UInt8]
}
