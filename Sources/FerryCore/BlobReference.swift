import Crypto

/// The SHA-256 of a blob's content, written `sha256-<64 lowercase hex>`.
public struct BlobDigest: Hashable, Sendable, CustomStringConvertible, Comparable {
    public let hex: String

    public init(_ text: String) throws(BlobReferenceError) {
        let hex = text.hasPrefix("sha256-") ? String(text.dropFirst(7)) : text
        guard hex.utf8.count == 64, hex.utf8.allSatisfy(RevisionID.isLowerHex) else {
            throw .invalidDigest(text)
        }
        self.hex = hex
    }

    /// The digest of `content`.
    public static func of(_ content: some Sequence<UInt8>) -> BlobDigest {
        var h = SHA256()
        h.update(data: Array(content))
        return BlobDigest(uncheckedHex: Hex.encode(h.finalize()))
    }

    public init(uncheckedHex: String) { hex = uncheckedHex }
    public var description: String { "sha256-\(hex)" }
    public static func < (a: BlobDigest, b: BlobDigest) -> Bool { a.hex < b.hex }
}

/// A reference from a document body to a blob: an object
/// `{"@type":"blob","digest":"sha256-…","length":N}` anywhere in the body,
/// optionally with `"contentType"`.
public struct BlobReference: Hashable, Sendable {
    public let digest: BlobDigest
    public let length: Int64
    public let contentType: String?

    public init(digest: BlobDigest, length: Int64, contentType: String? = nil) {
        self.digest = digest
        self.length = length
        self.contentType = contentType
    }

    /// The JSON object that refers to this blob.
    public var json: JSON {
        var fields: [String: JSON] = [
            "@type": "blob", "digest": .string(digest.description), "length": .int(length),
        ]
        if let contentType { fields["contentType"] = .string(contentType) }
        return .object(fields)
    }
}

/// A malformed blob reference or digest.
public enum BlobReferenceError: FerryError, Equatable {
    case invalidDigest(String)
    case malformedReference(String)
    public var domain: String { "core" }
    public var code: String { "invalid_blob_reference" }
    public var failure: FailureKind { .invalidRequest }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .invalidDigest(let s): return "invalid blob digest \"\(s)\": expected sha256-<64 lowercase hex digits>"
        case .malformedReference(let why): return "malformed blob reference: \(why)"
        }
    }
}

extension JSON {
    /// Every blob reference in this value, in document order. Throws if an object
    /// says `"@type":"blob"` but lacks a valid digest or length.
    public func blobReferences() throws(BlobReferenceError) -> [BlobReference] {
        var found: [BlobReference] = []
        try collectBlobs(into: &found)
        return found
    }

    private func collectBlobs(into found: inout [BlobReference]) throws(BlobReferenceError) {
        switch self {
        case .array(let elements):
            for e in elements { try e.collectBlobs(into: &found) }
        case .object(let fields):
            if fields["@type"] == .string("blob") {
                guard let d = fields["digest"]?.stringValue else {
                    throw .malformedReference("missing \"digest\" string")
                }
                guard let len = fields["length"]?.intValue, len >= 0 else {
                    throw .malformedReference("missing or negative \"length\"")
                }
                found.append(
                    BlobReference(digest: try BlobDigest(d), length: len, contentType: fields["contentType"]?.stringValue))
            } else {
                for (_, v) in fields { try v.collectBlobs(into: &found) }
            }
        default: break
        }
    }
}
