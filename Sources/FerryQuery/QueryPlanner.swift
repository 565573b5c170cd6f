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

/// Chooses the index for a `_find` as CouchDB 3 does (or better), and derives its key ranges.
public enum QueryPlanner {
    /// The warning CouchDB sends when no index helps.
    public static let noIndexWarning = "No matching index found, create an index to optimize query time."

    /// Plans `query` over the `ready` indexes. `unavailable` lists indexes that exist but are
    /// still being built: they are never read, only named in warnings (for `use_index`).
    /// Throws CouchDB's 400 errors: `no_usable_index` for a sort no index serves, and for a
    /// `use_index` that cannot be used when `allow_fallback` is false.
    public static func plan(_ query: MangoQuery, ready: [MangoIndex], unavailable: [MangoIndex] = []) throws(MangoError)
        -> QueryPlan
    {
        // Minimal plan until the planner lands: a full `_all_docs` scan.
        if !query.sort.allSatisfy({ $0.path.components == ["_id"] }) {
            throw .invalidQuery(error: "no_usable_index", reason: "No index exists for this sort, try indexing by the sort fields.")
        }
        return QueryPlan(
            source: .allDocs, ranges: [.all], descending: query.sort.first?.descending ?? false,
            warnings: [noIndexWarning])
    }
}
