import FerryCore

/// Turns a selector's JSON into a normalised `SelectorNode`, refusing what CouchDB refuses
/// with CouchDB's error names and reasons.
enum SelectorParser {
    /// Deeper selectors are refused, so a hostile one cannot exhaust the stack.
    static let maximumDepth = 100

    static func parse(selector value: JSON) throws(MangoError) -> SelectorNode {
        guard case .object(let fields) = value else {
            throw .invalid("Selector must be a JSON object, not: \(value.canonicalString)")
        }
        if fields.isEmpty { return .matchAll }
        var cost = 0
        let written = try parse(value, at: FieldPath(components: []), depth: 0, inElement: false, cost: &cost)
        return normaliseNegations(written)
    }

    // MARK: - Limits

    /// Refuses an operator with more operands than `QueryLimits.maximumOperands`.
    private static func checkOperands(_ count: Int, of op: String, _ noun: String) throws(MangoError) {
        let limit = QueryLimits.maximumOperands
        guard count <= limit else {
            throw .limitExceeded("\(op) has \(count) \(noun); at most \(limit) are allowed (query limit maximumOperands).")
        }
    }

    /// Adds `amount` to the selector's cost, refusing it past `QueryLimits.maximumSelectorCost`.
    private static func charge(_ amount: Int, _ cost: inout Int) throws(MangoError) {
        cost += amount
        let limit = QueryLimits.maximumSelectorCost
        guard cost <= limit else {
            throw .limitExceeded(
                "The selector has more than \(limit) operators, clauses and listed values (query limit maximumSelectorCost).")
        }
    }

    // MARK: - Parsing

    /// Parses `value` standing where a selector may stand, for the value at `path`.
    /// `inElement` is true inside `$elemMatch` and friends, where an empty path is the element.
    private static func parse(
        _ value: JSON, at path: FieldPath, depth: Int, inElement: Bool, cost: inout Int
    ) throws(MangoError) -> SelectorNode {
        guard depth <= maximumDepth else { throw .tooDeep(limit: maximumDepth) }
        try charge(1, &cost)
        guard case .object(let fields) = value, !fields.isEmpty else {
            // A bare value (or `{}` below the top) means equality.
            return try terminal(.eq(value), at: path, inElement: inElement)
        }
        if fields.count > 1 {
            try checkOperands(fields.count, of: "An object", "fields")
            // Several keys are an implicit $and; sorted so the tree does not depend on hashing.
            var clauses: [SelectorNode] = []
            for key in fields.keys.sorted(by: CouchCollation.utf8Precedes) {
                clauses.append(
                    try parse(.object([key: fields[key]!]), at: path, depth: depth + 1, inElement: inElement, cost: &cost))
            }
            return .and(clauses)
        }
        let (key, argument) = fields.first!
        if key.hasPrefix("$") {
            return try parseOperator(key, argument, at: path, depth: depth, inElement: inElement, cost: &cost)
        }
        let subpath = try FieldPath(parsing: key)
        return try parse(argument, at: path.appending(subpath), depth: depth + 1, inElement: inElement, cost: &cost)
    }

