import FerryCore

extension SelectorNode {
    /// Whether `value` (a document, or an element inside an element sub-selector) matches,
    /// operator by operator as CouchDB's Mango evaluates it.
    public func matches(_ value: JSON) -> Bool {
        switch self {
        case .matchAll: return true
        case .and(let clauses): return clauses.allSatisfy { $0.matches(value) }
        case .or(let clauses): return clauses.isEmpty || clauses.contains { $0.matches(value) }
        case .not(let inner): return !inner.matches(value)
        case .nor(let clauses): return !clauses.contains { $0.matches(value) }
        case .field(let path, let condition):
            switch path.lookup(in: value) {
            case .missing: return condition == .exists(false)
            case .badPath: return false
            case .found(let found):
                // CouchDB compares `_id` by raw bytes, as `_all_docs` orders it.
                let raw = path.components.count == 1 && path.components[0] == "_id"
                return condition.matches(found, compare: raw ? CouchCollation.compareRaw : CouchCollation.compare)
            }
        }
    }
}

extension FieldCondition {
    /// Whether a value that exists meets the condition, comparing with `compare`.
    func matches(_ value: JSON, compare: (JSON, JSON) -> CollationOrder) -> Bool {
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
            if case .string(let s) = value { return regex.matches(s) }
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
            if case .array(let items) = value { return items.contains { sub.matches($0) } }
            return false
        case .allMatch(let sub):
            if case .array(let items) = value, !items.isEmpty { return items.allSatisfy { sub.matches($0) } }
            return false
        case .keyMapMatch(let sub):
            if case .object(let fields) = value { return fields.keys.contains { sub.matches(.string($0)) } }
            return false
        case .not(let inner): return !inner.matches(value, compare: compare)
        }
    }
}
