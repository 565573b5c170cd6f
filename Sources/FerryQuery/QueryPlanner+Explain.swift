import FerryCore

// CouchDB's `_explain` members for a plan: the index, the other candidates and why each lost, mrargs.
extension Planning {
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