    private static func parseOperator(
        _ op: String, _ argument: JSON, at path: FieldPath, depth: Int, inElement: Bool, cost: inout Int
    ) throws(MangoError) -> SelectorNode {
        func clauses() throws(MangoError) -> [SelectorNode] {
            guard case .array(let items) = argument else { throw .badArgument(operator: op, argument: argument) }
            try checkOperands(items.count, of: op, "clauses")
            var out: [SelectorNode] = []
            for item in items {
                out.append(try parse(item, at: path, depth: depth + 1, inElement: inElement, cost: &cost))
            }
            return out
        }
        func subselector() throws(MangoError) -> SelectorNode {
            guard case .object = argument else { throw .badArgument(operator: op, argument: argument) }
            return try parse(argument, at: FieldPath(components: []), depth: depth + 1, inElement: true, cost: &cost)
        }
        func list() throws(MangoError) -> [JSON] {
            guard case .array(let items) = argument else { throw .badArgument(operator: op, argument: argument) }
            try checkOperands(items.count, of: op, "values")
            try charge(items.count, &cost)
            return items
        }
        func condition(_ c: FieldCondition) throws(MangoError) -> SelectorNode {
            try terminal(c, at: path, inElement: inElement)
        }
        func bad() -> MangoError { .badArgument(operator: op, argument: argument) }

        switch op {
        case "$and": return .and(try clauses())
        case "$or": return .or(try clauses())
        case "$nor": return .nor(try clauses())
        case "$not":
            guard case .object = argument else { throw bad() }
            return .not(try parse(argument, at: path, depth: depth + 1, inElement: inElement, cost: &cost))
        case "$elemMatch": return try condition(.elemMatch(try subselector()))
        case "$allMatch": return try condition(.allMatch(try subselector()))
        case "$keyMapMatch": return try condition(.keyMapMatch(try subselector()))
        case "$eq": return try condition(.eq(argument))
        case "$ne": return try condition(.ne(argument))
        case "$lt": return try condition(.lt(argument))
        case "$lte": return try condition(.lte(argument))
        case "$gt": return try condition(.gt(argument))
        case "$gte": return try condition(.gte(argument))
        case "$in": return try condition(.in(try list()))
        case "$nin": return try condition(.nin(try list()))
        case "$all": return try condition(.all(try list()))
        case "$exists":
            guard case .bool(let flag) = argument else { throw bad() }
            return try condition(.exists(flag))
        case "$type":
            guard case .string(let name) = argument, let type = JSONType(rawValue: name) else { throw bad() }
            return try condition(.type(type))
        case "$size":
            guard case .int(let n) = argument, n >= 0, n <= Int64(Int.max) else { throw bad() }
            return try condition(.size(Int(n)))
        case "$mod":
            guard case .array(let pair) = argument, pair.count == 2,
                case .int(let divisor) = pair[0], case .int(let remainder) = pair[1], divisor != 0
            else { throw bad() }
            return try condition(.mod(divisor: divisor, remainder: remainder))
        case "$regex":
            // CouchDB names a non-string pattern an invalid operator, and a pattern that does not compile a bad argument.
            guard case .string(let pattern) = argument else { throw .invalidOperator(op) }
            guard let regex = MangoRegex(pattern) else { throw bad() }
            return try condition(.regex(regex))
        case "$beginsWith":
            guard case .string(let prefix) = argument else { throw bad() }
            return try condition(.beginsWith(prefix))
        case "$text", "$default", "$where", "$geoWithin", "$geoIntersects", "$near", "$nearSphere":
            throw .unsupportedOperator(op)
        default:
            throw .invalidOperator(op)
        }
    }

    private static func terminal(
        _ condition: FieldCondition, at path: FieldPath, inElement: Bool
    ) throws(MangoError) -> SelectorNode {
        if path.isEmpty && !inElement { throw .missingFieldName }
        return .field(path, condition)
    }

    // MARK: - Negations

    /// Pushes `$not` and `$nor` down to the conditions, as CouchDB does before matching; this
    /// is why `{"$not": {"a": {"$gt": 1}}}` needs `a` to exist. Element sub-selectors keep their
    /// negations as written.
    static func normaliseNegations(_ node: SelectorNode) -> SelectorNode {
        switch node {
        case .not(let inner): return negate(inner)
        case .nor(let clauses): return .and(clauses.map(negate))
        case .and(let clauses): return .and(clauses.map(normaliseNegations))
        case .or(let clauses): return .or(clauses.map(normaliseNegations))
        case .field, .matchAll: return node
        }
    }

    private static func negate(_ node: SelectorNode) -> SelectorNode {
        switch node {
        case .not(let inner): return normaliseNegations(inner)
        case .nor(let clauses): return .or(clauses.map(normaliseNegations))
        case .and(let clauses): return .or(clauses.map(negate))
        case .or(let clauses): return .and(clauses.map(negate))
        case .field(let path, let condition): return .field(path, negate(condition))
        case .matchAll: return .not(.matchAll)
        }
    }

    private static func negate(_ condition: FieldCondition) -> FieldCondition {
        switch condition {
        case .lt(let v): return .gte(v)
        case .lte(let v): return .gt(v)
        case .gt(let v): return .lte(v)
        case .gte(let v): return .lt(v)
        case .eq(let v): return .ne(v)
        case .ne(let v): return .eq(v)
        case .in(let vs): return .nin(vs)
        case .nin(let vs): return .in(vs)
        case .exists(let flag): return .exists(!flag)
        default: return .not(condition)
        }
    }
}
