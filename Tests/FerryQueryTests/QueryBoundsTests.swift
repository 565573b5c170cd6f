import FerryCore
@testable import FerryQuery
import Foundation
import Testing

/// The bounds on query work: key ranges built in n·log n however many values `$in` lists,
/// the selector limits and their errors, the `$regex` budget, and the query budget.
@Suite struct QueryBoundsTests {
    static let n = FieldPath(components: ["n"])
    static let byN = MangoIndex(designDocument: "_design/q", name: "by-n", fields: [.init(path: n)])

    static func parse(_ text: String) throws(MangoError) -> MangoSelector {
        do { return try MangoSelector(parsing: try JSON.parse(text)) } catch let error as MangoError { throw error } catch {
            throw .invalid("test JSON")
        }
    }

    static func refusal(_ text: String) -> MangoError? {
        do {
            _ = try parse(text)
            return nil
        } catch { return error }
    }

    // MARK: - Key ranges

    @Test func keyRangesOfTwoHundredThousandInValuesAreEachValueOnceInOrder() {
        // Built as a tree: the parser refuses this many values, the planner must still cope.
        let values = (0..<200_000).reversed().map { JSON.int(Int64($0 * 7 % 200_000)) } + [.int(5), .int(5)]
        let selector = MangoSelector(root: .field(Self.n, .in(values)))
        let ranges = QueryPlanner.keyRanges(selector, source: .index(Self.byN))
        // One point per distinct value, then every array (an array matches by its elements).
        #expect(ranges.count == 200_001)
        let points = ranges.dropLast()
        #expect(points.allSatisfy { $0.lower == $0.upper && $0.lowerInclusive && $0.upperInclusive })
        let expected = (0..<200_000).map { MangoIndex.fieldKey(.int(Int64($0)), path: Self.n) }.sorted {
            $0.lexicographicallyPrecedes($1)
        }
        #expect(points.map(\.lower!) == expected)
        #expect(ranges.last?.lower == [6])
    }

    @Test func keyRangesOfLargeOrAndAndAreTheirUnionAndIntersection() {
        let evens = (0..<20_000).map { JSON.int(Int64($0 * 2)) }
        let threes = (0..<20_000).map { JSON.int(Int64($0 * 3)) }
        let both = MangoSelector(root: .and([.field(Self.n, .in(evens)), .field(Self.n, .in(threes))]))
        let common = QueryPlanner.keyRanges(both, source: .index(Self.byN)).filter { $0.lower == $0.upper }
        #expect(common.count == (0..<40_000).filter { $0 % 6 == 0 }.count)
        let either = MangoSelector(root: .or(evens.map { .field(Self.n, .eq($0)) } + threes.map { .field(Self.n, .eq($0)) }))
        let union = QueryPlanner.keyRanges(either, source: .index(Self.byN))
        #expect(union.count == Set(evens + threes).count)
    }

    /// Union and intersection by merging agree with the definition (a key is in the result
    /// when it is in one set, or in both) on random small sets over a tiny alphabet.
    @Test func mergedUnionAndIntersectionAgreeWithMembership() {
        var rng = SystemRandomNumberGenerator()
        func randomKey() -> [UInt8] { (0..<Int.random(in: 0...2, using: &rng)).map { _ in UInt8.random(in: 0...3, using: &rng) } }
        func randomSet() -> ByteIntervals {
            ByteIntervals(
                (0..<Int.random(in: 0...4, using: &rng)).map { _ in
                    let a = randomKey()
                    let b = randomKey()
                    let (lo, hi) = a.lexicographicallyPrecedes(b) ? (a, b) : (b, a)
                    return .init(
                        lower: Bool.random() ? nil : .init(bytes: lo, inclusive: Bool.random()),
                        upper: Bool.random() ? nil : .init(bytes: hi, inclusive: Bool.random()))
                })
        }
        func contains(_ set: ByteIntervals, _ key: [UInt8]) -> Bool {
            set.intervals.contains { i in
                let aboveLower = i.lower.map { l in l.inclusive ? !key.lexicographicallyPrecedes(l.bytes) : l.bytes.lexicographicallyPrecedes(key) } ?? true
                let belowUpper = i.upper.map { u in u.inclusive ? !u.bytes.lexicographicallyPrecedes(key) : key.lexicographicallyPrecedes(u.bytes) } ?? true
                return aboveLower && belowUpper
            }
        }
        var keys: [[UInt8]] = [[]]
        for a in 0...3 {
            keys.append([UInt8(a)])
            for b in 0...3 { keys.append([UInt8(a), UInt8(b)]) }
        }
        for _ in 0..<2000 {
            let a = randomSet()
            let b = randomSet()
            let union = a.union(b)
            let intersection = a.intersection(b)
            for key in keys {
                #expect(contains(union, key) == (contains(a, key) || contains(b, key)))
                #expect(contains(intersection, key) == (contains(a, key) && contains(b, key)))
            }
            #expect(ByteIntervals(union.intervals) == union)
            #expect(ByteIntervals(intersection.intervals) == intersection)
        }
    }

