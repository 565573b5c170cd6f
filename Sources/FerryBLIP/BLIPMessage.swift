import FerryCore

/// One whole BLIP message: its type and number, its flags, its properties (ordered key-value
/// strings) and its body. Encoded as a varint length of the properties, the properties as
/// NUL-terminated UTF-8 key and value strings, then the body.
public struct BLIPMessage: Sendable, Equatable {
    public var type: BLIPMessageType
    public var number: UInt64
    /// `urgent`, `noReply` and `compressed` (how its frames go); `moreComing` is the framer's.
    public var flags: BLIPFrameFlags
    public var properties: [(String, String)]
    public var body: [UInt8]

    /// The most bytes a message's encoded properties may take (Couchbase Lite's own limit).
    public static let maxPropertiesSize = 100 * 1024

    public init(type: BLIPMessageType, number: UInt64, flags: BLIPFrameFlags = [], properties: [(String, String)] = [], body: [UInt8] = []) {
        self.type = type
        self.number = number
        self.flags = flags
        self.properties = properties
        self.body = body
    }

    public static func == (a: BLIPMessage, b: BLIPMessage) -> Bool {
        a.type == b.type && a.number == b.number && a.flags == b.flags && a.body == b.body
            && a.properties.map { [$0.0, $0.1] } == b.properties.map { [$0.0, $0.1] }
    }

    /// The value of the first property named `key`.
    public subscript(key: String) -> String? { properties.first { $0.0 == key }?.1 }

    /// The message's encoded bytes, before framing.
    public func encoded() throws(BLIPError) -> [UInt8] {
        var props: [UInt8] = []
        for (key, value) in properties {
            guard !key.utf8.contains(0), !value.utf8.contains(0) else { throw BLIPError("a property holds a NUL byte") }
            props += Array(key.utf8) + [0] + Array(value.utf8) + [0]
        }
        guard props.count <= Self.maxPropertiesSize else { throw BLIPError("properties exceed \(Self.maxPropertiesSize) bytes") }
        var out: [UInt8] = []
        out.reserveCapacity(props.count + body.count + 4)
        Varint.write(UInt64(props.count), into: &out)
        return out + props + body
    }

    /// Reads a message's encoded bytes (its frames' data joined).
    public init(type: BLIPMessageType, number: UInt64, flags: BLIPFrameFlags, encoded bytes: [UInt8]) throws(BLIPError) {
        guard let (length, n) = Varint.read(bytes, at: 0) else { throw BLIPError("message lacks its properties' length") }
        guard length <= UInt64(Self.maxPropertiesSize) else { throw BLIPError("properties exceed \(Self.maxPropertiesSize) bytes") }
        guard UInt64(bytes.count - n) >= length else { throw BLIPError("message is shorter than its properties' length") }
        let end = n + Int(length)
        var strings: [String] = []
        var start = n
        for i in n..<end where bytes[i] == 0 {
            guard let s = String(validating: bytes[start..<i], as: UTF8.self) else { throw BLIPError("a property is not UTF-8") }
            strings.append(s)
            start = i + 1
        }
        guard start == end else { throw BLIPError("properties do not end with a NUL byte") }
        guard strings.count % 2 == 0 else { throw BLIPError("a property key has no value") }
        self.init(
            type: type, number: number, flags: flags.subtracting(.moreComing),
            properties: stride(from: 0, to: strings.count, by: 2).map { (strings[$0], strings[$0 + 1]) }, body: Array(bytes[end...]))
    }

    /// The message cut into frames of at most `maxFrameData` bytes of data each.
    public func frames(maxFrameData: Int = 16 * 1024) throws(BLIPError) -> [BLIPFrame] {
        let bytes = try encoded()
        let size = max(1, maxFrameData)
        var frames: [BLIPFrame] = []
        var start = 0
        repeat {
            let end = min(bytes.count, start + size)
            var flags = flags.subtracting(.moreComing)
            if end < bytes.count { flags.insert(.moreComing) }
            frames.append(BLIPFrame(number: number, type: type, flags: flags, data: Array(bytes[start..<end])))
            start = end
        } while start < bytes.count
        return frames
    }
}
