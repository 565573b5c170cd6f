import FerryCore

/// Sets of byte-string intervals (memcmp order): what a selector allows for one indexed field's
/// key, and the key ranges a plan reads. Every operation is conservative: a set may hold keys
/// no matching document has, never miss one that a matching document has.
struct ByteIntervals: Sendable, Hashable {
    /// One end of an interval.
    struct Bound: Sendable, Hashable {
        var bytes: [UInt8]
        var inclusive: Bool
    }

    /// A nil bound is open.
    struct Interval: Sendable, Hashable {
        var lower: Bound?
        var upper: Bound?

        var isEmpty: Bool {
            guard let lower, let upper else { return false }
            if upper.bytes.lexicographicallyPrecedes(lower.bytes) { return true }
            return upper.bytes == lower.bytes && !(lower.inclusive && upper.inclusive)
        }

        /// The single key this interval holds, if it is a point.
        var point: [UInt8]? {
            guard let lower, let upper, lower.inclusive, upper.inclusive, lower.bytes == upper.bytes else { return nil }
            return lower.bytes
        }
    }

    /// Sorted by lower bound, disjoint.
    private(set) var intervals: [Interval]

    /// Sorts `intervals` once (n·log n) and merges the overlapping or touching ones.
    init(_ intervals: [Interval]) { self.intervals = Self.normalised(intervals) }

    /// Wraps intervals already sorted by lower bound and disjoint.
    private init(sortedDisjoint intervals: [Interval]) { self.intervals = intervals }

    static let all = ByteIntervals([Interval(lower: nil, upper: nil)])
    static let none = ByteIntervals([])

    static func point(_ key: [UInt8]) -> ByteIntervals {
        ByteIntervals([Interval(lower: Bound(bytes: key, inclusive: true), upper: Bound(bytes: key, inclusive: true))])
    }

    /// Every key that starts with `prefix`.
    static func prefixed(_ prefix: [UInt8]) -> ByteIntervals {
        ByteIntervals([
            Interval(
                lower: Bound(bytes: prefix, inclusive: true),
                upper: successor(of: prefix).map { Bound(bytes: $0, inclusive: false) })
        ])
    }

    static func above(_ key: [UInt8], inclusive: Bool) -> ByteIntervals {
        ByteIntervals([Interval(lower: Bound(bytes: key, inclusive: inclusive), upper: nil)])
    }

    static func below(_ key: [UInt8], inclusive: Bool) -> ByteIntervals {
        ByteIntervals([Interval(lower: nil, upper: Bound(bytes: key, inclusive: inclusive))])
    }

    var isEmpty: Bool { intervals.isEmpty }

    /// The keys, when the set is a few single keys.
    var points: [[UInt8]]? {
        var out: [[UInt8]] = []
        for interval in intervals {
            guard let p = interval.point else { return nil }
            out.append(p)
        }
        return out
    }

    /// Each of `keys` as a single-key interval: one sort, whatever the number of keys.
    static func points(_ keys: [[UInt8]]) -> ByteIntervals {
        ByteIntervals(keys.map { Interval(lower: Bound(bytes: $0, inclusive: true), upper: Bound(bytes: $0, inclusive: true)) })
    }

    /// Linear in both sizes: the two sorted lists are merged, not re-sorted.
    func union(_ other: ByteIntervals) -> ByteIntervals {
        if other.intervals.isEmpty { return self }
        if intervals.isEmpty { return other }
        var merged: [Interval] = []
        merged.reserveCapacity(intervals.count + other.intervals.count)
        var i = 0
        var j = 0
        while i < intervals.count || j < other.intervals.count {
            if j == other.intervals.count
                || (i < intervals.count && !Self.lowerPrecedes(other.intervals[j].lower, intervals[i].lower))
            {
                merged.append(intervals[i])
                i += 1
            } else {
                merged.append(other.intervals[j])
                j += 1
            }
        }
        return ByteIntervals(sortedDisjoint: Self.coalesced(merged))
    }

    /// The union of many sets with one sort over all their intervals (a chain of pairwise
    /// unions would cost the sum of every partial result).
    static func union(_ sets: [ByteIntervals]) -> ByteIntervals {
        if sets.count == 1 { return sets[0] }
        return ByteIntervals(sets.flatMap(\.intervals))
    }

