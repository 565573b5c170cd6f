import FerryCore

/// What a query reads: the `_all_docs` special index (live documents in ID order, keys are the
/// IDs' UTF-8 bytes) or a JSON index (keys from `MangoIndex.key(for:)`).
public enum ScanSource: Sendable, Hashable {
    case allDocs
    case index(MangoIndex)
}

/// How a `_find` is answered: which index is read, over which key ranges and in which
/// direction, and what to tell the client. The index only narrows; every document read is
/// still matched against the whole selector.
public struct QueryPlan: Sendable {
    public var source: ScanSource
    /// The key ranges to read, in scan order (descending scans list them from the top), not
    /// overlapping; empty means nothing can match.
    public var ranges: [KeyRange]
    public var descending: Bool
    /// Sent with the results as CouchDB's `warning` (joined by newlines, as CouchDB does).
    public var warnings: [String]
    /// CouchDB's `_explain` members that describe the choice (`index_candidates`,
    /// `selector_hints`, `mrargs`, `covering`); the caller adds the request's own members.
    public var explanation: [String: JSON]

    public init(
        source: ScanSource, ranges: [KeyRange], descending: Bool = false, warnings: [String] = [],
        explanation: [String: JSON] = [:]
    ) {
        self.source = source
        self.ranges = ranges
        self.descending = descending
        self.warnings = warnings
        self.explanation = explanation
    }
}
