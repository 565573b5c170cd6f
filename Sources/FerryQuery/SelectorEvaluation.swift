import FerryCore

extension SelectorNode {
    /// Whether `value` (a document, or an element inside an element sub-selector) matches,
    /// operator by operator as CouchDB's Mango evaluates it. A value on which a `$regex` test
    /// exceeds its budget matches no selector (not even one that negates the `$regex`).
    public func matches(_ value: JSON) -> Bool { (try? evaluate(value)) ?? false }

    /// Whether `value` matches; throws `regexTooCostly` when a `$regex` test exceeds its budget.
    public func evaluate(_ value: JSON) throws(MangoError) -> Bool {
        switch self {
        case .matchAll: return true
        case .and(let clauses):
            for clause in clauses where !(try clause.evaluate(value)) { return false }
            return true
        case .or(let clauses):
            if clauses.isEmpty { return true }
            for clause in clauses where try clause.evaluate(value) { return true }
            return false
        case .not(let inner): return !(try inner.evaluate(value))
        case .nor(let clauses):
            for clause in clauses where try clause.evaluate(value) { return false }
            return true
        case .field(let path, let condition):
            switch path.lookup(in: value) {
            case .missing: return condition == .exists(false)
            case .badPath: return false
            case .found(let found):
                // CouchDB compares `_id` by raw bytes, as `_all_docs` orders it.
                let raw = path.components.count == 1 && path.components[0] == "_id"
                return try condition.evaluate(found, compare: raw ? CouchCollation.compareRaw : CouchCollation.compare)
            }
        }
    }
}

extension FieldCondition {
    /// Whether a value that exists meets the condition, comparing with `compare`.
    func evaluate(_ value: JSON, compare: (JSON, JSON) -> CollationOrder) throws(MangoError) -> Bool {
        switch self {
        case .eq(let arg): return compare(value, arg) == .same
        case .ne(let arg): return compare(value, arg) != .same
        case .lt(let arg): return compare(value, arg) == .ascending
        case .lte(let arg): return compare(value, arg) != .descending
        case .gt(let arg): return compare(value, arg) == .descending
        case .gte(let arg): return compare(value, arg) != .ascending
        case .in(let args):
            if case .array(let items) = value {
                return args.contains { arg in items.contains { compare($0, arg) == .same } }
            }
            return args.contains { compare(value, $0) == .same }
        case .nin(let args):
            if case .array(let items) = value {
                return !args.contains { arg in items.contains { compare($0, arg) == .same } }
            }
            return args.allSatisfy { compare(value, $0) != .same }
        case .exists(let flag): return flag
        case .type(let type): return JSONType(of: value) == type
        case .size(let n):
            if case .array(let items) = value { return items.count == n }
            return false
        case .mod(let divisor, let remainder):
            guard case .int(let i) = value else { return false }
            // Int64.min % -1 traps; every integer is divisible by -1.
            return (divisor == -1 ? 0 : i % divisor) == remainder
        case .regex(let regex):
            if case .string(let s) = value { return try regex.test(s) }
            return false
        case .beginsWith(let prefix):
            if case .string(let s) = value { return s.utf8.starts(with: prefix.utf8) }
            return false
        case .all(let args):
            guard case .array(let items) = value, !args.isEmpty else { return false }
            // Exact membership, not collation, as CouchDB's `$all` does.
            if args.allSatisfy({ items.contains($0) }) { return true }
            return args.count == 1 && args[0] == value
        case .elemMatch(let sub):
            guard case .array(let items) = value else { return false }
            for item in items where try sub.evaluate(item) { return true }
            return false
        case .allMatch(let sub):
            guard case .array(let items) = value, !items.isEmpty else { return false }
            for item in items where !(try sub.evaluate(item)) { return false }
            return true
        case .keyMapMatch(let sub):
            guard case .object(let fields) = value else { return false }
            for key in fields.keys where try sub.evaluate(.string(key)) { return true }
            return false
        case .not(let inner): return !(try inner.evaluate(value, compare: compare))
        }
    }
}