    /// Linear in both sizes: a sweep over the two sorted lists, advancing the interval that
    /// ends first. Pieces of disjoint, non-touching intervals are themselves disjoint and in order.
    func intersection(_ other: ByteIntervals) -> ByteIntervals {
        var out: [Interval] = []
        var i = 0
        var j = 0
        while i < intervals.count && j < other.intervals.count {
            let a = intervals[i]
            let b = other.intervals[j]
            let piece = Interval(lower: Self.maxLower(a.lower, b.lower), upper: Self.minUpper(a.upper, b.upper))
            if !piece.isEmpty { out.append(piece) }
            if Self.upperPrecedes(a.upper, b.upper) { i += 1 } else { j += 1 }
        }
        return ByteIntervals(sortedDisjoint: Self.coalesced(out))
    }

    /// The smallest byte string greater than every string that starts with `bytes`; nil when
    /// there is none (all 0xFF).
    static func successor(of bytes: [UInt8]) -> [UInt8]? {
        var out = bytes
        while let last = out.last {
            if last < 0xFF {
                out[out.count - 1] = last + 1
                return out
            }
            out.removeLast()
        }
        return nil
    }

    // MARK: - Ordering

    /// Lower bounds: open first; at equal bytes an inclusive bound starts earlier.
    static func lowerPrecedes(_ a: Bound?, _ b: Bound?) -> Bool {
        guard let b else { return false }
        guard let a else { return true }
        if a.bytes != b.bytes { return a.bytes.lexicographicallyPrecedes(b.bytes) }
        return a.inclusive && !b.inclusive
    }

    /// Upper bounds: open last; at equal bytes an exclusive bound ends earlier.
    static func upperPrecedes(_ a: Bound?, _ b: Bound?) -> Bool {
        guard let a else { return false }
        guard let b else { return true }
        if a.bytes != b.bytes { return a.bytes.lexicographicallyPrecedes(b.bytes) }
        return !a.inclusive && b.inclusive
    }

    private static func maxLower(_ a: Bound?, _ b: Bound?) -> Bound? { lowerPrecedes(a, b) ? b : a }
    private static func minUpper(_ a: Bound?, _ b: Bound?) -> Bound? { upperPrecedes(a, b) ? a : b }

    /// Whether `upper` (of an earlier interval) reaches `lower` (of a later one), so that the
    /// two intervals overlap or touch and can be merged.
    private static func reaches(_ upper: Bound?, _ lower: Bound?) -> Bool {
        guard let upper, let lower else { return true }
        if lower.bytes.lexicographicallyPrecedes(upper.bytes) { return true }
        return lower.bytes == upper.bytes && (lower.inclusive || upper.inclusive)
    }

    private static func normalised(_ intervals: [Interval]) -> [Interval] {
        coalesced(intervals.sorted { lowerPrecedes($0.lower, $1.lower) })
    }

    /// Merges, in one pass, the overlapping or touching neighbours of intervals sorted by
    /// lower bound, dropping empty ones.
    private static func coalesced(_ sorted: [Interval]) -> [Interval] {
        var out: [Interval] = []
        out.reserveCapacity(sorted.count)
        for interval in sorted where !interval.isEmpty {
            if var last = out.last, reaches(last.upper, interval.lower) {
                if upperPrecedes(last.upper, interval.upper) { last.upper = interval.upper }
                out[out.count - 1] = last
            } else {
                out.append(interval)
            }
        }
        return out
    }
}

extension KeyRange {
    init(_ interval: ByteIntervals.Interval) {
        self.init(
            lower: interval.lower?.bytes, lowerInclusive: interval.lower?.inclusive ?? true,
            upper: interval.upper?.bytes, upperInclusive: interval.upper?.inclusive ?? true)
    }
}

/// How one indexed field's values become key bytes, and so which keys a condition allows.
enum FieldKeySpace: Sendable {
    /// `_all_docs`: the ID's UTF-8 bytes.
    case rawID
    /// `_id` inside a JSON index (`MangoIndex.fieldKey`).
    case indexedID
    /// Any other field: `CouchCollation.sortKey`.
    case collated

