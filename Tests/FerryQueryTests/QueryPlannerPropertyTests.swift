import FerryCore
import FerryQuery
import Testing

/// The planner's guarantee, on random documents, indexes and selectors (types mixed on
/// purpose): every document the selector matches that an index holds has its key inside one
/// of the ranges, and a plan that reads an index reads one that holds every matching document.
@Suite struct QueryPlannerPropertyTests {
    static let strings = ["", "a", "A", "ab", "Ab", "b", "é", "É", "e", "résumé", "Resume", "z", "日本", "~", "10", "9", "a.b", "\u{10FFFF}"]
    static let paths = ["a", "b", "c", "a.b", "c.0", "_id"]

    static func scalar(using g: inout SeededGenerator) -> JSON {
        switch Int.random(in: 0..<8, using: &g) {
        case 0: return .null
        case 1: return .bool(Bool.random(using: &g))
        case 2: return .int(Int64.random(in: -3...3, using: &g))
        case 3: return .double(Double(Int.random(in: -12...12, using: &g)) / 4)
        default: return .string(strings.randomElement(using: &g)!)
        }
    }

    static func value(depth: Int, using g: inout SeededGenerator) -> JSON {
        guard depth > 0 else { return scalar(using: &g) }
        switch Int.random(in: 0..<6, using: &g) {
        case 0: return .array((0..<Int.random(in: 0...3, using: &g)).map { _ in value(depth: depth - 1, using: &g) })
        case 1:
            var o: [String: JSON] = [:]
            for key in ["a", "b"] where Bool.random(using: &g) { o[key] = value(depth: depth - 1, using: &g) }
            return .object(o)
        default: return scalar(using: &g)
        }
    }

    static func document(_ n: Int, using g: inout SeededGenerator) -> JSON {
        var o: [String: JSON] = [
            "_id": .string(strings.randomElement(using: &g)! + String(n)), "_rev": "1-abc",
        ]
        for key in ["a", "b", "c", "type"] where Int.random(in: 0..<5, using: &g) > 0 {
            o[key] = key == "type" ? .string(["user", "admin"].randomElement(using: &g)!) : value(depth: 2, using: &g)
        }
        return .object(o)
    }

    static func condition(using g: inout SeededGenerator) -> JSON {
        let v = value(depth: 1, using: &g)
        switch Int.random(in: 0..<19, using: &g) {
        case 0: return v
        case 1: return ["$eq": v]
        case 2: return ["$ne": v]
        case 3: return ["$gt": v]
        case 4: return ["$gte": v]
        case 5: return ["$lt": v]
        case 6: return ["$lte": v]
        case 7: return ["$in": .array((0..<Int.random(in: 0...3, using: &g)).map { _ in scalar(using: &g) })]
        case 8: return ["$nin": .array((0..<Int.random(in: 0...2, using: &g)).map { _ in scalar(using: &g) })]
        case 9: return ["$exists": .bool(Bool.random(using: &g))]
        case 10: return ["$type": .string(JSONType.allCases.randomElement(using: &g)!.rawValue)]
        case 11: return ["$size": .int(Int64.random(in: 0...2, using: &g))]
        case 12: return ["$mod": [2, .int(Int64.random(in: -1...1, using: &g))]]
        case 13: return ["$regex": ["^a", "b", "(?i)^r"].randomElement(using: &g)!]
        case 14: return ["$beginsWith": .string(["", "a", "A", "r", "é", "1", "\u{10FFFF}"].randomElement(using: &g)!)]
        case 15: return ["$elemMatch": ["$gt": scalar(using: &g)]]
        case 16: return ["$all": .array([scalar(using: &g)])]
        case 17: return ["$gt": v, "$lt": value(depth: 1, using: &g)]
        default: return ["$not": ["$eq": v]]
        }
    }

    static func selector(depth: Int, using g: inout SeededGenerator) -> JSON {
        if depth > 0 && Int.random(in: 0..<4, using: &g) == 0 {
            let clauses = (0..<Int.random(in: 0...3, using: &g)).map { _ in selector(depth: depth - 1, using: &g) }
            switch Int.random(in: 0..<4, using: &g) {
            case 0, 1: return ["$and": .array(clauses)]
            case 2: return ["$or": .array(clauses)]
            default: return ["$nor": .array(clauses)]
            }
        }
        var o: [String: JSON] = [:]
        for _ in 0..<Int.random(in: 1...3, using: &g) {
            o[paths.randomElement(using: &g)!] = condition(using: &g)
        }
        return .object(o)
    }

    static let partialFilters: [JSON?] = [nil, nil, ["type": "user"], ["type": "user", "b": ["$gt": 0]]]

