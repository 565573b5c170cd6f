import FerryCore

import Foundation

/// A normalised Mango selector: combinations of conditions on field paths, the shape a query
/// planner walks to pick index ranges.
///
/// Normalisation is CouchDB's: implicit `$and`s and `$eq`s made explicit, nested field objects
/// flattened into paths, combination operators lifted above the fields, and negations pushed
/// down to the conditions (`$not {a: {$gt: 1}}` becomes `a: {$lte: 1}`). `.not` and `.nor`
/// remain only inside the sub-selectors of `$elemMatch`, `$allMatch` and `$keyMapMatch`, where
/// CouchDB evaluates them as written.
public indirect enum SelectorNode: Sendable, Hashable {
    /// The empty selector `{}`: every document matches.
    case matchAll
    /// Every clause matches (`$and: []` matches everything).
    case and([SelectorNode])
    /// Some clause matches (`$or: []` matches everything, as in CouchDB).
    case or([SelectorNode])
    /// The clause does not match.
    case not(SelectorNode)
    /// No clause matches.
    case nor([SelectorNode])
    /// The value at the path exists and meets the condition (an empty path is the value
    /// itself, inside an element sub-selector). A missing value meets only `$exists: false`.
    case field(FieldPath, FieldCondition)
}

/// One operator applied to the value at a field path.
public indirect enum FieldCondition: Sendable, Hashable {
    case eq(JSON)
    case ne(JSON)
    case lt(JSON)
    case lte(JSON)
    case gt(JSON)
    case gte(JSON)
    /// The value, or for an array value one of its elements, equals one of these.
    case `in`([JSON])
    /// The negation of `in`.
    case nin([JSON])
    case exists(Bool)
    case type(JSONType)
    /// An array of exactly this many elements.
    case size(Int)
    /// An integer whose remainder (truncated division, the sign follows the value) is `remainder`.
    case mod(divisor: Int64, remainder: Int64)
    case regex(MangoRegex)
    /// A string starting with this prefix (CouchDB 3.4's `$beginsWith`).
    case beginsWith(String)
    /// An array holding each of these values (or, for a single array argument, equal to it).
    case all([JSON])
    /// An array with at least one element matching the sub-selector.
    case elemMatch(SelectorNode)
    /// A non-empty array whose every element matches the sub-selector.
    case allMatch(SelectorNode)
    /// An object with at least one key matching the sub-selector.
    case keyMapMatch(SelectorNode)
    /// A negated operator that has no direct opposite (`$not` of `$type`, `$regex`, …); like every
    /// condition it still needs the field to exist.
    case not(FieldCondition)
}

/// The type names `$type` accepts, as CouchDB names JSON types.
public enum JSONType: String, Sendable, Hashable, CaseIterable {
    case null, boolean, number, string, array, object

    public init(of value: JSON) {
        switch value {
        case .null: self = .null
        case .bool: self = .boolean
        case .int, .double: self = .number
        case .string: self = .string
        case .array: self = .array
        case .object: self = .object
        }
    }
}

/// A `$regex` pattern, compiled once; equal when the pattern text is equal.
///
/// Patterns use ICU's regular expressions (NSRegularExpression), close to the PCRE that CouchDB
/// uses; a match anywhere in the string counts, as with PCRE's unanchored search. ICU
/// backtracks, so each test runs with ICU's progress callback and gives up after
/// `QueryLimits.maximumRegexTicks` ticks (`MangoError.regexTooCostly`).
public struct MangoRegex: Hashable, @unchecked Sendable {
    public let pattern: String
    // NSRegularExpression is immutable and documented as safe to share between threads.
    private let compiled: NSRegularExpression

    /// Compiles `pattern`; nil when it is not a valid regular expression.
    public init?(_ pattern: String) {
        guard let compiled = try? NSRegularExpression(pattern: pattern, options: []) else { return nil }
        self.pattern = pattern
        self.compiled = compiled
    }

    /// Whether the pattern matches somewhere in `string`; false when the test exceeds its budget.
    public func matches(_ string: String) -> Bool { (try? test(string)) ?? false }

    /// Whether the pattern matches somewhere in `string`, within `ticks` of ICU's backtracking
    /// ticks (about 10,000 steps each; one per 100 UTF-16 units for a longer string);
    /// `regexTooCostly` beyond them.
    public func test(_ string: String, ticks: Int = QueryLimits.maximumRegexTicks) throws(MangoError) -> Bool {
        let range = NSRange(string.startIndex..<string.endIndex, in: string)
        // The progress callback also runs once per start position tried, at most once per
        // UTF-16 unit and once at the end: those calls are the scan, not backtracking.
        let allowed = range.length + 1 + max(ticks, range.length / 100)
        var found = false
        var spent = 0
        compiled.enumerateMatches(in: string, options: [.reportProgress], range: range) { match, flags, stop in
            if match != nil {
                found = true
                stop.pointee = true
            } else if flags.contains(.progress) {
                spent += 1
                if spent > allowed { stop.pointee = true }
            }
        }
        if !found && spent > allowed { throw .regexTooCostly(pattern: pattern) }
        return found
    }

    public static func == (a: MangoRegex, b: MangoRegex) -> Bool { a.pattern == b.pattern }
    public func hash(into hasher: inout Hasher) { hasher.combine(pattern) }
}

extension SelectorNode {
    /// The normalised selector written back as selector JSON (CouchDB's explicit form:
    /// `$and`/`$or` arrays, dotted field names, explicit operators). Parsing it yields this tree.
    public var json: JSON {
        switch self {
        case .matchAll: return .object([:])
        case .and(let clauses): return ["$and": .array(clauses.map(\.json))]
        case .or(let clauses): return ["$or": .array(clauses.map(\.json))]
        case .nor(let clauses): return ["$nor": .array(clauses.map(\.json))]
        case .not(let inner): return ["$not": inner.json]
        case .field(let path, let condition):
            if path.isEmpty { return condition.json }
            return .object([path.description: condition.json])
        }
    }
}

extension FieldCondition {
    /// The condition as an operator object, such as `{"$gt": 5}`.
    public var json: JSON {
        switch self {
        case .eq(let v): return ["$eq": v]
        case .ne(let v): return ["$ne": v]
        case .lt(let v): return ["$lt": v]
        case .lte(let v): return ["$lte": v]
        case .gt(let v): return ["$gt": v]
        case .gte(let v): return ["$gte": v]
        case .in(let vs): return ["$in": .array(vs)]
        case .nin(let vs): return ["$nin": .array(vs)]
        case .exists(let flag): return ["$exists": .bool(flag)]
        case .type(let type): return ["$type": .string(type.rawValue)]
        case .size(let n): return ["$size": .int(Int64(n))]
        case .mod(let d, let r): return ["$mod": [.int(d), .int(r)]]
        case .regex(let regex): return ["$regex": .string(regex.pattern)]
        case .beginsWith(let prefix): return ["$beginsWith": .string(prefix)]
        case .all(let vs): return ["$all": .array(vs)]
        case .elemMatch(let sub): return ["$elemMatch": sub.json]
        case .allMatch(let sub): return ["$allMatch": sub.json]
        case .keyMapMatch(let sub): return ["$keyMapMatch": sub.json]
        case .not(let inner): return ["$not": inner.json]
        }
    }
}
