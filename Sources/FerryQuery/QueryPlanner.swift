import FerryCore

/// Chooses the index for a `_find` as CouchDB 3 does (or better), and derives its key ranges.
///
/// The choice follows CouchDB 3.4's Mango: the candidates are `_all_docs` and every JSON index
/// without a partial filter, plus the index `use_index` names; an index is usable when the
/// selector requires each of its fields to exist (sort fields, `_id` and `_rev` excepted) and
/// its order serves the sort; JSON indexes are preferred to `_all_docs`; among them the one
/// whose fields best match the selector's indexable fields, then the one with fewer fields,
/// then by design document and name. Ferry differs where CouchDB could answer wrongly: a
/// partial index is used only when the selector implies its filter.
public enum QueryPlanner {
    /// The warning CouchDB sends when no index helps.
    public static let noIndexWarning = "No matching index found, create an index to optimize query time."

    /// Plans `query` over the `ready` indexes. `unavailable` lists indexes that exist but are
    /// still being built: they are never read, only named in warnings (for `use_index`).
    /// Throws CouchDB's 400 errors: `no_usable_index` for a sort no index serves, and
    /// `invalid_index` for a `use_index` that cannot be used when `allow_fallback` is false.
    /// The `_explain` members are worked out only when `explaining` (a `_find` has no use for them).
    public static func plan(
        _ query: MangoQuery, ready: [MangoIndex], unavailable: [MangoIndex] = [], explaining: Bool = false
    ) throws(MangoError) -> QueryPlan {
        try Planning(query: query, ready: ready, unavailable: unavailable).plan(explaining: explaining)
    }

    /// The key ranges of `source` that hold every document `selector` matches (among those
    /// the index holds), in ascending order, disjoint; empty when nothing can match.
    public static func keyRanges(_ selector: MangoSelector, source: ScanSource) -> [KeyRange] {
        switch source {
        case .allDocs:
            return KeyRangeBuilder.ranges(for: selector.root, fields: [FieldPath(components: ["_id"])], spaces: [.rawID])
        case .index(let index):
            return KeyRangeBuilder.ranges(
                for: selector.root, fields: index.columns,
                spaces: index.columns.map { $0.components == ["_id"] ? .indexedID : .collated })
        }
    }

    /// Whether every document `selector` matches also matches `filter` (so an index with that
    /// partial filter holds every answer): each of the filter's top-level clauses is one of the
    /// selector's top-level clauses.
    public static func implies(_ selector: SelectorNode, _ filter: SelectorNode) -> Bool {
        let have = Set(topLevelClauses(selector))
        return topLevelClauses(filter).allSatisfy { have.contains($0) }
    }

    static func topLevelClauses(_ node: SelectorNode) -> [SelectorNode] {
        switch node {
        case .matchAll: return []
        case .and(let clauses): return clauses.flatMap(topLevelClauses)
        default: return [node]
        }
    }

    /// The paths every matching document has a value at: a condition other than
    /// `$exists: false` needs its field; `$and` needs what any clause needs, `$or` what every
    /// clause needs (nothing for `$or: []`, which matches everything).
    static func requiredPaths(_ node: SelectorNode) -> Set<FieldPath> {
        switch node {
        case .matchAll, .not, .nor: return []
        case .and(let clauses): return clauses.reduce(into: Set<FieldPath>()) { $0.formUnion(requiredPaths($1)) }
        case .or(let clauses):
            guard let first = clauses.first else { return [] }
            return clauses.dropFirst().reduce(requiredPaths(first)) { $0.intersection(requiredPaths($1)) }
        case .field(let path, let condition): return condition == .exists(false) ? [] : [path]
        }
    }

    /// The fields CouchDB's planner can narrow by: conditions `$lt`, `$lte`, `$eq`, `$gt`,
    /// `$gte`, `$beginsWith` or `$exists` in the selector's top-level `$and`.
    static func indexableFields(_ node: SelectorNode) -> [FieldPath] {
        var out: Set<FieldPath> = []
        for clause in topLevelClauses(node) {
            guard case .field(let path, let condition) = clause else { continue }
            switch condition {
            case .lt, .lte, .eq, .gt, .gte, .beginsWith, .exists: out.insert(path)
            default: break
            }
        }
        return out.sorted { CouchCollation.utf8Precedes($0.description, $1.description) }
    }

    /// Every field the selector names outside element sub-selectors.
    static func selectorFields(_ node: SelectorNode) -> [FieldPath] {
        switch node {
        case .matchAll, .not: return []
        case .and(let cs), .or(let cs), .nor(let cs): return cs.flatMap(selectorFields)
        case .field(let path, _): return [path]
        }
    }

    /// Whether `path` is held to one value by an `$eq` in the top-level `$and`.
    static func isConstant(_ node: SelectorNode, _ path: FieldPath) -> Bool {
        topLevelClauses(node).contains { clause in
            if case .field(let p, .eq) = clause { return p == path }
            return false
        }
    }
}

