import FerryCore

/// One side of a BLIP connection without I/O: WebSocket binary messages in, whole BLIP
/// messages out; messages queued, WebSocket binary messages out. It owns the direction's
/// codecs, the assembler and the outbox, so frames are encoded in the order they are sent
/// and acknowledgements go out ahead of everything else. Not thread-safe: one owner drives it.
public struct BLIPConnection {
    private let decoder: BLIPFrameDecoder
    private let encoder = BLIPFrameEncoder()
    private var assembler: BLIPAssembler
    private var outbox: BLIPOutbox
    /// Encoded ACK frames: sent before the next queued frame (they carry no checksum, so
    /// their order against other frames does not matter to the peer's decoder).
    private var acks: [[UInt8]] = []

    public init(maxMessageSize: Int = 64 << 20, maxFrameData: Int = 16 * 1024) {
        decoder = BLIPFrameDecoder(maxFrameData: max(1 << 20, maxFrameData))
        assembler = BLIPAssembler(maxMessageSize: maxMessageSize)
        outbox = BLIPOutbox(maxFrameData: maxFrameData)
    }

    /// What one WebSocket message completed: a whole message, or a part of a streamed reply.
    public enum Received: Sendable, Equatable {
        case message(BLIPMessage)
        case part(BLIPStreamPart)
    }

    /// Takes one WebSocket binary message (one frame); returns the message it completed, if any.
    /// Parts of streamed replies are given by `receiveAny` only.
    public mutating func receive(_ bytes: [UInt8]) throws(BLIPError) -> BLIPMessage? {
        if case .message(let m) = try receiveAny(bytes) { return m }
        return nil
    }

    /// Takes one WebSocket binary message (one frame): the message it completed, or the part
    /// of a streamed reply it carried, if any.
    public mutating func receiveAny(_ bytes: [UInt8]) throws(BLIPError) -> Received? {
        let frame = try decoder.decode(bytes)
        let outcome = try assembler.receive(frame)
        if let ack = outcome.ack { acks.append(try encoder.encode(ack)) }
        if let a = outcome.acknowledged { outbox.acknowledged(type: a.type, number: a.number, bytes: a.bytes) }
        if let m = outcome.message { return .message(m) }
        if let p = outcome.part { return .part(p) }
        return nil
    }

    /// Queues a request (numbered here: the number is returned) or a reply (keeping the
    /// number of the request it answers).
    @discardableResult
    public mutating func send(_ message: BLIPMessage) throws(BLIPError) -> UInt64 {
        try outbox.enqueue(message)
    }

    /// Queues a request whose reply is received as a stream (`receiveAny` gives its parts).
    public mutating func send(_ message: BLIPMessage, streamingReply: Bool) throws(BLIPError) -> UInt64 {
        let number = try outbox.enqueue(message)
        if streamingReply { assembler.streamReply(number) }
        return number
    }

    /// Queues the reply to `request` with a body read from `source` as its frames go.
    public mutating func respond(to request: BLIPMessage, properties: [(String, String)] = [], body source: any BLIPBodySource) throws(BLIPError) {
        guard !request.flags.contains(.noReply) else { return }
        try outbox.enqueue(
            BLIPMessage(type: .response, number: request.number, flags: request.flags.intersection(.urgent), properties: properties), body: source)
    }

    /// Queues the reply to `request`: a response with properties and body.
    public mutating func respond(to request: BLIPMessage, properties: [(String, String)] = [], body: [UInt8] = [], compressed: Bool = false) throws(BLIPError) {
        guard !request.flags.contains(.noReply) else { return }
        var flags: BLIPFrameFlags = request.flags.intersection(.urgent)
        if compressed && !body.isEmpty { flags.insert(.compressed) }
        try outbox.enqueue(BLIPMessage(type: .response, number: request.number, flags: flags, properties: properties, body: body))
    }

    /// Queues an error reply to `request` (`Error-Domain`, `Error-Code`, the message as body).
    public mutating func fail(_ request: BLIPMessage, domain: String, code: Int, message: String) throws(BLIPError) {
        guard !request.flags.contains(.noReply) else { return }
        try outbox.enqueue(
            BLIPMessage(
                type: .error, number: request.number, flags: request.flags.intersection(.urgent),
                properties: [("Error-Domain", domain), ("Error-Code", String(code))], body: Array(message.utf8)))
    }

    /// Whether a WebSocket message is ready to go.
    public var hasOutgoing: Bool { !acks.isEmpty || outbox.hasFrame }

    /// The next WebSocket binary message to send, or nil when nothing is ready (messages
    /// may still wait for the peer's ACK).
    public mutating func nextOutgoing() throws(BLIPError) -> [UInt8]? {
        if !acks.isEmpty { return acks.removeFirst() }
        let encoder = self.encoder
        return try outbox.nextFrame { frame throws(BLIPError) in try encoder.encode(frame) }
    }
}

extension BLIPMessage {
    /// The request's profile (`Profile` property): what it asks for.
    public var profile: String? { self["Profile"] }

    /// A reply's error, if it is one: domain, code and message.
    public var error: (domain: String, code: Int, message: String)? {
        guard type == .error else { return nil }
        return (self["Error-Domain"] ?? "BLIP", Int(self["Error-Code"] ?? "") ?? 0, String(decoding: body, as: UTF8.self))
    }

    /// A request with a profile and properties.
    public static func request(_ profile: String, _ properties: [(String, String)] = [], body: [UInt8] = [], flags: BLIPFrameFlags = []) -> BLIPMessage {
        BLIPMessage(type: .request, number: 0, flags: flags, properties: [("Profile", profile)] + properties, body: body)
    }
}
