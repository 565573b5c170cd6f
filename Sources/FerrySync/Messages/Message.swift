import FerryCore

/// One protocol message: a binary envelope (kind, request number, flags, properties)
/// followed by an opaque body. See docs/protocol.md for the byte layout.
public struct Message: Sendable, Equatable {
    /// Whether a message asks, answers, or answers with an error.
    public enum Kind: UInt8, Sendable {
        case request = 0
        case response = 1
        case error = 2
    }

    public var kind: Kind
    /// Chosen by the requester, unique per connection and direction; echoed by the reply.
    public var number: UInt64
    public var flags: UInt8
    /// Ordered string properties; `Profile` names the request.
    public var properties: [(String, String)]
    public var body: [UInt8]

    public static let flagNoReply: UInt8 = 0x01
    public static let protocolMagic: UInt8 = 0xFE

    public init(kind: Kind, number: UInt64, flags: UInt8 = 0, properties: [(String, String)] = [], body: [UInt8] = []) {
        self.kind = kind
        self.number = number
        self.flags = flags
        self.properties = properties
        self.body = body
    }

    public static func == (a: Message, b: Message) -> Bool {
        a.kind == b.kind && a.number == b.number && a.flags == b.flags && a.body == b.body
            && a.properties.elementsEqual(b.properties, by: { $0 == $1 })
    }

    public subscript(property: String) -> String? {
        properties.first(where: { $0.0 == property })?.1
    }

    public var profile: String? { self["Profile"] }

    /// `magic kind varint(number) flags varint(propsLen) props body`, where props is
    /// a sequence of `varint(len) key varint(len) value` in UTF-8.
    public func encoded() -> [UInt8] {
        var props: [UInt8] = []
        for (k, v) in properties {
            Varint.write(UInt64(k.utf8.count), into: &props)
            props.append(contentsOf: k.utf8)
            Varint.write(UInt64(v.utf8.count), into: &props)
            props.append(contentsOf: v.utf8)
        }
        var out: [UInt8] = [Self.protocolMagic, kind.rawValue]
        out.reserveCapacity(16 + props.count + body.count)
        Varint.write(number, into: &out)
        out.append(flags)
        Varint.write(UInt64(props.count), into: &out)
        out.append(contentsOf: props)
        out.append(contentsOf: body)
        return out
    }

    /// Decodes an envelope; any malformation is a protocol error, never a crash.
    public init(decoding bytes: [UInt8]) throws(SyncError) {
        guard bytes.count >= 5, bytes[0] == Self.protocolMagic else {
            throw .protocolViolation("not a Ferry message (bad magic or too short)")
        }
        guard let kind = Kind(rawValue: bytes[1]) else { throw .protocolViolation("unknown message kind \(bytes[1])") }
        var pos = 2
        guard let (number, n1) = Varint.read(bytes, at: pos) else { throw .protocolViolation("bad request number") }
        pos += n1
        guard pos < bytes.count else { throw .protocolViolation("truncated envelope") }
        let flags = bytes[pos]
        pos += 1
        guard let (propsLen, n2) = Varint.read(bytes, at: pos), propsLen <= UInt64(max(0, bytes.count - pos - n2)) else {
            throw .protocolViolation("bad properties length")
        }
        pos += n2
        let propsEnd = pos + Int(propsLen)
        var props: [(String, String)] = []
        while pos < propsEnd {
            guard let (kl, a) = Varint.read(bytes, at: pos), kl <= UInt64(max(0, propsEnd - pos - a)) else {
                throw .protocolViolation("bad property key")
            }
            pos += a
            let key = String(decoding: bytes[pos..<pos + Int(kl)], as: UTF8.self)
            pos += Int(kl)
            guard let (vl, b) = Varint.read(bytes, at: pos), vl <= UInt64(max(0, propsEnd - pos - b)) else {
                throw .protocolViolation("bad property value")
            }
            pos += b
            let value = String(decoding: bytes[pos..<pos + Int(vl)], as: UTF8.self)
            pos += Int(vl)
            props.append((key, value))
        }
        self.init(kind: kind, number: number, flags: flags, properties: props, body: Array(bytes[propsEnd...]))
    }

    /// The body parsed as JSON.
    public func json() throws(SyncError) -> JSON {
        do { return try JSON.parse(body) } catch {
            throw .protocolViolation("\(profile ?? "message") body: \(error.description)")
        }
    }

    /// An error reply carrying domain, code, transience and message.
    public static func errorReply(to number: UInt64, _ error: SyncError) -> Message {
        Message(
            kind: .error, number: number,
            properties: [
                ("Error-Domain", error.domain), ("Error-Code", error.code),
                ("Error-Transient", error.isTransient ? "true" : "false"),
            ],
            body: Array(error.message.utf8))
    }

    /// The error an error reply carries.
    public var carriedError: SyncError {
        SyncError(
            domain: self["Error-Domain"] ?? "sync", .init(name: self["Error-Code"] ?? "unknown"),
            message: String(decoding: body, as: UTF8.self), isTransient: self["Error-Transient"] == "true")
    }
}