    /// The keys a document matching `node` can have for the value at `path`, when it has one.
    func allowed(by node: SelectorNode, at path: FieldPath) -> ByteIntervals {
        switch node {
        case .matchAll, .not, .nor: return .all
        case .and(let clauses):
            var out = ByteIntervals.all
            for clause in clauses {
                out = out.intersection(allowed(by: clause, at: path))
                if out.isEmpty { break }
            }
            return out
        case .or(let clauses):
            // `$or: []` matches everything.
            if clauses.isEmpty { return .all }
            return ByteIntervals.union(clauses.map { allowed(by: $0, at: path) })
        case .field(let p, let condition):
            return p == path ? allowed(by: condition) : .all
        }
    }

    /// The keys of the values that meet `condition`.
    func allowed(by condition: FieldCondition) -> ByteIntervals {
        switch self {
        case .collated: return collated(condition)
        case .rawID, .indexedID: return id(condition)
        }
    }

    // MARK: - Collated fields

    /// The sort key's type tags (see `CouchCollation.sortKey`).
    private static func typeKeys(_ type: JSONType) -> ByteIntervals {
        switch type {
        case .null: return .prefixed([1])
        case .boolean: return ByteIntervals([.init(lower: .init(bytes: [2], inclusive: true), upper: .init(bytes: [4], inclusive: false))])
        case .number: return .prefixed([4])
        case .string: return .prefixed([5])
        case .array: return .prefixed([6])
        case .object: return .prefixed([7])
        }
    }

    private func collated(_ condition: FieldCondition) -> ByteIntervals {
        func key(_ v: JSON) -> [UInt8] { CouchCollation.sortKey(v) }
        switch condition {
        case .eq(let v): return .point(key(v))
        case .gt(let v): return .above(key(v), inclusive: false)
        case .gte(let v): return .above(key(v), inclusive: true)
        case .lt(let v): return .below(key(v), inclusive: false)
        case .lte(let v): return .below(key(v), inclusive: true)
        case .in(let values):
            if values.isEmpty { return .none }
            // An array value matches when one of its elements is listed: its key is the array's.
            return Self.typeKeys(.array).union(.points(values.map(key)))
        case .exists(let flag): return flag ? .all : .none
        case .type(let type): return Self.typeKeys(type)
        case .size, .all, .elemMatch, .allMatch: return Self.typeKeys(.array)
        case .keyMapMatch: return Self.typeKeys(.object)
        case .mod: return Self.typeKeys(.number)
        case .regex: return Self.typeKeys(.string)
        case .beginsWith(let prefix):
            // A string's key starts with its primary weights, and a string that starts with
            // `prefix` has the prefix's primary weights first: those bytes are a key prefix.
            let weights = CouchCollation.stringSortKey(prefix).prefix { $0 != 1 }
            return .prefixed([5] + weights)
        case .ne, .nin, .not: return .all
        }
    }

    // MARK: - Document IDs

    /// The bytes an ID string has in this space.
    private func idKey(_ id: String) -> [UInt8] {
        switch self {
        case .indexedID: return MangoIndex.fieldKey(.string(id), path: FieldPath(components: ["_id"]))
        default: return Array(id.utf8)
        }
    }

    /// Keys of the IDs starting with `prefix`. In `_all_docs` the upper bound is itself an ID
    /// (valid UTF-8: the prefix with its last character's successor), as the store compares
    /// IDs as text.
    private func idKeys(startingWith prefix: String) -> ByteIntervals {
        if prefix.isEmpty { return .all }
        if case .indexedID = self {
            return .prefixed([5] + prefix.utf8.map { $0 + 2 })
        }
        var scalars = Array(prefix.unicodeScalars)
        while let last = scalars.popLast() {
            var next = last.value + 1
            if next == 0xD800 { next = 0xE000 }
            if let successor = Unicode.Scalar(next) {
                var upper = String.UnicodeScalarView()
                upper.append(contentsOf: scalars)
                upper.append(successor)
                return ByteIntervals([
                    .init(
                        lower: .init(bytes: Array(prefix.utf8), inclusive: true),
                        upper: .init(bytes: Array(String(upper).utf8), inclusive: false))
                ])
            }
        }
        return .above(Array(prefix.utf8), inclusive: true)
    }

