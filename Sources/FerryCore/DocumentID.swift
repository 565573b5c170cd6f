/// A validated document identifier: non-empty, at most 250 UTF-8 bytes, no control
/// characters, and no leading `_` unless it starts with a reserved prefix.
public struct DocumentID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: String

    /// The longest permitted ID, in UTF-8 bytes.
    public static let maximumLength = 250
    /// Prefixes that may start with `_`. They are reserved for documents that Ferry
    /// itself manages, and for CouchDB's design documents (which the CouchDB API stores and
    /// peers replicate); user code may read them but `DocumentID(_:)` refuses them.
    public static let reservedPrefixes = ["_ferry/", "_design/"]
    /// The prefix of the documents a node keeps for itself (group members, addresses, access
    /// rules): replicated between Ferry nodes, never counted, listed or served as a user's.
    public static let nodeInternalPrefix = "_ferry/"

    /// Whether this is one of the node's own documents (`nodeInternalPrefix`).
    public var isNodeInternal: Bool { rawValue.hasPrefix(Self.nodeInternalPrefix) }

    /// Validates a user-supplied ID. Reserved prefixes are refused.
    public init(_ rawValue: String) throws(DocumentIDError) {
        try self.init(rawValue, allowReserved: false)
    }

    /// Validates an ID, optionally allowing the reserved prefixes (for Ferry's own documents
    /// and for IDs that arrive by replication).
    public init(_ rawValue: String, allowReserved: Bool) throws(DocumentIDError) {
        if rawValue.isEmpty { throw .empty }
        if rawValue.utf8.count > Self.maximumLength { throw .tooLong(rawValue.utf8.count) }
        if rawValue.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw .controlCharacter
        }
        if rawValue.hasPrefix("_") {
            let reserved = Self.reservedPrefixes.contains(where: { rawValue.hasPrefix($0) })
            if !reserved || !allowReserved { throw .reservedPrefix(rawValue) }
        }
        self.rawValue = rawValue
    }

    /// Wraps an ID that was validated before it was stored.
    public init(unchecked rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    public static func < (a: DocumentID, b: DocumentID) -> Bool {
        a.rawValue.utf8.lexicographicallyPrecedes(b.rawValue.utf8)
    }
}

/// Why a string is not a valid document ID.
public enum DocumentIDError: FerryError, Equatable {
    case empty
    case tooLong(Int)
    case controlCharacter
    case reservedPrefix(String)

    public var domain: String { "core" }
    public var code: String { "invalid_document_id" }
    public var failure: FailureKind { .invalidRequest }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .empty: return "invalid document ID: it is empty"
        case .tooLong(let n):
            return "invalid document ID: \(n) bytes long, the limit is \(DocumentID.maximumLength) UTF-8 bytes"
        case .controlCharacter: return "invalid document ID: it contains a control character"
        case .reservedPrefix(let id):
            return "invalid document ID \"\(id)\": IDs starting with '_' are reserved"
        }
    }
}
