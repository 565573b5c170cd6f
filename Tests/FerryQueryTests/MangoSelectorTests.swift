import FerryCore
import FerryQuery
import Testing

private func json(_ text: String) -> JSON { try! JSON.parse(text) }
private func selector(_ text: String) throws(MangoError) -> MangoSelector { try MangoSelector(parsing: json(text)) }

/// One row of the conformance table: a selector, a document and whether CouchDB matches it.
struct MatchCase: CustomTestStringConvertible, Sendable {
    let selector: String
    let document: String
    let matches: Bool
    var testDescription: String { "\(selector) on \(document) → \(matches)" }
    init(_ selector: String, _ document: String, _ matches: Bool) {
        (self.selector, self.document, self.matches) = (selector, document, matches)
    }
}

/// Rows from the examples in CouchDB's "Selector Syntax" documentation and the rules of its
/// Mango evaluator, with types mixed on purpose.
let conformanceTable: [MatchCase] = [
    // Implicit $eq, implicit $and, subfields.
    MatchCase(#"{"name": "Paul"}"#, #"{"name": "Paul"}"#, true),
    MatchCase(#"{"name": "Paul"}"#, #"{"name": "paul"}"#, false),
    MatchCase(#"{"name": "Paul", "location": "Boston"}"#, #"{"name": "Paul", "location": "Boston"}"#, true),
    MatchCase(#"{"name": "Paul", "location": "Boston"}"#, #"{"name": "Paul", "location": "Bristol"}"#, false),
    MatchCase(#"{"imdb": {"rating": 8}}"#, #"{"imdb": {"rating": 8, "votes": 3}}"#, true),
    MatchCase(#"{"imdb.rating": 8}"#, #"{"imdb": {"rating": 8.0}}"#, true),
    MatchCase(#"{"imdb": {"rating": 8, "votes": 3}}"#, #"{"imdb": {"rating": 8, "votes": 3, "x": 1}}"#, true),
    MatchCase(#"{"imdb": {"$eq": {"rating": 8}}}"#, #"{"imdb": {"rating": 8, "votes": 3}}"#, false),
    MatchCase(#"{"imdb": {"$eq": {"rating": 8}}}"#, #"{"imdb": {"rating": 8}}"#, true),
    MatchCase(#"{"a": {}}"#, #"{"a": {}}"#, true),
    MatchCase(#"{"a": {}}"#, #"{"a": {"b": 1}}"#, false),
    MatchCase(#"{"a\\.b": 1}"#, #"{"a.b": 1}"#, true),
    MatchCase(#"{"a\\.b": 1}"#, #"{"a": {"b": 1}}"#, false),
    MatchCase(#"{"tags.1": "y"}"#, #"{"tags": ["x", "y"]}"#, true),
    MatchCase(#"{"tags.2": {"$exists": false}}"#, #"{"tags": ["x", "y"]}"#, false),
    MatchCase(#"{"a.b": {"$exists": false}}"#, #"{"a": 5}"#, false),
    MatchCase(#"{"a.b": {"$exists": false}}"#, #"{"a": {}}"#, true),
    MatchCase(#"{}"#, #"{"anything": [1]}"#, true),
    // Equality compares whole values; an array is not searched.
    MatchCase(#"{"tags": "x"}"#, #"{"tags": ["x", "y"]}"#, false),
    MatchCase(#"{"tags": ["x", "y"]}"#, #"{"tags": ["x", "y"]}"#, true),
    MatchCase(#"{"tags": ["x", "y"]}"#, #"{"tags": ["y", "x"]}"#, false),
    MatchCase(#"{"n": 1}"#, #"{"n": 1.0}"#, true),
    MatchCase(#"{"n": 1}"#, #"{"n": "1"}"#, false),
    MatchCase(#"{"n": null}"#, #"{"n": null}"#, true),
    MatchCase(#"{"n": null}"#, #"{}"#, false),
    // Comparisons use the collation across types.
    MatchCase(#"{"year": {"$gte": 1900, "$lte": 1903}}"#, #"{"year": 1901}"#, true),
    MatchCase(#"{"year": {"$gte": 1900, "$lte": 1903}}"#, #"{"year": 1904}"#, false),
    MatchCase(#"{"a": {"$gt": 5}}"#, #"{"a": "x"}"#, true),
    MatchCase(#"{"a": {"$gt": 5}}"#, #"{"a": null}"#, false),
    MatchCase(#"{"a": {"$gt": 5}}"#, #"{"a": [1]}"#, true),
    MatchCase(#"{"a": {"$lt": "b"}}"#, #"{"a": "B"}"#, false),
    MatchCase(#"{"a": {"$lt": "b"}}"#, #"{"a": "aZ"}"#, true),
    MatchCase(#"{"a": {"$lt": "b"}}"#, #"{"a": true}"#, true),
    MatchCase(#"{"a": {"$lte": 2.5}}"#, #"{"a": 2}"#, true),
    MatchCase(#"{"a": {"$gt": null}}"#, #"{"a": false}"#, true),
    MatchCase(#"{"_id": {"$gt": null}}"#, #"{"_id": "doc"}"#, true),
    MatchCase(#"{"_id": {"$lt": "b"}}"#, #"{"_id": "B"}"#, true),
    MatchCase(#"{"a": {"$gt": [1, 2]}}"#, #"{"a": [1, 3]}"#, true),
    MatchCase(#"{"a": {"$gt": {"x": 1}}}"#, #"{"a": {"x": 2}}"#, true),
    // $ne, $nin and every other operator need the field to exist; only $exists:false does not.
    MatchCase(#"{"a": {"$ne": 1}}"#, #"{"a": 2}"#, true),
    MatchCase(#"{"a": {"$ne": 1}}"#, #"{"b": 1}"#, false),
    MatchCase(#"{"a": {"$nin": [1]}}"#, #"{"b": 1}"#, false),
    MatchCase(#"{"a": {"$exists": false}}"#, #"{"b": 1}"#, true),
    MatchCase(#"{"a": {"$exists": false}}"#, #"{"a": null}"#, false),
    MatchCase(#"{"a": {"$exists": true}}"#, #"{"a": null}"#, true),
    MatchCase(#"{"a": {"$type": "null"}}"#, #"{}"#, false),
    // Negations are pushed down to the conditions, as CouchDB normalises them.
    MatchCase(#"{"$not": {"a": {"$gt": 1}}}"#, #"{"a": 0}"#, true),
    MatchCase(#"{"$not": {"a": {"$gt": 1}}}"#, #"{"b": 0}"#, false),
    MatchCase(#"{"$not": {"a": {"$exists": true}}}"#, #"{"b": 0}"#, true),
    MatchCase(#"{"$not": {"$not": {"a": 1}}}"#, #"{"a": 1}"#, true),
    MatchCase(#"{"a": {"$not": {"$type": "string"}}}"#, #"{"a": 1}"#, true),
    MatchCase(#"{"a": {"$not": {"$type": "string"}}}"#, #"{}"#, false),
    MatchCase(#"{"year": {"$gte": 1900, "$lte": 1903}, "$not": {"year": 1901}}"#, #"{"year": 1901}"#, false),
    MatchCase(#"{"year": {"$gte": 1900, "$lte": 1903}, "$not": {"year": 1901}}"#, #"{"year": 1902}"#, true),
    MatchCase(#"{"year": 1977, "$nor": [{"director": "George Lucas"}, {"director": "Steven Spielberg"}]}"#,
              #"{"year": 1977, "director": "Ridley Scott"}"#, true),
    MatchCase(#"{"year": 1977, "$nor": [{"director": "George Lucas"}, {"director": "Steven Spielberg"}]}"#,
              #"{"year": 1977, "director": "George Lucas"}"#, false),
    MatchCase(#"{"year": 1977, "$nor": [{"director": "George Lucas"}]}"#, #"{"year": 1977}"#, false),
    MatchCase(#"{"$not": {"$or": [{"a": 1}, {"b": 2}]}}"#, #"{"a": 3, "b": 4}"#, true),
    MatchCase(#"{"$not": {"$or": [{"a": 1}, {"b": 2}]}}"#, #"{"a": 3}"#, false),
    MatchCase(#"{"$not": {"$and": [{"a": 1}, {"b": 2}]}}"#, #"{"a": 1}"#, false),
    MatchCase(#"{"$not": {"$and": [{"a": 1}, {"b": 2}]}}"#, #"{"a": 2}"#, true),
    // $or, $and and field-level combinations.
    MatchCase(#"{"$or": [{"director": "George Lucas"}, {"director": "Steven Spielberg"}]}"#,
              #"{"director": "Steven Spielberg"}"#, true),
    MatchCase(#"{"$or": [{"director": "George Lucas"}, {"year": 1977}]}"#, #"{"director": "X", "year": 1978}"#, false),
    MatchCase(#"{"a": {"$or": [{"$lt": 0}, {"$gt": 10}]}}"#, #"{"a": 11}"#, true),
    MatchCase(#"{"a": {"$or": [{"$lt": 0}, {"$gt": 10}]}}"#, #"{"a": 5}"#, false),
    MatchCase(#"{"a": {"$and": [{"$gt": 0}, {"b": 1}]}}"#, #"{"a": {"b": 1}}"#, true),
    MatchCase(#"{"$or": []}"#, #"{"a": 1}"#, true),
    MatchCase(#"{"$and": []}"#, #"{"a": 1}"#, true),
    MatchCase(#"{"$nor": []}"#, #"{"a": 1}"#, true),
    // $in and $nin, with array fields matching on any element.
    MatchCase(#"{"year": {"$in": [2001, 2002]}}"#, #"{"year": 2002}"#, true),
    MatchCase(#"{"year": {"$in": [2001, 2002]}}"#, #"{"year": 2003}"#, false),
    MatchCase(#"{"a": {"$in": [1, 5]}}"#, #"{"a": [5, 6]}"#, true),
    MatchCase(#"{"a": {"$in": [1, 5]}}"#, #"{"a": [6, 7]}"#, false),
    MatchCase(#"{"a": {"$in": [[1, 5]]}}"#, #"{"a": [1, 5]}"#, false),
    MatchCase(#"{"a": {"$in": [[1, 5]]}}"#, #"{"a": [[1, 5]]}"#, true),
    MatchCase(#"{"a": {"$in": []}}"#, #"{"a": 1}"#, false),
    MatchCase(#"{"a": {"$in": [1.0, "x"]}}"#, #"{"a": 1}"#, true),
    MatchCase(#"{"a": {"$nin": [1]}}"#, #"{"a": [2, 3]}"#, true),
    MatchCase(#"{"a": {"$nin": [1]}}"#, #"{"a": [1, 3]}"#, false),
    MatchCase(#"{"a": {"$nin": [1, 2]}}"#, #"{"a": 3}"#, true),
    MatchCase(#"{"a": {"$nin": []}}"#, #"{"a": 3}"#, true),
    // $all.
    MatchCase(#"{"genre": {"$all": ["Comedy", "Short"]}}"#, #"{"genre": ["Short", "Drama", "Comedy"]}"#, true),
    MatchCase(#"{"genre": {"$all": ["Comedy", "Short"]}}"#, #"{"genre": ["Comedy"]}"#, false),
    MatchCase(#"{"genre": {"$all": ["Comedy"]}}"#, #"{"genre": "Comedy"}"#, false),
    MatchCase(#"{"a": {"$all": [[1, 2]]}}"#, #"{"a": [1, 2]}"#, true),
    MatchCase(#"{"a": {"$all": [[1, 2]]}}"#, #"{"a": [[1, 2], 3]}"#, true),
    MatchCase(#"{"a": {"$all": []}}"#, #"{"a": [1]}"#, false),
    // $elemMatch, $allMatch, $keyMapMatch.
    MatchCase(#"{"genre": {"$elemMatch": {"$eq": "Horror"}}}"#, #"{"genre": ["Comedy", "Horror"]}"#, true),
    MatchCase(#"{"genre": {"$elemMatch": {"$eq": "Horror"}}}"#, #"{"genre": "Horror"}"#, false),
    MatchCase(#"{"genre": {"$elemMatch": {"$eq": "Horror"}}}"#, #"{"genre": []}"#, false),
    MatchCase(#"{"items": {"$elemMatch": {"n": {"$gt": 2}, "k": "a"}}}"#, #"{"items": [{"n": 3, "k": "b"}, {"n": 1, "k": "a"}]}"#, false),
    MatchCase(#"{"items": {"$elemMatch": {"n": {"$gt": 2}, "k": "a"}}}"#, #"{"items": [{"n": 3, "k": "a"}]}"#, true),
    MatchCase(#"{"items": {"$elemMatch": {"$gte": 80, "$lt": 85}}}"#, #"{"items": [79, 84]}"#, true),
    MatchCase(#"{"tags": {"$elemMatch": {"$not": {"$eq": "x"}}}}"#, #"{"tags": ["x"]}"#, false),
    MatchCase(#"{"tags": {"$elemMatch": {"$not": {"$eq": "x"}}}}"#, #"{"tags": ["x", "y"]}"#, true),
    MatchCase(#"{"items": {"$elemMatch": {"$not": {"n": 1}}}}"#, #"{"items": [{"k": 1}]}"#, true),
    MatchCase(#"{"genre": {"$allMatch": {"$eq": "Horror"}}}"#, #"{"genre": ["Horror", "Horror"]}"#, true),
    MatchCase(#"{"genre": {"$allMatch": {"$eq": "Horror"}}}"#, #"{"genre": ["Horror", "Comedy"]}"#, false),
    MatchCase(#"{"genre": {"$allMatch": {"$eq": "Horror"}}}"#, #"{"genre": []}"#, false),
    MatchCase(#"{"cameras": {"$keyMapMatch": {"$eq": "secondary"}}}"#, #"{"cameras": {"primary": 1, "secondary": 2}}"#, true),
    MatchCase(#"{"cameras": {"$keyMapMatch": {"$eq": "secondary"}}}"#, #"{"cameras": {"primary": "secondary"}}"#, false),
    MatchCase(#"{"cameras": {"$keyMapMatch": {"$eq": "secondary"}}}"#, #"{"cameras": ["secondary"]}"#, false),
    // $size, $type, $mod, $regex, $beginsWith.
    MatchCase(#"{"a": {"$size": 2}}"#, #"{"a": [1, [2, 3]]}"#, true),
    MatchCase(#"{"a": {"$size": 2}}"#, #"{"a": "ab"}"#, false),
    MatchCase(#"{"a": {"$size": 0}}"#, #"{"a": []}"#, true),
    MatchCase(#"{"a": {"$type": "number"}}"#, #"{"a": 1.5}"#, true),
    MatchCase(#"{"a": {"$type": "boolean"}}"#, #"{"a": false}"#, true),
    MatchCase(#"{"a": {"$type": "array"}}"#, #"{"a": {}}"#, false),
    MatchCase(#"{"a": {"$type": "object"}}"#, #"{"a": {}}"#, true),
    MatchCase(#"{"a": {"$type": "null"}}"#, #"{"a": null}"#, true),
    MatchCase(#"{"a": {"$type": "string"}}"#, #"{"a": "1"}"#, true),
    MatchCase(#"{"a": {"$mod": [3, 1]}}"#, #"{"a": 7}"#, true),
    MatchCase(#"{"a": {"$mod": [3, 1]}}"#, #"{"a": -7}"#, false),
    MatchCase(#"{"a": {"$mod": [3, -1]}}"#, #"{"a": -7}"#, true),
    MatchCase(#"{"a": {"$mod": [3, 1]}}"#, #"{"a": 7.5}"#, false),
    MatchCase(#"{"a": {"$mod": [3, 1]}}"#, #"{"a": "7"}"#, false),
    MatchCase(#"{"a": {"$mod": [-1, 0]}}"#, #"{"a": -9223372036854775808}"#, true),
    MatchCase(#"{"a": {"$regex": "^A"}}"#, #"{"a": "Alien"}"#, true),
    MatchCase(#"{"a": {"$regex": "^A"}}"#, #"{"a": "alien"}"#, false),
    MatchCase(#"{"a": {"$regex": "(?i)^A"}}"#, #"{"a": "alien"}"#, true),
    MatchCase(#"{"a": {"$regex": "li"}}"#, #"{"a": "Alien"}"#, true),
    MatchCase(#"{"a": {"$regex": "1"}}"#, #"{"a": 1}"#, false),
    MatchCase(#"{"a": {"$regex": "(?<=A)l"}}"#, #"{"a": "Alien"}"#, true),
    MatchCase(#"{"a": {"$regex": "^\\d+$"}}"#, #"{"a": "2024"}"#, true),
    MatchCase(#"{"a": {"$beginsWith": "Al"}}"#, #"{"a": "Alien"}"#, true),
    MatchCase(#"{"a": {"$beginsWith": "al"}}"#, #"{"a": "Alien"}"#, false),
    MatchCase(#"{"a": {"$beginsWith": "A"}}"#, #"{"a": ["A"]}"#, false),
]

@Suite struct MangoSelectorTests {
    @Test(arguments: conformanceTable)
    func aSelectorMatchesAsCouchDBDoes(_ row: MatchCase) throws {
        let parsed = try selector(row.selector)
        #expect(parsed.matches(json(row.document)) == row.matches)
    }

    @Test func aSelectorThatIsNotAnObjectIsRefused() {
        #expect(throws: MangoError.self) { try MangoSelector(parsing: .array([])) }
        #expect(throws: MangoError.self) { try MangoSelector(parsing: "a") }
    }

    /// Selectors CouchDB refuses, with its error name and reason.
    static let refusals: [(String, String, String)] = [
        (#"{"a": {"$foo": 1}}"#, "invalid_operator", "Invalid operator: $foo"),
        (#"{"$foo": [1]}"#, "invalid_operator", "Invalid operator: $foo"),
        (#"{"a": {"$in": 5}}"#, "bad_arg", "Bad argument for operator $in: 5"),
        (#"{"a": {"$nin": {"x": 1}}}"#, "bad_arg", #"Bad argument for operator $nin: {"x":1}"#),
        (#"{"a": {"$all": "x"}}"#, "bad_arg", #"Bad argument for operator $all: "x""#),
        (#"{"$and": {"a": 1}}"#, "bad_arg", #"Bad argument for operator $and: {"a":1}"#),
        (#"{"$or": 1}"#, "bad_arg", "Bad argument for operator $or: 1"),
        (#"{"$nor": null}"#, "bad_arg", "Bad argument for operator $nor: null"),
        (#"{"$not": [{"a": 1}]}"#, "bad_arg", #"Bad argument for operator $not: [{"a":1}]"#),
        (#"{"a": {"$exists": "yes"}}"#, "bad_arg", #"Bad argument for operator $exists: "yes""#),
        (#"{"a": {"$type": "int"}}"#, "bad_arg", #"Bad argument for operator $type: "int""#),
        (#"{"a": {"$type": 1}}"#, "bad_arg", "Bad argument for operator $type: 1"),
        (#"{"a": {"$size": -1}}"#, "bad_arg", "Bad argument for operator $size: -1"),
        (#"{"a": {"$size": 1.5}}"#, "bad_arg", "Bad argument for operator $size: 1.5"),
        (#"{"a": {"$mod": [0, 1]}}"#, "bad_arg", "Bad argument for operator $mod: [0,1]"),
        (#"{"a": {"$mod": [2]}}"#, "bad_arg", "Bad argument for operator $mod: [2]"),
        (#"{"a": {"$mod": [2.5, 1]}}"#, "bad_arg", "Bad argument for operator $mod: [2.5,1]"),
        (#"{"a": {"$regex": "("}}"#, "bad_arg", #"Bad argument for operator $regex: "(""#),
        (#"{"a": {"$regex": 5}}"#, "invalid_operator", "Invalid operator: $regex"),
        (#"{"a": {"$regex": "(?P<n>x)"}}"#, "bad_arg", #"Bad argument for operator $regex: "(?P<n>x)""#),
        (#"{"a": {"$elemMatch": 5}}"#, "bad_arg", "Bad argument for operator $elemMatch: 5"),
        (#"{"a": {"$allMatch": []}}"#, "bad_arg", "Bad argument for operator $allMatch: []"),
        (#"{"a": {"$keyMapMatch": "k"}}"#, "bad_arg", #"Bad argument for operator $keyMapMatch: "k""#),
        (#"{"a": {"$beginsWith": 1}}"#, "bad_arg", "Bad argument for operator $beginsWith: 1"),
        (#"{"$gt": 1}"#, "invalid_selector", "One or more conditions is missing a field name."),
        (#"{"$and": [1]}"#, "invalid_selector", "One or more conditions is missing a field name."),
        (#"{"$elemMatch": {"a": 1}}"#, "invalid_selector", "One or more conditions is missing a field name."),
        (#"{"$not": {}}"#, "invalid_selector", "One or more conditions is missing a field name."),
        (#"{"a..b": 1}"#, "invalid_field_name", "Invalid field name: a..b"),
        (#"{"a.": 1}"#, "invalid_field_name", "Invalid field name: a."),
        (#"{"": 1}"#, "invalid_field_name", "Invalid field name: "),
        (#"{"a": {"$where": "x"}}"#, "not_supported", "Unsupported operator: $where"),
        (#"{"$text": "x"}"#, "not_supported", "Unsupported operator: $text"),
        (#"{"loc": {"$near": [1, 2]}}"#, "not_supported", "Unsupported operator: $near"),
        ("[]", "invalid_selector", "Selector must be a JSON object, not: []"),
    ]

    @Test func malformedSelectorsAreRefusedWithCouchDBsErrorAndReason() {
        for (text, code, reason) in Self.refusals {
            do {
                _ = try selector(text)
                Issue.record("\(text) was accepted")
            } catch {
                #expect(error.code == code, "\(text)")
                #expect(error.description == reason, "\(text)")
                #expect(error.failure.httpStatus == 400)
                #expect(!error.isTransient)
            }
        }
    }

    @Test func aSelectorNestedTooDeeplyIsRefused() {
        var deep: JSON = 1
        for _ in 0..<150 { deep = ["a": deep] }
        #expect(throws: MangoError.tooDeep(limit: 100)) { try MangoSelector(parsing: deep) }
        var deepOr: JSON = ["a": 1]
        for _ in 0..<120 { deepOr = ["$or": [deepOr]] }
        #expect(throws: MangoError.tooDeep(limit: 100)) { try MangoSelector(parsing: deepOr) }
        var fine: JSON = 1
        for _ in 0..<40 { fine = ["a": fine] }
        #expect(throws: Never.self) { try MangoSelector(parsing: fine) }
    }

    @Test func nestedObjectsAndDottedNamesNormaliseToTheSamePath() throws {
        let nested = try selector(#"{"imdb": {"rating": {"$gt": 8}}}"#)
        let dotted = try selector(#"{"imdb.rating": {"$gt": 8}}"#)
        #expect(nested == dotted)
        #expect(dotted.root == .field(FieldPath(components: ["imdb", "rating"]), .gt(8)))
        let escaped = try selector(#"{"a\\.b": {"c": 1}}"#)
        #expect(escaped.root == .field(FieldPath(components: ["a.b", "c"]), .eq(1)))
        #expect(FieldPath(components: ["a.b", "c"]).description == #"a\.b.c"#)
        let odd = FieldPath(components: [#"x\y"#, "p.q", "0"])
        #expect(try FieldPath(parsing: odd.description) == odd)
    }

    @Test func pathsReachIntoArraysOnlyThroughDecimalIndexesInRange() throws {
        let document = json(#"{"tags": ["x", "y"], "n": 5, "o": {"0": "zero"}}"#)
        func lookup(_ name: String) throws -> FieldPath.Lookup { try FieldPath(parsing: name).lookup(in: document) }
        #expect(try lookup("tags.1") == .found("y"))
        #expect(try lookup("tags.+1") == .found("y"))
        #expect(try lookup("tags.-0") == .found("x"))
        #expect(try lookup("tags.01") == .found("y"))
        #expect(try lookup("tags.2") == .badPath)
        #expect(try lookup("tags.-1") == .badPath)
        #expect(try lookup("tags.++1") == .badPath)
        #expect(try lookup("tags.x") == .badPath)
        #expect(try lookup("tags.99999999999999999999999") == .badPath)
        #expect(try lookup("n.a") == .badPath)
        #expect(try lookup("o.0") == .found("zero"))
        #expect(try lookup("o.1") == .missing)
        #expect(try lookup("missing.a") == .missing)
    }

    @Test func implicitAndAndEqualityBecomeExplicit() throws {
        let parsed = try selector(#"{"b": 2, "a": {"$gt": 1, "$lt": 5}}"#)
        #expect(parsed.root == .and([
            .and([.field(FieldPath(components: ["a"]), .gt(1)), .field(FieldPath(components: ["a"]), .lt(5))]),
            .field(FieldPath(components: ["b"]), .eq(2)),
        ]))
    }

    @Test func negationsArePushedDownToTheConditions() throws {
        let a = FieldPath(components: ["a"])
        let b = FieldPath(components: ["b"])
        #expect(try selector(#"{"$not": {"a": {"$gt": 1}}}"#).root == .field(a, .lte(1)))
        #expect(try selector(#"{"$nor": [{"a": 1}]}"#).root == .and([.field(a, .ne(1))]))
        #expect(try selector(#"{"$not": {"$or": [{"a": 1}, {"b": {"$in": [1]}}]}}"#).root
            == .and([.field(a, .ne(1)), .field(b, .nin([1]))]))
        #expect(try selector(#"{"a": {"$not": {"$exists": true}}}"#).root == .field(a, .exists(false)))
        #expect(try selector(#"{"a": {"$not": {"$size": 1}}}"#).root == .field(a, .not(.size(1))))
        #expect(try selector(#"{"$not": {"$not": {"a": {"$lt": 3}}}}"#).root == .field(a, .lt(3)))
        // Inside an element sub-selector the negation stays as written.
        #expect(try selector(#"{"a": {"$elemMatch": {"$not": {"b": 1}}}}"#).root
            == .field(a, .elemMatch(.not(.field(b, .eq(1))))))
    }
}
