import FerryCore

/// A parsed CouchDB Mango selector that decides whether a document matches.
public struct MangoSelector: Sendable {
    /// Parses a selector object; a malformed one throws with CouchDB's reason.
    public init(parsing value: JSON) throws(MangoError) {
        guard value.objectValue != nil else { throw .invalid("selector must be a JSON object") }
    }

    /// Whether `document` (its CouchDB JSON, with `_id`, `_rev`, …) matches.
    public func matches(_ document: JSON) -> Bool { false }
}

/// A selector CouchDB would refuse, with the reason it gives.
public enum MangoError: FerryError, Equatable {
    case invalid(String)
    public var domain: String { "query" }
    public var code: String { "invalid_selector" }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .invalid(let why): return why
        }
    }
}
