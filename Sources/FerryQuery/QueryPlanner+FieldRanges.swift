import FerryCore

// CouchDB's field ranges of a selector, and the ranking of candidate indexes built on them.
extension Planning {
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
        for path in indexableFields {
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
}