    static func index(_ n: Int, using g: inout SeededGenerator) throws -> MangoIndex {
        var fields: [JSON] = []
        for _ in 0..<Int.random(in: 1...3, using: &g) { fields.append(.string(paths.randomElement(using: &g)!)) }
        var def: [String: JSON] = ["fields": .array(fields)]
        if let p = partialFilters.randomElement(using: &g)! { def["partial_filter_selector"] = p }
        return try MangoIndexRequest(parsing: ["index": .object(def), "ddoc": .string("d\(n)"), "name": "i"]).index
    }

    @Test func everyMatchingDocumentAnIndexHoldsHasItsKeyInARange() throws {
        var g = SeededGenerator(seed: 0xF1DD)
        let documents = (0..<120).map { Self.document($0, using: &g) }
        var inIndex = 0
        var narrowed = 0
        for round in 0..<700 {
            let selector = try MangoSelector(parsing: Self.selector(depth: 2, using: &g))
            let matching = documents.filter(selector.matches)
            let idx = try Self.index(round, using: &g)
            let ranges = QueryPlanner.keyRanges(selector, source: .index(idx))
            if ranges != [.all] { narrowed += 1 }
            for doc in matching {
                guard let key = idx.key(for: doc) else { continue }
                inIndex += 1
                let found = ranges.contains { $0.contains(key) }
                let context = "\(selector.root.json.canonicalString) index \(idx.json.canonicalString) doc \(doc.canonicalString)"
                #expect(found, "\(context)")
            }
            let idRanges = QueryPlanner.keyRanges(selector, source: .allDocs)
            for doc in matching {
                guard case .string(let id)? = doc.objectValue?["_id"] else { continue }
                let found = idRanges.contains { $0.contains(Array(id.utf8)) }
                let context = "\(selector.root.json.canonicalString) id \(id)"
                #expect(found, "\(context)")
            }
            Self.expectSortedAndDisjoint(ranges)
            Self.expectSortedAndDisjoint(idRanges)
        }
        #expect(inIndex > 1000)
        #expect(narrowed > 100)
    }

    @Test func aPlanReadsOnlyIndexesThatHoldEveryMatchingDocument() throws {
        var g = SeededGenerator(seed: 0x9A7E)
        let documents = (0..<80).map { Self.document($0, using: &g) }
        var indexed = 0
        for round in 0..<400 {
            let indexes = try (0..<3).map { try Self.index(round * 3 + $0, using: &g) }
            var body: [String: JSON] = ["selector": Self.selector(depth: 2, using: &g)]
            if Bool.random(using: &g), let named = indexes.randomElement(using: &g) {
                body["use_index"] = .string(named.designDocument)
                if named.partialFilter != nil, Bool.random(using: &g), case .object(var s) = body["selector"]! {
                    // Often imply the partial filter, so partial indexes do get chosen.
                    for (k, v) in named.partialFilter!.root.json.objectValue ?? [:] where !k.hasPrefix("$") { s[k] = v }
                    if case .array(let clauses)? = named.partialFilter!.root.json.objectValue?["$and"] {
                        s["$and"] = .array(clauses)
                    }
                    body["selector"] = .object(s)
                }
            }
            let query = try MangoQuery(parsing: .object(body))
            let plan = try QueryPlanner.plan(query, ready: indexes)
            // A bare `$and: []` or `$or: []` answers nothing, as in CouchDB.
            if query.selector.root == .and([]) || query.selector.root == .or([]) {
                #expect(plan.ranges.isEmpty)
                continue
            }
            let matching = documents.filter(query.selector.matches)
            switch plan.source {
            case .allDocs:
                for doc in matching {
                    guard case .string(let id)? = doc.objectValue?["_id"] else { continue }
                    let found = plan.ranges.contains { $0.contains(Array(id.utf8)) }
                    #expect(found)
                }
            case .index(let index):
                indexed += 1
                for doc in matching {
                    let key = index.key(for: doc)
                    let context = "\(query.selector.root.json.canonicalString) index \(index.json.canonicalString) doc \(doc.canonicalString)"
                    #expect(key != nil, "\(context)")
                    if let key {
                        let found = plan.ranges.contains { $0.contains(key) }
                        #expect(found, "\(context)")
                    }
                }
            }
        }
        #expect(indexed > 40)
    }

    static func expectSortedAndDisjoint(_ ranges: [KeyRange]) {
        for (a, b) in zip(ranges, ranges.dropFirst()) {
            guard let upper = a.upper, let lower = b.lower else {
                Issue.record("an open bound inside a list of ranges")
                continue
            }
            #expect(upper.lexicographicallyPrecedes(lower) || (upper == lower && !(a.upperInclusive && b.lowerInclusive)))
        }
    }
}