    // MARK: - Selector limits

    @Test func anInListOverTheLimitIsRefusedNamingIt() throws {
        let values = (0...QueryLimits.maximumOperands).map(String.init).joined(separator: ",")
        for op in ["$in", "$nin", "$all"] {
            let error = try #require(Self.refusal(#"{"n":{"\#(op)":[\#(values)]}}"#))
            #expect(error.code == "bad_request")
            #expect(error.description.contains("maximumOperands"))
            #expect(error.description.contains(op))
        }
        let atLimit = (1...QueryLimits.maximumOperands).map(String.init).joined(separator: ",")
        #expect(Self.refusal(#"{"n":{"$in":[\#(atLimit)]}}"#) == nil)
    }

    @Test func tooManyClausesAreRefusedNamingTheLimit() throws {
        let clauses = (0...QueryLimits.maximumOperands).map { #"{"n":\#($0)}"# }.joined(separator: ",")
        for op in ["$or", "$and", "$nor"] {
            let error = try #require(Self.refusal(#"{"\#(op)":[\#(clauses)]}"#))
            #expect(error.code == "bad_request")
            #expect(error.description.contains("maximumOperands"))
        }
        let fields = (0...QueryLimits.maximumOperands).map { #""f\#($0)":1"# }.joined(separator: ",")
        #expect(Self.refusal("{\(fields)}")?.description.contains("maximumOperands") == true)
    }

    @Test func aSelectorCostingMoreThanTheLimitIsRefused() throws {
        let list = (1...QueryLimits.maximumOperands).map(String.init).joined(separator: ",")
        let lists = (0..<(QueryLimits.maximumSelectorCost / QueryLimits.maximumOperands)).map { #"{"f\#($0)":{"$in":[\#(list)]}}"# }
        let error = try #require(Self.refusal(#"{"$and":[\#(lists.joined(separator: ","))]}"#))
        #expect(error.code == "bad_request")
        #expect(error.description.contains("maximumSelectorCost"))
        #expect(Self.refusal(#"{"$and":[\#(lists.dropLast().joined(separator: ","))]}"#) == nil)
    }

    // MARK: - $regex

    static let catastrophic = String(repeating: "a", count: 36) + "!"

    @Test func aCatastrophicRegexStopsAtItsBudgetWithAClearError() throws {
        let regex = try #require(MangoRegex("(a+)+$"))
        #expect(throws: MangoError.regexTooCostly(pattern: "(a+)+$")) { try regex.test(Self.catastrophic) }
        let error = MangoError.regexTooCostly(pattern: "(a+)+$")
        #expect(error.code == "bad_request")
        #expect(error.description.contains("maximumRegexTicks"))
        // Evaluation: the query's error; plain matching: no match, even negated.
        let selector = try Self.parse(#"{"s":{"$regex":"(a+)+$"}}"#)
        #expect(throws: MangoError.self) { try selector.evaluate(["s": .string(Self.catastrophic)]) }
        #expect(!selector.matches(["s": .string(Self.catastrophic)]))
        let negated = try Self.parse(#"{"s":{"$not":{"$regex":"(a+)+$"}}}"#)
        #expect(!negated.matches(["s": .string(Self.catastrophic)]))
    }

    @Test func ordinaryRegexesMatchLongStringsWithinTheBudget() throws {
        let long = String(repeating: "lorem ipsum dolor ", count: 50_000) + "needle"
        #expect(try #require(MangoRegex("need+le$")).test(long))
        #expect(try !#require(MangoRegex("^x")).test(long))
        #expect(try #require(MangoRegex("(a+)+$")).test("aaaa"))
        #expect(try #require(MangoRegex("[a-z]+ [a-z]+ needle")).test(long))
    }

    // MARK: - Query budget

    @Test func aCancelledBudgetOrTaskStopsAQuery() async throws {
        let budget = QueryBudget(timeout: nil)
        try budget.check()
        budget.cancel()
        #expect(throws: QueryInterruption.cancelled) { try budget.check() }
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return Result { () throws(QueryInterruption) in try QueryBudget(timeout: nil).check() }
        }
        let result = await task.value
        #expect(throws: QueryInterruption.cancelled) { try result.get() }
    }

    @Test func aBudgetPastItsDeadlineStopsAQuery() {
        let budget = QueryBudget(timeout: .zero)
        #expect(throws: QueryInterruption.deadlineExceeded(.zero)) { try budget.check() }
    }
}
