import FerryCore

/// The kind of a BLIP message, held in the low three bits of each frame's flags.
public enum BLIPMessageType: UInt8, Sendable, Hashable {
    case request = 0
    case response = 1
    case error = 2
    /// Flow control: the receiver of a request tells how many of its bytes it has taken in.
    case ackRequest = 4
    /// Flow control: the receiver of a response tells how many of its bytes it has taken in.
    case ackResponse = 5

    var isAck: Bool { self == .ackRequest || self == .ackResponse }
    /// A reply (response or error) to a request.
    var isReply: Bool { self == .response || self == .error }
}

/// A frame's flag bits besides its type, as Couchbase Lite's BLIP 3 sets them.
public struct BLIPFrameFlags: OptionSet, Sendable, Hashable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// The frame's data went through the direction's deflate context.
    public static let compressed = BLIPFrameFlags(rawValue: 0x08)
    public static let urgent = BLIPFrameFlags(rawValue: 0x10)
    /// A request that wants no reply.
    public static let noReply = BLIPFrameFlags(rawValue: 0x20)
    /// More frames of this message follow.
    public static let moreComing = BLIPFrameFlags(rawValue: 0x40)

    static let typeMask: UInt8 = 0x07
    static let known: UInt8 = typeMask | 0x08 | 0x10 | 0x20 | 0x40
}

/// One BLIP frame: a chunk of one message, as one WebSocket binary message carries it.
/// `data` is the frame's share of the encoded message, uncompressed (an ACK's is the
/// varint count of bytes received).
public struct BLIPFrame: Sendable, Equatable {
    public var number: UInt64
    public var type: BLIPMessageType
    public var flags: BLIPFrameFlags
    public var data: [UInt8]
    /// The bytes the frame took on the wire after its header (data as sent, compressed or
    /// not, and its checksum): what flow control counts. Set by the decoder.
    public var wireSize: Int?

    public init(number: UInt64, type: BLIPMessageType, flags: BLIPFrameFlags = [], data: [UInt8], wireSize: Int? = nil) {
        self.number = number
        self.type = type
        self.flags = flags
        self.data = data
        self.wireSize = wireSize
    }

    public static func == (a: BLIPFrame, b: BLIPFrame) -> Bool {
        a.number == b.number && a.type == b.type && a.flags == b.flags && a.data == b.data
    }

    /// What flow control counts of this frame: its wire size, or as sent uncompressed.
    var countedSize: Int { wireSize ?? data.count + (type.isAck ? 0 : 4) }
}

/// What is wrong with bytes another node sent as BLIP; every case closes the connection.
public struct BLIPError: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { "BLIP: \(reason)" }
}
