import Crypto

/// A revision identifier `generation-hash`: the generation counts edits from 1; Ferry's own
/// revisions carry a SHA-256 digest (64 lowercase hex) of the parent revision ID, the deleted
/// flag and the canonical body, so identical edits get identical IDs and a body can be checked
/// against its ID; revisions made elsewhere (CouchDB's 32 hex, other printable hashes) keep
/// the hash they were given and cannot be checked.
public struct RevisionID: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// How the hash is spelled: this decides whether a body can be verified against it and
    /// how it sorts in the winner rule.
    public enum Form: UInt8, Sendable, CaseIterable {
        /// 64 lowercase hex digits: Ferry's SHA-256 digest, the only form that is verified.
        case ferryDigest = 0
        /// 32 hex digits, kept lowercase (CouchDB, PouchDB, Sync Gateway: an MD5); sorts as
        /// its 16 raw bytes, as CouchDB stores it.
        case hex32 = 1
        /// Any other hash of 1 to 128 printable characters; sorts as its text bytes.
        case text = 2
    }

    public let generation: Int
    /// `generation-hash`, built once: it is written with every stored revision, and the hash
    /// is read from its tail (one string per ID: IDs are parsed by the million).
    public let description: String
    public let form: Form

    /// The longest hash accepted, in bytes.
    public static let maxHashLength = 128

    /// True exactly for Ferry's form (64 lowercase hex): the only form whose body can be
    /// verified against the ID. Any revision in this form is verified, whoever sent it.
    public var isFerryDigest: Bool { form == .ferryDigest }

    /// The hash after the generation, as served (for `hex32`, lowercase).
    public var hashText: String { String(Substring(hashUTF8)) }

    /// The hash's UTF-8 bytes inside `description`.
    private var hashUTF8: Substring.UTF8View {
        let u = Substring(description).utf8
        switch form {
        case .ferryDigest: return u.suffix(64)
        case .hex32: return u.suffix(32)
        case .text: return u[u.index(after: u.firstIndex(of: Self.dash)!)...]
        }
    }

    /// The hash as CouchDB keeps and compares it: a 32-hex hash as its 16 raw bytes, any
    /// other as its text bytes.
    public var collationBytes: [UInt8] {
        let h = hashUTF8
        guard form == .hex32 else { return Array(h) }
        var out: [UInt8] = []
        out.reserveCapacity(16)
        var i = h.startIndex
        while i != h.endIndex {
            let hi = Self.nibble(h[i])
            i = h.index(after: i)
            out.append(hi << 4 | Self.nibble(h[i]))
            i = h.index(after: i)
        }
        return out
    }

    /// An ID from a generation and a hash in any accepted form (see `init(_:)`).
    public init(generation: Int, hash: String) throws(RevisionIDError) {
        guard generation >= 1, generation <= Int(Int32.max) else { throw .invalid(Self.quoted("\(generation)-\(hash)")) }
        var hash = hash
        guard let (text, form) = hash.withUTF8({ Self.canonicalHash($0) }) else {
            throw .invalid(Self.quoted("\(generation)-\(hash)"))
        }
        self.init(checkedGeneration: generation, description: "\(generation)-\(text)", form: form)
    }

    private init(checkedGeneration generation: Int, description: String, form: Form) {
        self.generation = generation
        self.description = description
        self.form = form
    }

    public static func == (a: RevisionID, b: RevisionID) -> Bool { a.description == b.description }
    public func hash(into hasher: inout Hasher) { hasher.combine(description) }

    /// Parses `GENERATION-HASH`. The generation is decimal, 1 to Int32.max (leading zeros are
    /// dropped). The hash is 1 to 128 characters of `A-Z a-z 0-9 . _ ~ + / = -`; 64 lowercase
    /// hex digits is Ferry's digest; 32 hex digits are lowercased and 16 characters become
    /// the 32 hex digits of their bytes (both as CouchDB stores them as 16 bytes and serves
    /// them), and any other 32-character hash is refused (CouchDB reads those as hex).
    public init(_ text: String) throws(RevisionIDError) {
        // Fast path: Ferry's form written canonically is kept as is, without a copy.
        var text = text
        if let generation = text.withUTF8({ Self.canonicalGeneration($0) }) {
            self.init(checkedGeneration: generation, description: text, form: .ferryDigest)
            return
        }
        let parsed: (Int, String, Form)? = text.withUTF8 { u in
            guard let dash = u.firstIndex(of: Self.dash), dash > 0 else { return nil }
            var generation = 0
            for i in 0..<dash {
                let d = u[i] &- 0x30
                guard d <= 9 else { return nil }
                generation = generation * 10 + Int(d)
                if generation > Int(Int32.max) { return nil }
            }
            guard generation >= 1,
                let (hash, form) = Self.canonicalHash(UnsafeBufferPointer(rebasing: u[(dash + 1)...]))
            else { return nil }
            return (generation, "\(generation)-\(hash)", form)
        }
        guard let (generation, description, form) = parsed else { throw .invalid(Self.quoted(text)) }
        self.init(checkedGeneration: generation, description: description, form: form)
    }

    /// The generation of `G-<64 lowercase hex>` with G in 1...Int32.max written without
    /// leading zeros; nil for anything else (which the slow path then judges).
    private static func canonicalGeneration(_ b: UnsafeBufferPointer<UInt8>) -> Int? {
        let digits = b.count - 65
        guard digits >= 1, digits <= 10, b[digits] == dash, b[0] != UInt8(ascii: "0") else { return nil }
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

    /// The hash as it is kept, and its form; nil if it is not an accepted hash.
    private static func canonicalHash(_ h: UnsafeBufferPointer<UInt8>) -> (String, Form)? {
        guard h.count >= 1, h.count <= maxHashLength, h.allSatisfy(isHashCharacter) else { return nil }
        switch h.count {
        case 64 where h.allSatisfy(isLowerHex):
            return (String(decoding: h, as: UTF8.self), .ferryDigest)
        case 32:
            guard h.allSatisfy({ Hex.value($0) != nil }) else { return nil }
            return (String(decoding: h.map { $0 >= 0x41 && $0 <= 0x46 ? $0 | 0x20 : $0 }, as: UTF8.self), .hex32)
        case 16:
            return (Hex.encode(h), .hex32)
        default:
            return (String(decoding: h, as: UTF8.self), .text)
        }
    }

    /// The winner order, CouchDB's: higher generation first, then the higher hash, compared
    /// bytewise as `collationBytes` (a proper prefix sorts first). Two Ferry digests, or any
    /// two hashes of the same sort kind, compare the same as their text.
    public static func < (a: RevisionID, b: RevisionID) -> Bool {
        if a.generation != b.generation { return a.generation < b.generation }
        if a.form == .ferryDigest && b.form == .ferryDigest {
            return a.description.utf8.suffix(64).lexicographicallyPrecedes(b.description.utf8.suffix(64))
        }
        // Lowercase hex of equal length sorts as the bytes it spells.
        if (a.form == .hex32) == (b.form == .hex32) { return a.hashUTF8.lexicographicallyPrecedes(b.hashUTF8) }
        return a.collationBytes.lexicographicallyPrecedes(b.collationBytes)
    }

    /// Computes the ID of a new revision: generation is the parent's plus one, and the
    /// digest is SHA-256 over `parent-rev-id-or-empty` (as printed, whatever its form), a
    /// 0x00 separator, the deleted flag byte (0x01 or 0x00), and the canonical body bytes.
    public static func compute(parent: RevisionID?, deleted: Bool, canonicalBody: [UInt8]) -> RevisionID {
        var hasher = SHA256()
        if let parent { hasher.update(data: Array(parent.description.utf8)) }
        hasher.update(data: [0x00, deleted ? 0x01 : 0x00])
        hasher.update(data: canonicalBody)
        return RevisionID(generation: (parent?.generation ?? 0) + 1, ferryDigestBytes: hasher.finalize())
    }

    /// The 32 bytes of a Ferry digest; nil for any other form.
    public var ferryDigestBytes: [UInt8]? {
        guard form == .ferryDigest else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(32)
        appendFerryDigestBytes(to: &out)
        return out
    }

    /// Appends the 32 digest bytes of a Ferry-form ID (tree encoding writes them for every revision).
    func appendFerryDigestBytes(to out: inout [UInt8]) {
        precondition(form == .ferryDigest, "only a Ferry digest has 32 digest bytes")
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

    /// A Ferry-form ID from its generation and 32 digest bytes, written straight into one string.
    public init(generation: Int, ferryDigestBytes digestBytes: some Sequence<UInt8>) {
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
        self.form = .ferryDigest
    }

    private static let dash = UInt8(ascii: "-")

    static func isLowerHex(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x61 && b <= 0x66)
    }

    /// `A-Z a-z 0-9 . _ ~ + / = -`: what a hash made elsewhere may contain.
    static func isHashCharacter(_ b: UInt8) -> Bool {
        switch b {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
        case UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "+"), UInt8(ascii: "/"),
            UInt8(ascii: "="), UInt8(ascii: "-"):
            return true
        default: return false
        }
    }

    /// The offending text for an error message, cut short if it is long.
    private static func quoted(_ text: String) -> String {
        text.utf8.count <= 200 ? text : String(text.prefix(200)) + "…"
    }
}

/// A string that is not a revision ID.
public enum RevisionIDError: FerryError, Equatable {
    case invalid(String)
    public var domain: String { "core" }
    public var code: String { "invalid_revision_id" }
    public var failure: FailureKind { .invalidRequest }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .invalid(let s):
            return "invalid revision ID \"\(s)\": expected GENERATION-HASH, a generation from 1 to 2147483647 "
                + "and a hash of 64 lowercase hex digits (Ferry), 32 hex digits (CouchDB), or 1 to 128 "
                + "other characters of A-Z a-z 0-9 . _ ~ + / = -"
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