    /// A document's ID is always a string; a non-string argument compares with every ID the
    /// same way (Erlang term order puts strings last).
    private func id(_ condition: FieldCondition) -> ByteIntervals {
        func bound(_ v: JSON, _ make: ([UInt8]) -> ByteIntervals, ifIDsAbove: ByteIntervals, otherwise: ByteIntervals)
            -> ByteIntervals
        {
            if case .string(let s) = v { return make(idKey(s)) }
            return CouchCollation.compareRaw(.string(""), v) == .descending ? ifIDsAbove : otherwise
        }
        switch condition {
        case .eq(let v):
            if case .string(let s) = v { return .point(idKey(s)) }
            return .none
        case .gt(let v): return bound(v, { .above($0, inclusive: false) }, ifIDsAbove: .all, otherwise: .none)
        case .gte(let v): return bound(v, { .above($0, inclusive: true) }, ifIDsAbove: .all, otherwise: .none)
        case .lt(let v): return bound(v, { .below($0, inclusive: false) }, ifIDsAbove: .none, otherwise: .all)
        case .lte(let v): return bound(v, { .below($0, inclusive: true) }, ifIDsAbove: .none, otherwise: .all)
        case .in(let values):
            return .points(values.compactMap { v in
                if case .string(let s) = v { return idKey(s) }
                return nil
            })
        case .beginsWith(let prefix): return idKeys(startingWith: prefix)
        case .exists(let flag): return flag ? .all : .none
        case .type(let type): return type == .string ? .all : .none
        case .size, .all, .elemMatch, .allMatch, .keyMapMatch, .mod: return .none
        case .regex, .ne, .nin, .not: return .all
        }
    }
}

/// Builds the key ranges of an index for a selector: equalities on a prefix of the fields
/// (several values each, up to a bound), then the allowed intervals of the next field.
enum KeyRangeBuilder {
    /// The most combinations of equal-value prefixes kept before the next field is read as intervals.
    static let maximumPrefixes = 64

    /// Ranges over keys that are the concatenation of `spaces.count` prefix-free field keys
    /// (or, for `_all_docs`, one raw ID), sorted and disjoint; empty when nothing can match.
    static func ranges(for root: SelectorNode, fields: [FieldPath], spaces: [FieldKeySpace]) -> [KeyRange] {
        var prefixes: [[UInt8]] = [[]]
        for (position, path) in fields.enumerated() {
            let allowed = spaces[position].allowed(by: root, at: path)
            if allowed.isEmpty { return [] }
            let isLast = position == fields.count - 1
            if let points = allowed.points, prefixes.count * points.count <= maximumPrefixes {
                prefixes = prefixes.flatMap { p in points.map { p + $0 } }
                if isLast { return prefixes.sorted { $0.lexicographicallyPrecedes($1) }.map { KeyRange(lower: $0, upper: $0) } }
                continue
            }
            var out: [ByteIntervals.Interval] = []
            for prefix in prefixes {
                for interval in allowed.intervals {
                    if let c = composite(prefix, interval, isLast: isLast) { out.append(c) }
                }
            }
            return ByteIntervals(out).intervals.map(KeyRange.init)
        }
        // No fields: every key (there is only the empty one).
        return [.all]
    }

    /// The keys `prefix + k + rest` for `k` in `interval`. After a field that is not the last,
    /// more field keys follow, so an inclusive upper bound covers every key starting with it
    /// and an exclusive lower bound skips every key starting with it.
    private static func composite(_ prefix: [UInt8], _ interval: ByteIntervals.Interval, isLast: Bool)
        -> ByteIntervals.Interval?
    {
        typealias Bound = ByteIntervals.Bound
        var lower: Bound?
        if let lo = interval.lower {
            if lo.inclusive || isLast {
                lower = Bound(bytes: prefix + lo.bytes, inclusive: lo.inclusive)
            } else {
                guard let next = ByteIntervals.successor(of: prefix + lo.bytes) else { return nil }
                lower = Bound(bytes: next, inclusive: true)
            }
        } else if !prefix.isEmpty {
            lower = Bound(bytes: prefix, inclusive: true)
        }
        var upper: Bound?
        if let hi = interval.upper {
            if !hi.inclusive || isLast {
                upper = Bound(bytes: prefix + hi.bytes, inclusive: hi.inclusive)
            } else {
                upper = ByteIntervals.successor(of: prefix + hi.bytes).map { Bound(bytes: $0, inclusive: false) }
            }
        } else if !prefix.isEmpty {
            upper = ByteIntervals.successor(of: prefix).map { Bound(bytes: $0, inclusive: false) }
        }
        let out = ByteIntervals.Interval(lower: lower, upper: upper)
        return out.isEmpty ? nil : out
    }
}
