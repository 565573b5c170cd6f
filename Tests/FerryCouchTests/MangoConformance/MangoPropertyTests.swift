import FerryCore
import Foundation
import Testing

/// Random documents and random selectors: `_find` through the target's HTTP API, on a database
/// without indexes and on one with random JSON indexes (some partial), gives exactly the
/// documents (and, when sorted, the order of their sort keys) that a brute-force evaluator
/// written here computes.
///
/// The evaluator is independent of FerryQuery: it implements CouchDB's rules for the values
/// generated here. Generated strings use only ASCII letters and digits, whose collation is
/// simple and unambiguous (digits before letters, a letter and its capital equal at the first
/// level, lowercase first at the last); numbers are small integers and halves, so `1` vs `1.0`
/// never arises; objects have lowercase keys. The seed is printed and is taken from
/// `FERRY_MANGO_PROPERTY_SEED` when set, to replay a failure. Against CouchDB 3.4.3, indexed
/// queries it fails with a 500 (it cannot bound an index range by some values) are counted
/// rather than compared; against Ferry every answer is compared.
@Suite struct MangoPropertyTests {
    @Test func findAgreesWithABruteForceEvaluatorWithAndWithoutIndexes() async throws {
        let seed = ProcessInfo.processInfo.environment["FERRY_MANGO_PROPERTY_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 1...UInt64.max)
        print("MangoPropertyTests seed: \(seed) (FERRY_MANGO_PROPERTY_SEED=\(seed) replays it)")
        var random = SplitMix64(seed: seed)
        let documents = (0..<60).map { MangoGenerator.document(id: String(format: "d%02d", $0), &random) }
        let indexes = MangoGenerator.indexes(&random)
        let partials = indexes.enumerated().filter { $0.element.partial != nil }.map { n, index in
            (ddoc: "random\(n % 2)", name: "random\(n)", fields: index.fields, filter: index.partial!)
        }
        let queries = (0..<120).map { _ in MangoGenerator.query(&random, partials: partials) }

        let scan = try await MangoTarget.start("prop_scan")
        let indexed = try await MangoTarget.start("prop_indexed")
        var failure: (any Error)?
        do {
            let texts = documents.map(\.canonicalString)
            try await scan.seed(texts)
            try await indexed.seed(texts)
            // An index on every field a query sorts on, then random ones, some partial.
            for field in MangoGenerator.sortFields {
                try await indexed.createIndex(#"{"index": {"fields": ["\#(field)"]}, "ddoc": "sort", "name": "\#(field)"}"#)
            }
            for (n, index) in indexes.enumerated() {
                var body: [String: JSON] = ["ddoc": .string("random\(n % 2)"), "name": .string("random\(n)"), "index": ["fields": .array(index.fields.map { .string($0) })]]
                if let partial = index.partial { body["index"] = ["fields": .array(index.fields.map { .string($0) }), "partial_filter_selector": partial] }
                try await indexed.createIndex(JSON.object(body).canonicalString)
            }
            var disagreements = 0, referenceFailures = 0
            for query in queries {
                let expected = MangoEvaluator.answer(query, documents)
                for (mode, target) in [("scan", scan), ("indexed", indexed)] {
                    if query.sort != nil && mode == "scan" { continue }
                    let (status, answer) = try await target.post("_find", query.body.canonicalString)
                    if target.isReference && mode == "indexed" && status == 500 {
                        // CouchDB 3.4.3 fails (`function_clause`) on an index range bounded by
                        // null, `$in` of null, or an array or object holding null or a boolean.
                        referenceFailures += 1
                        continue
                    }
                    let got = answer["docs"]?.mangoItems.map { $0["_id"]?.stringValue ?? "?" }
                    let same = status == 200 && got?.sorted() == expected.sorted()
                        && (query.sort == nil || MangoEvaluator.sameOrder(got ?? [], expected, by: query.sort!.field, in: documents))
                    if !same {
                        disagreements += 1
                        var keys = ""
                        if let sort = query.sort {
                            keys = "\n sort keys: " + (answer["docs"]?.mangoItems ?? []).map { doc in
                                "\(doc["_id"]?.stringValue ?? "?")=\(MangoEvaluator.lookup(sort.field, in: doc).value?.canonicalString ?? "-")"
                            }.joined(separator: " ")
                        }
                        Issue.record(
                            "seed \(seed), \(mode): \(query.body.canonicalString)\n answered \(status): \(got.map { "\($0)" } ?? "\(answer)")\n expected \(expected)\(keys)")
                    }
                }
            }
            let failed = scan.isReference ? ", \(referenceFailures) indexed queries CouchDB failed" : ""
            print("MangoPropertyTests: \(queries.count) queries, \(disagreements) disagreements\(failed)")
        } catch { failure = error }
        await scan.end()
        await indexed.end()
        if let failure { throw failure }
    }

    /// The evaluator is a real check: a deliberately wrong rule (`$ne` matching a missing
    /// field) makes it disagree with itself on a document that lacks the field.
    @Test func theEvaluatorTellsAMissingFieldFromAnUnequalOne() {
        let docs: [JSON] = [["_id": "x", "a": 1], ["_id": "y"]]
        let query = MangoGenerator.Query(selector: ["a": ["$ne": 2]], sort: nil)
        #expect(MangoEvaluator.answer(query, docs) == ["x"])
        #expect(MangoEvaluator.answer(MangoGenerator.Query(selector: ["a": ["$exists": false]], sort: nil), docs) == ["y"])
        #expect(MangoEvaluator.answer(MangoGenerator.Query(selector: ["$not": ["a": ["$gt": 0]]], sort: nil), docs) == [])
    }
}

/// A small seeded generator (SplitMix64), so that a run is replayed from its seed.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Random documents, selectors and indexes over a few fields whose values mix every JSON type.
enum MangoGenerator {
    /// A `_find` body's selector, and the field and direction it sorts by, if any.
    struct Query {
        var selector: JSON
        var sort: (field: String, descending: Bool)?
        /// `use_index`: a design document and index name.
        var useIndex: [String]? = nil
        var body: JSON {
            var out: [String: JSON] = ["selector": selector, "limit": 10_000]
            if let sort { out["sort"] = [.object([sort.field: .string(sort.descending ? "desc" : "asc")])] }
            if let useIndex { out["use_index"] = .array(useIndex.map { .string($0) }) }
            return .object(out)
        }
    }

    static let fields = ["a", "b", "c", "t", "n.x", "n.y"]
    static let sortFields = ["a", "b", "n.x"]
    static let letters = Array("abAB019z")

    static func pick<T>(_ items: [T], _ r: inout SplitMix64) -> T { items[Int(r.next() % UInt64(items.count))] }
    static func chance(_ percent: UInt64, _ r: inout SplitMix64) -> Bool { r.next() % 100 < percent }

    static func string(_ r: inout SplitMix64) -> String {
        String((0..<Int(r.next() % 3)).map { _ in pick(letters, &r) })
    }

    static func scalar(_ r: inout SplitMix64) -> JSON {
        switch r.next() % 7 {
        case 0: return .null
        case 1: return .bool(chance(50, &r))
        case 2, 3: return .int(Int64(r.next() % 9) - 3)
        case 4: return .double(Double(Int64(r.next() % 9) - 4) + 0.5)
        default: return .string(string(&r))
        }
    }

    static func value(_ r: inout SplitMix64, depth: Int = 0) -> JSON {
        let roll = r.next() % 10
        if depth < 2 && roll < 2 { return .array((0..<Int(r.next() % 4)).map { _ in value(&r, depth: depth + 1) }) }
        if depth < 2 && roll == 2 {
            var o: [String: JSON] = [:]
            for _ in 0..<Int(r.next() % 3) { o[pick(["k", "m", "x"], &r)] = scalar(&r) }
            return .object(o)
        }
        return scalar(&r)
    }

    static func document(id: String, _ r: inout SplitMix64) -> JSON {
        var doc: [String: JSON] = ["_id": .string(id)]
        for f in ["a", "b", "c"] where chance(80, &r) { doc[f] = value(&r) }
        if chance(70, &r) { doc["t"] = .array((0..<Int(r.next() % 4)).map { _ in scalar(&r) }) } else if chance(30, &r) { doc["t"] = scalar(&r) }
        switch r.next() % 4 {
        case 0: break
        case 1: doc["n"] = scalar(&r)
        default:
            var n: [String: JSON] = [:]
            if chance(75, &r) { n["x"] = value(&r) }
            if chance(50, &r) { n["y"] = scalar(&r) }
            doc["n"] = .object(n)
        }
        return .object(doc)
    }

    /// A field condition: an operator and a generated argument.
    static func condition(_ r: inout SplitMix64, depth: Int) -> JSON {
        switch r.next() % 17 {
        case 0: return ["$eq": value(&r)]
        case 1: return ["$ne": value(&r)]
        case 2: return ["$gt": value(&r)]
        case 3: return ["$gte": value(&r)]
        case 4: return ["$lt": value(&r)]
        case 5: return ["$lte": value(&r)]
        case 6: return ["$in": .array((0..<Int(1 + r.next() % 3)).map { _ in member(&r) })]
        case 7: return ["$nin": .array((0..<Int(1 + r.next() % 3)).map { _ in member(&r) })]
        case 8: return ["$exists": .bool(chance(50, &r))]
        case 9: return ["$type": .string(pick(["null", "boolean", "number", "string", "array", "object"], &r))]
        case 10: return ["$size": .int(Int64(r.next() % 4))]
        case 11: return ["$mod": [.int(Int64(2 + r.next() % 2)), .int(Int64(r.next() % 3) - 1)]]
        case 12: return ["$regex": .string(pick(["^a", "b$", "[0-9]", "(?i)^a", "^$", "z"], &r))]
        case 13: return ["$all": .array((0..<Int(1 + r.next() % 2)).map { _ in member(&r) })]
        case 14: return ["$elemMatch": elementSelector(&r)]
        case 15: return ["$allMatch": elementSelector(&r)]
        default: return ["$keyMapMatch": [pick(["$eq", "$gt", "$lt"], &r): .string(pick(["k", "m", "x", "a"], &r))]]
        }
    }

    /// An argument of `$in`, `$nin` or `$all`: no null and no array (CouchDB 3.4.3 fails such a
    /// query with a 500 when it runs on an index).
    static func member(_ r: inout SplitMix64) -> JSON {
        for _ in 0..<20 {
            let v = value(&r)
            switch v {
            case .null, .array: continue
            default: return v
            }
        }
        return .int(1)
    }

    /// The selector of `$elemMatch`/`$allMatch`: conditions on the element itself, or on a key
    /// of an element that is an object.
    static func elementSelector(_ r: inout SplitMix64) -> JSON {
        let op = pick(["$eq", "$ne", "$gt", "$lt", "$type"], &r)
        let arg: JSON = op == "$type" ? .string(pick(["number", "string", "null"], &r)) : scalar(&r)
        return chance(70, &r) ? .object([op: arg]) : .object([pick(["k", "m"], &r): .object([op: arg])])
    }

    static func selector(_ r: inout SplitMix64, depth: Int = 0) -> JSON {
        let roll = r.next() % 10
        if depth < 2 && roll < 3 {
            let parts = (0..<Int(r.next() % 3 + 1)).map { _ in selector(&r, depth: depth + 1) }
            return .object([pick(["$and", "$or", "$nor"], &r): .array(parts)])
        }
        if depth < 2 && roll == 3 { return ["$not": selector(&r, depth: depth + 1)] }
        var out: [String: JSON] = [:]
        for _ in 0..<Int(r.next() % 2 + 1) {
            let field = pick(fields, &r)
            var c = chance(15, &r) ? value(&r) : condition(&r, depth: depth)
            if c == .object([:]) { c = ["$eq": [:]] }
            out[field] = c
        }
        // An implicit-equality object (`{"n": {"x": 1}}`) names a sub-field, not a whole object.
        if case .object(let o)? = out["n.x"], chance(20, &r) { out.removeValue(forKey: "n.x"); out["n"] = ["x": .object(o)] }
        return .object(out)
    }

    /// A random query; some name a partial index (`use_index`) and ask, besides their own
    /// conditions, for what its filter admits and for its fields, so that the index holds
    /// every answer.
    static func query(
        _ r: inout SplitMix64, partials: [(ddoc: String, name: String, fields: [String], filter: JSON)] = []
    ) -> Query {
        var selector = self.selector(&r)
        if !partials.isEmpty, chance(20, &r) {
            let index = pick(partials, &r)
            let exists = index.fields.map { JSON.object([$0: ["$exists": true]]) }
            selector = ["$and": .array([selector, index.filter] + exists)]
            return Query(selector: selector, sort: nil, useIndex: [index.ddoc, index.name])
        }
        guard chance(30, &r) else { return Query(selector: selector, sort: nil) }
        let field = pick(sortFields, &r)
        // CouchDB sorts by an index only when the selector needs the field.
        selector = ["$and": [selector, .object([field: ["$exists": true]])]]
        return Query(selector: selector, sort: (field, chance(50, &r)))
    }

    /// Random JSON index definitions: fields, and a partial filter for some.
    static func indexes(_ r: inout SplitMix64) -> [(fields: [String], partial: JSON?)] {
        (0..<4).map { _ in
            let first = pick(fields, &r)
            var list = [first]
            if chance(40, &r) { let second = pick(fields, &r); if second != first { list.append(second) } }
            let partial: JSON? = chance(50, &r) ? .object([pick(fields, &r): condition(&r, depth: 0)]) : nil
            return (list, partial)
        }
    }
}

/// CouchDB's selector semantics and collation, for the values `MangoGenerator` makes.
enum MangoEvaluator {
    /// The IDs of the matching documents: in sort order when the query sorts (ties by ID,
    /// reversed when descending; `sameOrder` accepts any order of ties), else in ID order.
    static func answer(_ query: MangoGenerator.Query, _ docs: [JSON]) -> [String] {
        let selector = normalise(query.selector)
        let matching = docs.filter { matches(selector, $0) }
        guard let sort = query.sort else { return matching.compactMap { $0["_id"]?.stringValue }.sorted() }
        let keyed = matching.map { (doc: $0, key: lookup(sort.field, in: $0)) }
        let ordered = keyed.sorted { x, y in
            let c = compare(x.key.value ?? .null, y.key.value ?? .null)
            if c != 0 { return sort.descending ? c > 0 : c < 0 }
            let (i, j) = (x.doc["_id"]?.stringValue ?? "", y.doc["_id"]?.stringValue ?? "")
            return sort.descending ? i > j : i < j
        }
        return ordered.compactMap { $0.doc["_id"]?.stringValue }
    }

    /// Whether two orderings of the same documents list the same sort keys in the same order:
    /// CouchDB orders only by the sort field, and documents with equal keys come in the order
    /// of the index it chose (by ID for a one-field index, by a further field for a longer one).
    static func sameOrder(_ got: [String], _ expected: [String], by field: String, in docs: [JSON]) -> Bool {
        var byID: [String: JSON] = [:]
        for doc in docs { if let id = doc["_id"]?.stringValue { byID[id] = lookup(field, in: doc).value ?? .null } }
        guard got.count == expected.count else { return false }
        return zip(got, expected).allSatisfy { compare(byID[$0] ?? .null, byID[$1] ?? .null) == 0 }
    }

    // MARK: Selectors

    /// A selector's members with sub-field objects written as dotted paths
    /// (`{"n": {"x": 1}}` is `{"n.x": 1}`), as CouchDB reads them.
    static func flatten(_ o: [String: JSON]) -> [(key: String, value: JSON)] {
        var out: [(key: String, value: JSON)] = []
        for (key, value) in o.sorted(by: { $0.key < $1.key }) {
            if !key.hasPrefix("$"), case .object(let sub) = value, let first = sub.keys.first, !first.hasPrefix("$") {
                out += flatten(sub).map { (key + "." + $0.key, $0.value) }
            } else {
                out.append((key, value))
            }
        }
        return out
    }

    /// Pushes `$not` and `$nor` down to the conditions (De Morgan; each operator's opposite),
    /// as CouchDB normalises a selector before matching.
    static func normalise(_ s: JSON) -> JSON {
        guard case .object(let o) = s else { return s }
        var parts: [JSON] = []
        for (key, value) in flatten(o) {
            switch key {
            case "$not": parts.append(negate(value))
            case "$nor": parts.append(["$and": .array(value.mangoItems.map(negate))])
            case "$and", "$or": parts.append(.object([key: .array(value.mangoItems.map(normalise))]))
            default: parts.append(.object([key: value]))
            }
        }
        return parts.count == 1 ? parts[0] : ["$and": .array(parts)]
    }

    static let opposite = ["$lt": "$gte", "$gte": "$lt", "$lte": "$gt", "$gt": "$lte", "$eq": "$ne", "$ne": "$eq", "$in": "$nin", "$nin": "$in"]

    static func negate(_ s: JSON) -> JSON {
        guard case .object(let o) = s else { return s }
        var parts: [JSON] = []
        for (key, value) in flatten(o) {
            switch key {
            case "$not": parts.append(normalise(value))
            case "$nor": parts.append(["$or": .array(value.mangoItems.map(normalise))])
            case "$and": parts.append(["$or": .array(value.mangoItems.map(negate))])
            case "$or": parts.append(["$and": .array(value.mangoItems.map(negate))])
            default: parts.append(negateField(key, value))
            }
        }
        // NOT(a AND b) = NOT a OR NOT b: a selector with several members negates to an `$or`.
        return parts.count == 1 ? parts[0] : ["$or": .array(parts)]
    }

    /// The negation of one field's condition (operators, or an implicit equality), as a selector.
    static func negateField(_ key: String, _ c: JSON) -> JSON {
        guard case .object(let o) = c, let first = o.keys.first, first.hasPrefix("$") else { return .object([key: ["$ne": c]]) }
        var parts: [JSON] = []
        for (op, arg) in o.sorted(by: { $0.key < $1.key }) {
            if let other = opposite[op] {
                parts.append(.object([key: .object([other: arg])]))
            } else if op == "$exists" {
                parts.append(.object([key: ["$exists": .bool(!(arg.boolValue ?? false))]]))
            } else {
                parts.append(.object([key: ["$not": .object([op: arg])]]))
            }
        }
        return parts.count == 1 ? parts[0] : ["$or": .array(parts)]
    }

    /// Whether a normalised selector matches a document (or, inside `$elemMatch`, an element).
    static func matches(_ s: JSON, _ doc: JSON) -> Bool {
        guard case .object(let o) = s else { return false }
        for (key, value) in o {
            switch key {
            case "$and": if !value.mangoItems.allSatisfy({ matches(normalise($0), doc) }) { return false }
            case "$or": if !value.mangoItems.isEmpty && !value.mangoItems.contains(where: { matches(normalise($0), doc) }) { return false }
            case "$not": if matches(normalise(value), doc) { return false }
            case "$nor": if value.mangoItems.contains(where: { matches(normalise($0), doc) }) { return false }
            default:
                if !fieldMatches(key, value, doc) { return false }
            }
        }
        return true
    }

    /// A condition on a field (a dotted path) of `doc`.
    static func fieldMatches(_ path: String, _ condition: JSON, _ doc: JSON) -> Bool {
        let found = lookup(path, in: doc)
        if found.badPath { return false }
        guard case .object(let ops) = condition, let first = ops.keys.first, first.hasPrefix("$") else {
            guard let v = found.value else { return false }
            return compare(v, condition) == 0
        }
        for (op, arg) in ops {
            guard let v = found.value else {
                if op == "$exists", arg == .bool(false) { continue }
                return false
            }
            if !test(op, arg, v) { return false }
        }
        return true
    }

    /// One operator on a present value.
    static func test(_ op: String, _ arg: JSON, _ v: JSON) -> Bool {
        switch op {
        case "$eq": return compare(v, arg) == 0
        case "$ne": return compare(v, arg) != 0
        case "$gt": return compare(v, arg) > 0
        case "$gte": return compare(v, arg) >= 0
        case "$lt": return compare(v, arg) < 0
        case "$lte": return compare(v, arg) <= 0
        case "$in": return isIn(v, arg.mangoItems)
        case "$nin":
            if arg.mangoItems.isEmpty { return true }
            if case .array = v { return !isIn(v, arg.mangoItems) }
            return arg.mangoItems.allSatisfy { compare(v, $0) != 0 }
        case "$exists": return arg == .bool(true)
        case "$type": return typeName(v) == arg.stringValue
        case "$size": if case .array(let a) = v { return a.count == arg.intValue.map(Int.init) }; return false
        case "$mod":
            guard case .int(let i) = v, let d = arg.mangoItems.first?.intValue, let m = arg.mangoItems.last?.intValue else { return false }
            return i % d == m
        case "$regex":
            guard case .string(let s) = v, let pattern = arg.stringValue else { return false }
            return s.range(of: pattern.replacingOccurrences(of: "(?i)", with: ""), options: pattern.hasPrefix("(?i)") ? [.regularExpression, .caseInsensitive] : .regularExpression) != nil
        case "$all":
            guard case .array(let a) = v, !arg.mangoItems.isEmpty else { return false }
            return arg.mangoItems.allSatisfy { x in a.contains(x) }
        case "$elemMatch":
            guard case .array(let a) = v else { return false }
            return a.contains { elementMatches(arg, $0) }
        case "$allMatch":
            guard case .array(let a) = v, !a.isEmpty else { return false }
            return a.allSatisfy { elementMatches(arg, $0) }
        case "$keyMapMatch":
            guard case .object(let o) = v else { return false }
            return o.keys.contains { elementMatches(arg, .string($0)) }
        case "$not": return !fieldTest(arg, v)
        default: return false
        }
    }

    /// A field-less condition object applied to a value (`{"$gt": 1}` or several).
    static func fieldTest(_ condition: JSON, _ v: JSON) -> Bool {
        guard case .object(let ops) = condition else { return compare(v, condition) == 0 }
        return ops.allSatisfy { test($0.key, $0.value, v) }
    }

    /// `$elemMatch`'s selector on one element: conditions without a field apply to the element.
    static func elementMatches(_ s: JSON, _ element: JSON) -> Bool {
        guard case .object(let o) = s else { return false }
        return o.allSatisfy { key, value in
            key.hasPrefix("$") ? test(key, value, element) : fieldMatches(key, value, element)
        }
    }

    static func isIn(_ v: JSON, _ args: [JSON]) -> Bool {
        if case .array(let elements) = v { return elements.contains { e in args.contains { compare(e, $0) == 0 } } }
        return args.contains { compare(v, $0) == 0 }
    }

    /// A path's value: nil when missing; `badPath` when it runs into a scalar, or into an array
    /// with a component that is not an index in range.
    static func lookup(_ path: String, in doc: JSON) -> (value: JSON?, badPath: Bool) {
        var current = doc
        for component in path.split(separator: ".", omittingEmptySubsequences: false).map(String.init) {
            switch current {
            case .object(let o):
                guard let next = o[component] else { return (nil, false) }
                current = next
            case .array(let a):
                guard let i = Int(component), i >= 0, i < a.count else { return (nil, true) }
                current = a[i]
            default: return (nil, true)
            }
        }
        return (current, false)
    }

    // MARK: Collation

    static func typeName(_ v: JSON) -> String {
        switch v {
        case .null: "null"
        case .bool: "boolean"
        case .int, .double: "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }

    static func rank(_ v: JSON) -> Int {
        switch v {
        case .null: 0
        case .bool(false): 1
        case .bool(true): 2
        case .int, .double: 3
        case .string: 4
        case .array: 5
        case .object: 6
        }
    }

    /// CouchDB's collation: by type, then numbers by value, strings as ICU orders letters and
    /// digits, arrays element by element, objects member by member (keys in written order,
    /// which for the generated documents is key order).
    static func compare(_ x: JSON, _ y: JSON) -> Int {
        let (rx, ry) = (rank(x), rank(y))
        if rx != ry { return rx < ry ? -1 : 1 }
        switch (x, y) {
        case (.int, _), (.double, _):
            let (a, b) = (x.doubleValue ?? 0, y.doubleValue ?? 0)
            return a == b ? 0 : (a < b ? -1 : 1)
        case (.string(let a), .string(let b)): return compareStrings(a, b)
        case (.array(let a), .array(let b)):
            for (p, q) in zip(a, b) {
                let c = compare(p, q)
                if c != 0 { return c }
            }
            return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
        case (.object(let a), .object(let b)):
            let (ka, kb) = (a.keys.sorted(), b.keys.sorted())
            for (p, q) in zip(ka, kb) {
                let c = compareStrings(p, q)
                if c != 0 { return c }
                let d = compare(a[p]!, b[q]!)
                if d != 0 { return d }
            }
            return ka.count == kb.count ? 0 : (ka.count < kb.count ? -1 : 1)
        default: return 0
        }
    }

    /// ICU's root order for ASCII letters and digits: digits first, letters case-blind, then
    /// (for otherwise equal strings) lowercase before uppercase at the first difference.
    static func compareStrings(_ a: String, _ b: String) -> Int {
        func primary(_ c: Character) -> Int { c.isNumber ? Int(c.asciiValue ?? 0) : 100 + Int(c.lowercased().first!.asciiValue ?? 0) }
        let (pa, pb) = (a.map(primary), b.map(primary))
        if pa != pb {
            for (p, q) in zip(pa, pb) where p != q { return p < q ? -1 : 1 }
            return pa.count < pb.count ? -1 : 1
        }
        for (p, q) in zip(a, b) where p != q { return p.isLowercase ? -1 : 1 }
        return 0
    }
}
