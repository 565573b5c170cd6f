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
private struct Planning {
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

    init(query: MangoQuery, ready: [MangoIndex], unavailable: [MangoIndex]) {
        self.query = query
        self.ready = ready
        self.unavailable = unavailable
        self.root = query.selector.root
        self.sortPaths = query.sort.map(\.path)
        self.useIndex = Self.normalisedUseIndex(query.useIndex)
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
            let hasID = QueryPlanner.indexableFields(root).contains(FieldPath(components: ["_id"]))
            let sortOK = sortPaths == c.columns
            var reasons: [String] = []
            if !hasID { reasons.append("field_mismatch") }
            if !sortOK { reasons.append("sort_order_mismatch") }
            return Usability(usable: hasID && sortOK, reasons: reasons)
        case .json(let index):
            let exempt = Set(sortPaths).union([FieldPath(components: ["_id"]), FieldPath(components: ["_rev"])])
            let needed = Set(index.columns).subtracting(exempt)
            let hasFields = needed.isSubset(of: QueryPlanner.requiredPaths(root))
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

    // MARK: - CouchDB's field ranges (for ranking and `_explain`)

    enum Limit: Hashable {
        case min, max
        case value(JSON)

        static func compare(_ a: Limit, _ b: Limit) -> CollationOrder {
            switch (a, b) {
            case (.min, .min), (.max, .max): return .same
            case (.min, _), (_, .max): return .ascending
            case (_, .min), (.max, _): return .descending
            case (.value(let x), .value(let y)): return CouchCollation.compare(x, y)
            }
        }
    }

    /// CouchDB's `{LowOp, Low, HighOp, High}` for one field.
    struct CouchRange: Hashable {
        var lowOp: String
        var low: Limit
        var highOp: String
        var high: Limit
    }

    /// CouchDB's `mango_idx_view:range`: the top-level conditions on `path` folded into one range;
    /// nil when they contradict each other.
    func couchRange(_ path: FieldPath) -> CouchRange? {
        var r = CouchRange(lowOp: "$gt", low: .min, highOp: "$lt", high: .max)
        for clause in QueryPlanner.topLevelClauses(root) {
            guard case .field(let p, let condition) = clause, p == path else { continue }
            let steps: [(String, JSON)]
            switch condition {
            case .lt(let v): steps = [("$lt", v)]
            case .lte(let v): steps = [("$lte", v)]
            case .gt(let v): steps = [("$gt", v)]
            case .gte(let v): steps = [("$gte", v)]
            case .eq(let v): steps = [("$eq", v)]
            case .beginsWith(let s): steps = [("$gte", .string(s)), ("$lte", .string(s + "\u{FFFF}"))]
            default: steps = []
            }
            for (op, v) in steps {
                guard let next = Self.narrow(r, op, v) else { return nil }
                r = next
            }
        }
        return r
    }

    private static func narrow(_ r: CouchRange, _ op: String, _ v: JSON) -> CouchRange? {
        let arg = Limit.value(v)
        enum Position { case min, low, mid, high, max }
        let position: Position
        switch Limit.compare(arg, r.low) {
        case .ascending: position = .min
        case .same: position = .low
        case .descending:
            switch Limit.compare(arg, r.high) {
            case .ascending: position = .mid
            case .same: position = .high
            case .descending: position = .max
            }
        }
        let eq = CouchRange(lowOp: "$eq", low: arg, highOp: "$eq", high: arg)
        switch (op, position) {
        case ("$lt", .min), ("$lt", .low): return nil
        case ("$lt", .mid), ("$lt", .high): return CouchRange(lowOp: r.lowOp, low: r.low, highOp: "$lt", high: arg)
        case ("$lt", .max): return r
        case ("$lte", .min): return nil
        case ("$lte", .low): return r.lowOp == "$gte" || r.lowOp == "$eq" ? eq : nil
        case ("$lte", .mid): return CouchRange(lowOp: r.lowOp, low: r.low, highOp: "$lte", high: arg)
        case ("$lte", _): return r
        case ("$eq", .min): return nil
        case ("$eq", .low): return r.lowOp == "$gte" || r.lowOp == "$eq" ? eq : nil
        case ("$eq", .mid): return eq
        case ("$eq", .high): return r.highOp == "$lte" || r.highOp == "$eq" ? eq : nil
        case ("$eq", .max): return nil
        case ("$gte", .min), ("$gte", .low): return r
        case ("$gte", .mid): return CouchRange(lowOp: "$gte", low: arg, highOp: r.highOp, high: r.high)
        case ("$gte", .high): return r.highOp == "$lte" || r.highOp == "$eq" ? eq : nil
        case ("$gte", .max): return nil
        case ("$gt", .min): return r
        case ("$gt", .low), ("$gt", .mid): return CouchRange(lowOp: "$gt", low: arg, highOp: r.highOp, high: r.high)
        default: return nil  // $gt at or above the top
        }
    }

    /// CouchDB's `field_ranges`: each indexable field with its range; a contradiction leaves
    /// only that field, with no range.
    func fieldRanges() -> [(FieldPath, CouchRange?)] {
        var out: [(FieldPath, CouchRange?)] = []
        for path in QueryPlanner.indexableFields(root) {
            guard let r = couchRange(path) else { return [(path, nil)] }
            out.append((path, r))
        }
        return out
    }

    struct Ranked {
        var candidate: Candidate
        var prefix: [CouchRange?]
        var difference: Int
    }

    /// CouchDB's `composite_indexes` then `choose_best_index`: sorted best first.
    func rank(_ candidates: [Candidate], ranges: [(FieldPath, CouchRange?)]) -> [Ranked] {
        let ranked = candidates.map { c -> Ranked in
            var prefix: [CouchRange?] = []
            for column in c.columns {
                guard let found = ranges.first(where: { $0.0 == column }) else { break }
                prefix.append(found.1)
            }
            return Ranked(candidate: c, prefix: prefix, difference: ranges.count - prefix.count)
        }
        return ranked.enumerated().sorted { x, y in
            let (a, b) = (x.element, y.element)
            if a.difference != b.difference { return a.difference < b.difference }
            if a.candidate.columns.count != b.candidate.columns.count {
                return a.candidate.columns.count < b.candidate.columns.count
            }
            if Candidate.precedes(a.candidate, b.candidate) { return true }
            if Candidate.precedes(b.candidate, a.candidate) { return false }
            return x.offset < y.offset
        }.map(\.element)
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

    // MARK: - Explain

    func explain(
        winner: Ranked, sorted: [Ranked], all: [Candidate], global: [Candidate], pool: [Candidate],
        usabilityMap: [(Candidate, Usability)], usable: [Candidate], chosenFrom: [Candidate], group: [Candidate],
        descending: Bool
    ) -> [String: JSON] {
        var out: [String: JSON] = [:]
        out["index"] = winner.candidate.json
        out["index_candidates"] = .array(candidates(
            winner: winner.candidate, sorted: sorted, all: all, global: global, pool: pool,
            usabilityMap: usabilityMap, usable: usable, chosenFrom: chosenFrom, group: group))
        let indexable = QueryPlanner.indexableFields(root)
        let unindexable = Set(QueryPlanner.selectorFields(root)).subtracting(indexable)
        // Listed in descending order, as the reference CouchDB prints its sets of names.
        out["selector_hints"] = [
            [
                "type": "json",
                "indexable_fields": .array(indexable.reversed().map { .string($0.description) }),
                "unindexable_fields": .array(
                    unindexable.map(\.description).sorted(by: CouchCollation.utf8Precedes).reversed().map { .string($0) }),
            ]
        ]
        var (start, end) = keys(winner)
        if descending { swap(&start, &end) }
        out["mrargs"] = [
            "include_docs": true, "view_type": "map", "reduce": false, "partition": .null,
            "start_key": start, "end_key": end, "direction": descending ? "rev" : "fwd",
            "stable": .bool(query.stable), "update": .bool(query.update),
            "conflicts": query.conflicts ? true : "undefined",
        ]
        // Ferry reads every answer's document: no index covers a query.
        out["covering"] = false
        return out
    }

    /// CouchDB's `start_key` and `end_key` for the winner's range prefix (`"<MAX>"` for its top).
    func keys(_ winner: Ranked) -> (JSON, JSON) {
        if winner.prefix.contains(where: { $0 == nil }) { return (.null, .null) }
        let prefix = winner.prefix.compactMap { $0 }
        if winner.candidate == .allDocs {
            guard let r = prefix.first else { return (.null, "<MAX>") }
            let start: JSON = if case .value(let v) = r.low { v } else { "" }
            let end: JSON = if case .value(let v) = r.high { v } else { "<MAX>" }
            return (start, end)
        }
        var start: [JSON] = []
        for r in prefix {
            guard case .value(let v) = r.low else { break }
            start.append(v)
        }
        var end: [JSON] = []
        for r in prefix {
            guard case .value(let v) = r.high else { break }
            end.append(v)
        }
        end.append("<MAX>")
        return (.array(start), .array(end))
    }

    /// CouchDB's `index_candidates`: every index but the winner, with whether it was usable,
    /// the first reason it was not chosen, and its rank.
    func candidates(
        winner: Candidate, sorted: [Ranked], all: [Candidate], global: [Candidate], pool: [Candidate],
        usabilityMap: [(Candidate, Usability)], usable: [Candidate], chosenFrom: [Candidate], group: [Candidate]
    ) -> [JSON] {
        struct Tags {
            var usable: Bool?
            var reasons: [String] = []
            var ranking: Int?
            mutating func merge(usable u: Bool? = nil, reasons r: [String] = [], ranking k: Int? = nil) {
                if let u { usable = (usable ?? true) && u }
                reasons += r
                if let k { ranking = (ranking ?? 0) + k }
            }
        }
        func minus(_ a: [Candidate], _ b: [Candidate]) -> [Candidate] { a.filter { !b.contains($0) } }
        let partial = minus(all, global)
        let notUsable = minus(pool, usable)
        let excluded = minus(usable, chosenFrom)
        let unfavored = minus(chosenFrom, group)
        let unfavoredRank = max(1, sorted.count)
        let excludedRank = unfavoredRank + (unfavored.isEmpty ? 0 : 1)
        let notUsableRank = excludedRank + (excluded.isEmpty ? 0 : 1)
        let partialRank = notUsableRank + (notUsable.isEmpty ? 0 : 1)

        var tags: [Candidate: Tags] = [:]
        for c in all { tags[c] = Tags() }
        for c in partial { tags[c]?.merge(usable: false, reasons: ["is_partial"], ranking: partialRank) }
        for c in notUsable { tags[c]?.merge(usable: false, ranking: notUsableRank) }
        for c in excluded { tags[c]?.merge(usable: true, reasons: ["excluded_by_user"], ranking: excludedRank) }
        for c in unfavored { tags[c]?.merge(usable: true, reasons: ["unfavored_type"], ranking: unfavoredRank) }
        for c in group { tags[c]?.merge(usable: true) }
        for (c, u) in usabilityMap where !u.usable { tags[c]?.merge(reasons: u.reasons) }
        let winnerWidth = winner.columns.count
        for (n, r) in sorted.enumerated() {
            let reason =
                r.difference > 0
                ? "less_overlap" : (r.candidate.columns.count > winnerWidth ? "too_many_fields" : "alphabetically_comes_after")
            tags[r.candidate]?.merge(reasons: [reason], ranking: n)
        }
        tags[winner] = nil

        let ordered = all.filter { tags[$0] != nil }.sorted { a, b in
            // CouchDB lists JSON indexes by descending design document and name, `_all_docs` last.
            if a == .allDocs { return false }
            if b == .allDocs { return true }
            return Candidate.precedes(b, a)
        }
        let fields = query.fields
        return ordered.map { c in
            let t = tags[c]!
            var covering: JSON = .null
            if case .json(let index) = c {
                if let fields {
                    let available = Set(index.columns + [FieldPath(components: ["_id"])])
                    covering = .bool(Set(fields).isSubset(of: available))
                } else {
                    covering = false
                }
            }
            return [
                "index": c.json,
                "analysis": [
                    "usable": .bool(t.usable ?? true),
                    "reasons": .array(t.reasons.prefix(1).map { ["name": .string($0)] }),
                    "ranking": .int(Int64(t.ranking ?? 0)),
                    "covering": covering,
                ],
            ]
        }
    }
}