/// One `QueryPlanner.plan` call's working state.
struct Planning {
    // Its CouchDB field ranges and ranking are in QueryPlanner+FieldRanges.swift, its
    // `_explain` members in QueryPlanner+Explain.swift.

    /// A candidate index: `_all_docs` or a JSON index.
    enum Candidate: Hashable {
        case allDocs
        case json(MangoIndex)

        var columns: [FieldPath] {
            switch self {
            case .allDocs: return [FieldPath(components: ["_id"])]
            case .json(let index): return index.columns
            }
        }
        var json: JSON {
            switch self {
            case .allDocs: return MangoIndex.allDocsJSON
            case .json(let index): return index.json
            }
        }
        var designDocument: String? {
            if case .json(let index) = self { return index.designDocument }
            return nil
        }
        var name: String {
            switch self {
            case .allDocs: return "_all_docs"
            case .json(let index): return index.name
            }
        }
        var isPartial: Bool {
            if case .json(let index) = self { return index.partialFilter != nil }
            return false
        }
        /// CouchDB's tie-break order: design document ID, then name (`_all_docs` has none).
        static func precedes(_ a: Candidate, _ b: Candidate) -> Bool {
            let (da, db) = (a.designDocument ?? "", b.designDocument ?? "")
            if da != db { return CouchCollation.utf8Precedes(da, db) }
            return CouchCollation.utf8Precedes(a.name, b.name)
        }
    }

    let query: MangoQuery
    let ready: [MangoIndex]
    let unavailable: [MangoIndex]
    let root: SelectorNode
    let sortPaths: [FieldPath]
    /// `use_index` as `[designDocument (full ID)]` or `[designDocument, name]`; empty when not given.
    let useIndex: [String]
    /// The selector's required paths and indexable fields, worked out once per plan rather
    /// than once per candidate index (a third of an indexed `_find`'s planning).
    let requiredPaths: Set<FieldPath>
    let indexableFields: [FieldPath]

    init(query: MangoQuery, ready: [MangoIndex], unavailable: [MangoIndex]) {
        self.query = query
        self.ready = ready
        self.unavailable = unavailable
        self.root = query.selector.root
        self.sortPaths = query.sort.map(\.path)
        self.useIndex = Self.normalisedUseIndex(query.useIndex)
        self.requiredPaths = QueryPlanner.requiredPaths(root)
        self.indexableFields = QueryPlanner.indexableFields(root)
    }

    /// CouchDB splits a single `use_index` string at slashes: `"d"`, `"_design/d"`, `"d/n"`, `"_design/d/n"`.
    static func normalisedUseIndex(_ names: [String]) -> [String] {
        var parts = names
        if names.count == 1 {
            parts = names[0].split(separator: "/", omittingEmptySubsequences: false).map(String.init)
            if parts.first == "_design" && parts.count > 1 { parts.removeFirst() }
            if parts.count > 2 { parts = names }
        }
        guard let first = parts.first else { return [] }
        var out = [first.hasPrefix("_design/") ? first : "_design/" + first]
        if parts.count > 1 { out.append(parts[1]) }
        return out
    }

    func isNamedByUseIndex(_ c: Candidate) -> Bool {
        guard let ddoc = useIndex.first, c.designDocument == ddoc else { return false }
        return useIndex.count == 1 || c.name == useIndex[1]
    }

    var useIndexLabel: String {
        useIndex.count == 2 ? "\(useIndex[0]), \(useIndex[1])" : useIndex.first ?? ""
    }

    // MARK: - Usability

    struct Usability {
        var usable: Bool
        var reasons: [String]
    }

    func usability(_ c: Candidate) -> Usability {
        switch c {
        case .allDocs:
            if sortPaths.isEmpty { return Usability(usable: true, reasons: []) }
            let hasID = indexableFields.contains(FieldPath(components: ["_id"]))
            let sortOK = sortPaths == c.columns
            var reasons: [String] = []
            if !hasID { reasons.append("field_mismatch") }
            if !sortOK { reasons.append("sort_order_mismatch") }
            return Usability(usable: hasID && sortOK, reasons: reasons)
        case .json(let index):
            // Each column the selector requires, sort fields, `_id` and `_rev` excepted.
            let hasFields = index.columns.allSatisfy { column in
                column.components == ["_id"] || column.components == ["_rev"] || sortPaths.contains(column)
                    || requiredPaths.contains(column)
            }
            let sortOK = canUseSort(index.columns[...], sortPaths[...])
            var reasons: [String] = []
            if !hasFields { reasons.append("field_mismatch") }
            if !sortOK { reasons.append("sort_order_mismatch") }
            var usable = hasFields && sortOK
            if let filter = index.partialFilter, !QueryPlanner.implies(root, filter.root) {
                usable = false
                reasons.append("is_partial")
            }
            return Usability(usable: usable, reasons: reasons)
        }
    }

