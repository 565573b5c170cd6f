import FerryCore
import FerryQuery
import Testing

/// Compares `MangoSelector.matches` with a small evaluator written here from CouchDB's rules,
/// which reads the selector JSON directly (no normalisation) and carries negation as a flag.
@Suite struct SelectorPropertyTests {
    static let fields = ["a", "b", "a.b", "c.0", "_id"]
    static let leafOperators = ["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$type", "$size", "$all"]

    @Test func matchesAgreesWithABruteForceEvaluatorOnRandomDocumentsAndSelectors() throws {
        var g = SeededGenerator(seed: 0x5E1EC7)
        let documents = (0..<60).map { _ in Self.randomDocument(using: &g) }
        var matched = 0
        var checked = 0
        for _ in 0..<400 {
            let selectorJSON = Self.randomSelector(depth: 2, using: &g)
            let parsed = try MangoSelector(parsing: selectorJSON)
            for document in documents {
                let expected = BruteForce.matches(selectorJSON, document, negated: false)
                let actual = parsed.matches(document)
                #expect(actual == expected, "\(selectorJSON.canonicalString) on \(document.canonicalString)")
                if actual { matched += 1 }
                checked += 1
            }
        }
        // Both outcomes must be well represented, or the comparison proves little.
        #expect(matched > checked / 10)
        #expect(matched < checked * 9 / 10)
    }

