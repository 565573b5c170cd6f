import Crypto

/// A revision identifier `generation-digest`: the generation counts edits from 1,
/// and the digest is the lowercase hex SHA-256 of the parent revision ID, the
/// deleted flag and the canonical body, so identical edits get identical IDs.
public struct RevisionID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let generation: Int
    /// `generation-digest`, built once: it is written with every stored revision, and the
    /// digest is read from its tail (one string per ID: IDs are parsed by the million).
    public let description: String

    /// 64 lowercase hex characters.
    public var digest: String { String(Substring(description.utf8.suffix(64))) }

    public init(generation: Int, digest: String) throws(RevisionIDError) {
        guard generation >= 1, generation <= Int(Int32.max) else { throw .invalid("\(generation)-\(digest)") }
        guard digest.utf8.count == 64, digest.utf8.allSatisfy(RevisionID.isLowerHex) else {
            throw .invalid("\(generation)-\(digest)")
        }
        self.generation = generation
        self.description = "\(generation)-\(digest)"
    }

    private init(checkedGeneration generation: Int, description: String) {
        self.generation = generation
        self.description = description
    }

    public static func == (a: RevisionID, b: RevisionID) -> Bool { a.description == b.description }
    public func hash(into hasher: inout Hasher) { hasher.combine(description) }

    /// Parses `"3-<64 hex>"`.
    public init(_ text: String) throws(RevisionIDError) {
        // Fast path: the canonical form (no leading zeros or sign) is kept as is, without a copy.
        var text = text
        if let generation = text.withUTF8({ Self.canonicalGeneration($0) }) {
            self.init(checkedGeneration: generation, description: text)
            return
        }
        guard let dash = text.utf8.firstIndex(of: UInt8(ascii: "-")),
            text.utf8[..<dash].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
            let generation = Int(Substring(text.utf8[..<dash]))
        else { throw .invalid(text) }
        let digest = String(Substring(text.utf8[text.utf8.index(after: dash)...]))
        try self.init(generation: generation, digest: digest)
    }

    /// The generation of `G-<64 lowercase hex>` with G in 1...Int32.max written without
    /// leading zeros; nil for anything else (which the slow path then judges).
    private static func canonicalGeneration(_ b: UnsafeBufferPointer<UInt8>) -> Int? {
        let digits = b.count - 65
        guard digits >= 1, digits <= 10, b[digits] == UInt8(ascii: "-"), b[0] != UInt8(ascii: "0") else { return nil }
        var generation = 0
        for i in 0..<digits {
            let d = b[i] &- 0x30
            guard d <= 9 else { return nil }
            generation = generation * 10 + Int(d)
        }
        guard generation <= Int(Int32.max) else { return nil }
        for i in (digits + 1)..<b.count where !isLowerHex(b[i]) { return nil }
        return generation
    }

    /// The winner order: higher generation first, then higher digest.
    public static func < (a: RevisionID, b: RevisionID) -> Bool {
        if a.generation != b.generation { return a.generation < b.generation }
        return a.description.utf8.suffix(64).lexicographicallyPrecedes(b.description.utf8.suffix(64))
    }

    /// Computes the ID of a new revision: generation is the parent's plus one, and the
    /// digest is SHA-256 over `parent-rev-id-or-empty`, a 0x00 separator, the deleted flag
    /// byte (0x01 or 0x00), and the canonical body bytes.
    public static func compute(parent: RevisionID?, deleted: Bool, canonicalBody: [UInt8]) -> RevisionID {
        var hasher = SHA256()
        if let parent { hasher.update(data: Array(parent.description.utf8)) }
        hasher.update(data: [0x00, deleted ? 0x01 : 0x00])
        hasher.update(data: canonicalBody)
        return RevisionID(generation: (parent?.generation ?? 0) + 1, digestBytes: hasher.finalize())
    }

    /// The digest as 32 raw bytes.
    public var digestBytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(32)
        appendDigestBytes(to: &out)
        return out
    }

    /// Appends the 32 digest bytes (tree encoding writes them for every revision).
    public func appendDigestBytes(to out: inout [UInt8]) {
        var text = description
        text.withUTF8 { u in
            var j = u.count - 64
            while j < u.count {
                out.append(Self.nibble(u[j]) << 4 | Self.nibble(u[j + 1]))
                j += 2
            }
        }
    }

    /// The value of a lowercase hex digit (validated when the ID was made).
    private static func nibble(_ c: UInt8) -> UInt8 { c <= 0x39 ? c &- 0x30 : c &- 0x57 }

    /// An ID from its generation and 32 digest bytes, written straight into one string.
    public init(generation: Int, digestBytes: some Sequence<UInt8>) {
        let prefix = "\(generation)-"
        let text = String(unsafeUninitializedCapacity: prefix.utf8.count + 64) { buffer in
            var i = 0
            for c in prefix.utf8 {
                buffer[i] = c
                i += 1
            }
            for b in digestBytes where i + 2 <= buffer.count {
                buffer[i] = Hex.digits[Int(b >> 4)]
                buffer[i + 1] = Hex.digits[Int(b & 0xF)]
                i += 2
            }
            return i
        }
        precondition(text.utf8.count == prefix.utf8.count + 64, "a revision digest is 32 bytes")
        self.generation = generation
        self.description = text
    }

    static func isLowerHex(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x61 && b <= 0x66)
    }
}

/// A string that is not a revision ID.
public enum RevisionIDError: FerryError, Equatable {
    case invalid(String)
    public var domain: String { "core" }
    public var code: String { "invalid_revision_id" }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .invalid(let s): return "invalid revision ID \"\(s)\": expected GENERATION-<64 lowercase hex digits>"
        }
    }
}

/// Lowercase hexadecimal encoding and decoding.
public enum Hex {
    static let digits: [UInt8] = Array("0123456789abcdef".utf8)

    public static func encode(_ bytes: some Sequence<UInt8>) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func decode(_ text: String) -> [UInt8]? {
        let u = Array(text.utf8)
        guard u.count % 2 == 0 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(u.count / 2)
        var i = 0
        while i < u.count {
            guard let hi = value(u[i]), let lo = value(u[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }

    static func value(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: return c - 0x30
        case 0x61...0x66: return c - 0x61 + 10
        case 0x41...0x46: return c - 0x41 + 10
        default: return nil
        }
    }
}