    /// The sort is a prefix of the columns once leading columns held constant by `$eq` are dropped.
    func canUseSort(_ columns: ArraySlice<FieldPath>, _ sort: ArraySlice<FieldPath>) -> Bool {
        guard let s = sort.first else { return true }
        guard let c = columns.first else { return false }
        if c == s { return columns.starts(with: sort) }
        return QueryPlanner.isConstant(root, c) && canUseSort(columns.dropFirst(), sort)
    }

    // MARK: - Plan

    func plan(explaining: Bool) throws(MangoError) -> QueryPlan {
        let all: [Candidate] = [.allDocs] + ready.map { .json($0) }
        let global = all.filter { !$0.isPartial }
        var pool = global
        for c in all where isNamedByUseIndex(c) && !pool.contains(c) { pool.append(c) }
        let usabilityMap = pool.map { ($0, usability($0)) }
        let usable = usabilityMap.filter { $0.1.usable }.map(\.0)
        if usable.isEmpty {
            throw .invalidQuery(error: "no_usable_index", reason: "No index exists for this sort, try indexing by the sort fields.")
        }

        var warnings: [String] = []
        let named = useIndex.isEmpty ? [] : usable.filter(isNamedByUseIndex)
        let chosenFrom: [Candidate]
        if named.isEmpty {
            guard query.allowFallback || (useIndex.isEmpty && usable.count > 1) else {
                throw invalidIndexError()
            }
            chosenFrom = usable
        } else {
            chosenFrom = named
        }
        let jsonGroup = chosenFrom.filter { if case .json = $0 { return true } else { return false } }
        let group = jsonGroup.isEmpty ? [Candidate.allDocs] : jsonGroup

        var ranges = fieldRanges()
        if group == [.allDocs] {
            // CouchDB's catch-all `_id` range starts above null (not at its minimum).
            ranges.append((FieldPath(components: ["_id"]), CouchRange(lowOp: "$gt", low: .value(.null), highOp: "$lt", high: .max)))
        }
        let sorted = rank(group, ranges: ranges)
        let winner = sorted[0]

        if !useIndex.isEmpty && !isNamedByUseIndex(winner.candidate) {
            warnings.append(contentsOf: useIndexWarnings(usability: usabilityMap))
        }
        if winner.candidate == .allDocs { warnings.append(QueryPlanner.noIndexWarning) }

        let descending = query.sort.first?.descending ?? false
        let source: ScanSource
        switch winner.candidate {
        case .allDocs: source = .allDocs
        case .json(let index): source = .index(index)
        }
        var keyRanges = QueryPlanner.keyRanges(query.selector, source: source)
        if root == .and([]) || root == .or([]) {
            // CouchDB answers a selector that is only `{"$and": []}` or `{"$or": []}` with no
            // documents (and no bookmark), though either matches everything elsewhere.
            keyRanges = []
        }
        if descending { keyRanges.reverse() }

        let explanation =
            explaining
            ? explain(
                winner: winner, sorted: sorted, all: all, global: global, pool: pool,
                usabilityMap: usabilityMap, usable: usable, chosenFrom: chosenFrom, group: group, descending: descending)
            : [:]
        return QueryPlan(
            source: source, ranges: keyRanges, descending: descending, warnings: warnings, explanation: explanation)
    }

    /// CouchDB's `invalid_index` error for a `use_index` it may not fall back from; Ferry says
    /// when the named index is still being built.
    func invalidIndexError() -> MangoError {
        if useIndex.isEmpty {
            return .invalidQuery(error: "invalid_index", reason: "You must specify an index with the `use_index` parameter.")
        }
        if unavailable.contains(where: { isNamedByUseIndex(.json($0)) }) {
            return .invalidQuery(
                error: "invalid_index",
                reason: "\(useIndexLabel) specified by `use_index` is still being built and cannot be used yet.")
        }
        return .invalidQuery(
            error: "invalid_index",
            reason: "\(useIndexLabel) specified by `use_index` could not be found or it is not suitable.")
    }

    /// Why the index `use_index` named was not used: CouchDB's warning, or Ferry's when the
    /// index is still being built or its partial filter could leave out answers.
    func useIndexWarnings(usability: [(Candidate, Usability)]) -> [String] {
        if unavailable.contains(where: { isNamedByUseIndex(.json($0)) })
            && !ready.contains(where: { isNamedByUseIndex(.json($0)) })
        {
            return ["\(useIndexLabel) is still being built, so it was not used for this query."]
        }
        let partial = usability.filter { isNamedByUseIndex($0.0) && $0.1.reasons == ["is_partial"] }
        if !partial.isEmpty {
            return [
                "\(useIndexLabel) was not used because its partial_filter_selector could leave out documents this selector matches; the selector must include each of its conditions."
            ]
        }
        if useIndex.count == 2 {
            return ["\(useIndexLabel) was not used because it is not a valid index for this query."]
        }
        return ["\(useIndexLabel) was not used because it does not contain a valid index for this query."]
    }
}