    @Test func aNormalisedSelectorWrittenBackAsJSONParsesToTheSameTree() throws {
        var g = SeededGenerator(seed: 0xB0A7)
        for _ in 0..<500 {
            let parsed = try MangoSelector(parsing: Self.randomSelector(depth: 3, using: &g))
            let reparsed = try MangoSelector(parsing: parsed.root.json)
            #expect(reparsed == parsed, "\(parsed.root.json.canonicalString)")
        }
        let written = try MangoSelector(parsing: JSON.parse(#"{"a\\.b": {"$elemMatch": {"c": {"$not": {"$size": 1}}, "$gt": 2}}}"#))
        #expect(try MangoSelector(parsing: written.root.json) == written)
    }

    // MARK: - Generators

    static func randomDocument(using g: inout SeededGenerator) -> JSON {
        var fields: [String: JSON] = ["_id": .string(RandomJSON.strings.randomElement(using: &g)!)]
        for key in ["a", "b", "c"] where Int.random(in: 0..<4, using: &g) > 0 {
            switch Int.random(in: 0..<5, using: &g) {
            case 0: fields[key] = ["b": RandomJSON.scalar(using: &g)]
            case 1: fields[key] = .array((0..<Int.random(in: 0...3, using: &g)).map { _ in RandomJSON.scalar(using: &g) })
            default: fields[key] = RandomJSON.scalar(using: &g)
            }
        }
        return .object(fields)
    }

    static func randomSelector(depth: Int, using g: inout SeededGenerator) -> JSON {
        if depth > 0 && Int.random(in: 0..<3, using: &g) == 0 {
            let clauses = (0..<Int.random(in: 0...3, using: &g)).map { _ in randomSelector(depth: depth - 1, using: &g) }
            switch Int.random(in: 0..<4, using: &g) {
            case 0: return ["$and": .array(clauses)]
            case 1: return ["$or": .array(clauses)]
            case 2: return ["$nor": .array(clauses)]
            default: return ["$not": randomSelector(depth: depth - 1, using: &g)]
            }
        }
        let field = fields.randomElement(using: &g)!
        let op = leafOperators.randomElement(using: &g)!
        let argument: JSON
        switch op {
        case "$in", "$nin", "$all":
            argument = .array((0..<Int.random(in: 0...3, using: &g)).map { _ in RandomJSON.scalar(using: &g) })
        case "$exists": argument = .bool(Bool.random(using: &g))
        case "$type": argument = .string(JSONType.allCases.randomElement(using: &g)!.rawValue)
        case "$size": argument = .int(Int64.random(in: 0...3, using: &g))
        default: argument = RandomJSON.scalar(using: &g)
        }
        if op == "$eq" && Bool.random(using: &g) {
            return [field: argument]  // implicit $eq
        }
        return [field: [op: argument]]
    }
}

/// CouchDB's rules, read straight off the selector: a missing field meets only `$exists: false`,
/// a path through a scalar meets nothing, and a negation flips what the condition asks of a
/// field that exists (De Morgan through `$and`/`$or`; empty `$and`/`$or`/`$nor` always match).
enum BruteForce {
    static func matches(_ selector: JSON, _ document: JSON, negated: Bool) -> Bool {
        guard case .object(let fields) = selector else { return false }
        // Several keys are an implicit $and, which a negation turns into an $or.
        return negated
            ? fields.contains { key, value in clause(key, value, document, negated: true) }
            : fields.allSatisfy { key, value in clause(key, value, document, negated: false) }
    }

    static func clause(_ key: String, _ value: JSON, _ document: JSON, negated: Bool) -> Bool {
        switch key {
        case "$and", "$or", "$nor":
            guard case .array(let items) = value else { return false }
            if items.isEmpty { return true }
            if key == "$nor" {
                let anyMatch = items.contains { matches($0, document, negated: false) }
                let allFail = items.allSatisfy { matches($0, document, negated: true) }
                return negated ? anyMatch : allFail
            }
            let conjunctive = (key == "$and") != negated
            return conjunctive
                ? items.allSatisfy { matches($0, document, negated: negated) }
                : items.contains { matches($0, document, negated: negated) }
        case "$not":
            return matches(value, document, negated: !negated)
        default:
            var op = "$eq"
            var argument = value
            if case .object(let inner) = value, let (k, v) = inner.first, k.hasPrefix("$") { (op, argument) = (k, v) }
            guard let found = lookup(key, in: document) else {
                // Missing: only an (effective) `$exists: false` matches; a bad path never does.
                if op == "$exists", case .bool(let flag) = argument, isMissing(key, in: document) {
                    return (negated ? !flag : flag) == false
                }
                return false
            }
            let result = test(op, argument, found, raw: key == "_id")
            return negated ? !result : result
        }
    }

    static func test(_ op: String, _ arg: JSON, _ value: JSON, raw: Bool) -> Bool {
        let cmp = raw ? CouchCollation.compareRaw : CouchCollation.compare
        func equal(_ x: JSON, _ y: JSON) -> Bool { cmp(x, y) == .same }
        switch op {
        case "$eq": return equal(value, arg)
        case "$ne": return !equal(value, arg)
        case "$gt": return cmp(value, arg) == .descending
        case "$gte": return cmp(value, arg) != .ascending
        case "$lt": return cmp(value, arg) == .ascending
        case "$lte": return cmp(value, arg) != .descending
        case "$in", "$nin":
            guard case .array(let args) = arg else { return false }
            var hit = false
            for candidate in args {
                if case .array(let items) = value {
                    for item in items where equal(item, candidate) { hit = true }
                } else if equal(value, candidate) {
                    hit = true
                }
            }
            return op == "$in" ? hit : !hit
        case "$exists": return arg == .bool(true)
        case "$type": return JSONType(of: value).rawValue == arg.stringValue
        case "$size":
            if case .array(let items) = value { return Int64(items.count) == arg.intValue }
            return false
        case "$all":
            guard case .array(let args) = arg, !args.isEmpty, case .array(let items) = value else { return false }
            var every = true
            for candidate in args where !items.contains(candidate) { every = false }
            return every || (args.count == 1 && args[0] == value)
        default:
            return false
        }
    }

    static func lookup(_ path: String, in document: JSON) -> JSON? {
        var current = document
        for part in path.split(separator: ".", omittingEmptySubsequences: false) {
            if case .object(let fields) = current, let next = fields[String(part)] {
                current = next
            } else if case .array(let items) = current, let i = Int(part), i >= 0, i < items.count {
                current = items[i]
            } else {
                return nil
            }
        }
        return current
    }

    /// True when the path fails only because an object on the way lacks the key.
    static func isMissing(_ path: String, in document: JSON) -> Bool {
        var current = document
        for part in path.split(separator: ".", omittingEmptySubsequences: false) {
            guard case .object(let fields) = current else { return false }
            guard let next = fields[String(part)] else { return true }
            current = next
        }
        return false
    }
}
