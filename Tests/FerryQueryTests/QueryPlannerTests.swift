import FerryCore
import FerryQuery
import Testing

/// Index choice, errors and warnings as CouchDB 3.4 plans (cases checked on the reference
/// server), and the key ranges of the plans.
@Suite struct QueryPlannerTests {
    static func query(_ text: String) throws -> MangoQuery { try MangoQuery(parsing: JSON.parse(text)) }

    static func index(_ ddoc: String, _ name: String, _ fields: [String], partial: String? = nil) throws -> MangoIndex {
        var body: [String: JSON] = ["fields": .array(fields.map { .string($0) })]
        if let partial { body["partial_filter_selector"] = try JSON.parse(partial) }
        return try MangoIndexRequest(parsing: ["index": .object(body), "ddoc": .string(ddoc), "name": .string(name)]).index
    }

    static func plan(_ q: String, _ ready: [MangoIndex], unavailable: [MangoIndex] = []) throws -> QueryPlan {
        try QueryPlanner.plan(query(q), ready: ready, unavailable: unavailable, explaining: true)
    }

    static func thrown(_ q: String, _ ready: [MangoIndex]) throws -> MangoError? {
        let parsed = try query(q)
        do {
            _ = try QueryPlanner.plan(parsed, ready: ready)
            return nil
        } catch {
            return error
        }
    }

    // MARK: - Choice

    @Test func withoutIndexesTheQueryScansAllDocsWithCouchDBsWarning() throws {
        let plan = try Self.plan(#"{"selector":{"a":1}}"#, [])
        #expect(plan.source == .allDocs)
        #expect(plan.ranges == [.all])
        #expect(plan.warnings == ["No matching index found, create an index to optimize query time."])
    }

    @Test func anIndexOnASelectorFieldIsChosenAndNarrowsToItsValue() throws {
        let a = try Self.index("d", "a", ["a"])
        let plan = try Self.plan(#"{"selector":{"a":1}}"#, [a])
        #expect(plan.source == .index(a))
        #expect(plan.warnings.isEmpty)
        let key = CouchCollation.sortKey(1)
        #expect(plan.ranges == [KeyRange(lower: key, upper: key)])
    }

    @Test func anIndexIsUsableOnlyWhenTheSelectorRequiresEachOfItsFields() throws {
        let ab = try Self.index("d", "ab", ["a", "b"])
        #expect(try Self.plan(#"{"selector":{"a":1}}"#, [ab]).source == .allDocs)
        #expect(try Self.plan(#"{"selector":{"a":1,"b":{"$exists":false}}}"#, [ab]).source == .allDocs)
        #expect(try Self.plan(#"{"selector":{"a":1,"b":{"$ne":2}}}"#, [ab]).source == .index(ab))
        // Every $or branch must need the field; `$or: []` needs nothing.
        #expect(try Self.plan(#"{"selector":{"a":1,"$or":[{"b":1},{"b":2}]}}"#, [ab]).source == .index(ab))
        #expect(try Self.plan(#"{"selector":{"a":1,"$or":[{"b":1},{"c":2}]}}"#, [ab]).source == .allDocs)
        #expect(try Self.plan(#"{"selector":{"a":1,"b":{"$or":[]}}}"#, [ab]).source == .allDocs)
    }

    @Test func idAndRevNeedNoCondition() throws {
        let idA = try Self.index("d", "ida", ["_id", "a"])
        #expect(try Self.plan(#"{"selector":{"a":{"$gt":1}}}"#, [idA]).source == .index(idA))
    }

    @Test func theIndexMatchingMoreIndexableFieldsWinsThenFewerFieldsThenTheName() throws {
        let a = try Self.index("z", "a", ["a"])
        let ab = try Self.index("y", "ab", ["a", "b"])
        let a2 = try Self.index("x", "a2", ["a"])
        #expect(try Self.plan(#"{"selector":{"a":1,"b":{"$gt":2}}}"#, [a, ab]).source == .index(ab))
        #expect(try Self.plan(#"{"selector":{"a":1,"b":{"$ne":2}}}"#, [a, ab]).source == .index(a))
        #expect(try Self.plan(#"{"selector":{"a":1}}"#, [a, a2]).source == .index(a2))
    }

    @Test func aSortNeedsAnIndexInItsOrder() throws {
        let ab = try Self.index("d", "ab", ["a", "b"])
        let error = try Self.thrown(#"{"selector":{"a":{"$gt":0}},"sort":["b"]}"#, [ab])
        #expect(error?.code == "no_usable_index")
        #expect(error?.description == "No index exists for this sort, try indexing by the sort fields.")
        // A leading column held by $eq does not disturb the order.
        let plan = try Self.plan(#"{"selector":{"a":1,"b":{"$gt":0}},"sort":[{"b":"desc"}]}"#, [ab])
        #expect(plan.source == .index(ab))
        #expect(plan.descending)
        // Sort fields need no condition: documents without them are not answers, as in CouchDB.
        #expect(try Self.plan(#"{"selector":{},"sort":["a","b"]}"#, [ab]).source == .index(ab))
        #expect(try Self.thrown(#"{"selector":{},"sort":["a"]}"#, [])?.code == "no_usable_index")
    }

    @Test func sortingByIDUsesAllDocsWhenTheSelectorNarrowsTheID() throws {
        let plan = try Self.plan(#"{"selector":{"_id":{"$gt":"b"}},"sort":[{"_id":"desc"}]}"#, [])
        #expect(plan.source == .allDocs)
        #expect(plan.descending)
        #expect(plan.ranges == [KeyRange(lower: Array("b".utf8), lowerInclusive: false)])
        #expect(try Self.thrown(#"{"selector":{"a":1},"sort":["_id"]}"#, [])?.code == "no_usable_index")
    }

    @Test func useIndexIsHonouredWhenUsableAndWarnedAboutOtherwise() throws {
        let a = try Self.index("x", "a", ["a"])
        let a2 = try Self.index("y", "a2", ["a"])
        let b = try Self.index("z", "b", ["b"])
        #expect(try Self.plan(#"{"selector":{"a":1},"use_index":"y"}"#, [a, a2]).source == .index(a2))
        #expect(try Self.plan(#"{"selector":{"a":1},"use_index":["_design/y","a2"]}"#, [a, a2]).source == .index(a2))
        #expect(try Self.plan(#"{"selector":{"a":1},"use_index":"y/a2"}"#, [a, a2]).source == .index(a2))
        let fallback = try Self.plan(#"{"selector":{"a":1},"use_index":"z"}"#, [a, b])
        #expect(fallback.source == .index(a))
        #expect(fallback.warnings == ["_design/z was not used because it does not contain a valid index for this query."])
        let named = try Self.plan(#"{"selector":{"a":1},"use_index":["z","b"]}"#, [a, b])
        #expect(named.warnings == ["_design/z, b was not used because it is not a valid index for this query."])
        let refused = try Self.thrown(#"{"selector":{"a":1},"use_index":["z","b"],"allow_fallback":false}"#, [a, b])
        #expect(refused?.code == "invalid_index")
        #expect(refused?.description == "_design/z, b specified by `use_index` could not be found or it is not suitable.")
        let unnamed = try Self.thrown(#"{"selector":{"a":1},"allow_fallback":false}"#, [])
        #expect(unnamed?.description == "You must specify an index with the `use_index` parameter.")
    }

    @Test func anIndexStillBeingBuiltIsNeverReadAndUseIndexSaysSo() throws {
        let a = try Self.index("x", "a", ["a"])
        let plan = try Self.plan(#"{"selector":{"a":1},"use_index":"x"}"#, [], unavailable: [a])
        #expect(plan.source == .allDocs)
        #expect(plan.warnings.first == "_design/x is still being built, so it was not used for this query.")
        #expect(plan.warnings.last == QueryPlanner.noIndexWarning)
    }

    @Test func aPartialIndexIsUsedOnlyWhenNamedAndImpliedBySelector() throws {
        let p = try Self.index("p", "p", ["a"], partial: #"{"type":"user","age":{"$gt":18}}"#)
        // Not named: never used, as in CouchDB.
        #expect(try Self.plan(#"{"selector":{"a":1,"type":"user","age":{"$gt":18}}}"#, [p]).source == .allDocs)
        // Named and implied.
        let used = try Self.plan(#"{"selector":{"a":1,"type":"user","age":{"$gt":18}},"use_index":"p"}"#, [p])
        #expect(used.source == .index(p))
        #expect(used.warnings.isEmpty)
        // Named but the selector matches documents the index leaves out: CouchDB would answer
        // from the index alone; Ferry scans and says why.
        let refused = try Self.plan(#"{"selector":{"a":1,"type":"user"},"use_index":"p"}"#, [p])
        #expect(refused.source == .allDocs)
        #expect(refused.warnings.first?.contains("partial_filter_selector") == true)
    }

    // MARK: - Ranges

    @Test func aBareEmptyAndOrOrAnswersNothingAsInCouchDB() throws {
        #expect(try Self.plan(#"{"selector":{"$or":[]}}"#, []).ranges.isEmpty)
        #expect(try Self.plan(#"{"selector":{"$and":[]}}"#, []).ranges.isEmpty)
        #expect(try Self.plan(#"{"selector":{"_id":{"$gt":null},"$or":[]}}"#, []).ranges == [.all])
    }

    @Test func equalitiesOnAPrefixThenOneRange() throws {
        let ab = try Self.index("d", "ab", ["a", "b"])
        let plan = try Self.plan(#"{"selector":{"a":"x","b":{"$gte":2,"$lt":5}}}"#, [ab])
        let x = CouchCollation.sortKey("x")
        #expect(
            plan.ranges == [
                KeyRange(
                    lower: x + CouchCollation.sortKey(2), lowerInclusive: true, upper: x + CouchCollation.sortKey(5),
                    upperInclusive: false)
            ])
    }

    @Test func contradictoryConditionsLeaveNoRange() throws {
        let a = try Self.index("d", "a", ["a"])
        #expect(try Self.plan(#"{"selector":{"a":{"$gt":5,"$lt":3}}}"#, [a]).ranges.isEmpty)
        #expect(try Self.plan(#"{"selector":{"_id":{"$in":[]}}}"#, []).ranges.isEmpty)
    }

    @Test func inBecomesItsValuesAndTheArraysAndOrOfEqualitiesItsValues() throws {
        let a = try Self.index("d", "a", ["a"])
        let plan = try Self.plan(#"{"selector":{"a":{"$in":[3,1]}}}"#, [a])
        #expect(plan.ranges.count == 3)
        #expect(plan.ranges[0] == KeyRange(lower: CouchCollation.sortKey(1), upper: CouchCollation.sortKey(1)))
        #expect(plan.ranges[2] == KeyRange(lower: [6], lowerInclusive: true, upper: [7], upperInclusive: false))
        let or = try Self.plan(#"{"selector":{"$or":[{"a":3},{"a":1}]}}"#, [a])
        #expect(or.ranges.count == 2)
        let down = try Self.plan(#"{"selector":{"$or":[{"a":3},{"a":1}]},"sort":[{"a":"desc"}]}"#, [a])
        #expect(down.ranges == or.ranges.reversed())
    }

    @Test func idRangesInAllDocsAreValidTextForTheStore() throws {
        let top = try QueryPlanner.plan(MangoQuery(parsing: ["selector": ["_id": ["$beginsWith": "ab\u{10FFFF}"]]]), ready: [])
        let plan = top
        #expect(plan.ranges == [KeyRange(lower: Array("ab\u{10FFFF}".utf8), upper: Array("ac".utf8), upperInclusive: false)])
        let simple = try Self.plan(#"{"selector":{"_id":{"$beginsWith":"user:"}}}"#, [])
        #expect(simple.ranges == [KeyRange(lower: Array("user:".utf8), upper: Array("user;".utf8), upperInclusive: false)])
    }

    // MARK: - Explain

    @Test func theExplanationHasCouchDBsMembers() throws {
        let a = try Self.index("d", "a", ["a"])
        let b = try Self.index("e", "b", ["b"])
        let plan = try Self.plan(#"{"selector":{"a":{"$gt":5}}}"#, [a, b])
        let e = plan.explanation
        #expect(e["index"] == a.json)
        #expect(e["covering"] == false)
        #expect(
            e["mrargs"]
                == (try JSON.parse(
                    #"{"include_docs":true,"view_type":"map","reduce":false,"partition":null,"start_key":[5],"end_key":["<MAX>"],"direction":"fwd","stable":false,"update":true,"conflicts":"undefined"}"#
                )))
        #expect(
            e["selector_hints"] == (try JSON.parse(#"[{"type":"json","indexable_fields":["a"],"unindexable_fields":[]}]"#)))
        #expect(
            e["index_candidates"]
                == (try JSON.parse(
                    #"""
                    [{"index":{"ddoc":"_design/e","name":"b","type":"json","partitioned":false,"def":{"fields":[{"b":"asc"}]}},
                      "analysis":{"usable":false,"reasons":[{"name":"field_mismatch"}],"ranking":2,"covering":false}},
                     {"index":{"ddoc":null,"name":"_all_docs","type":"special","def":{"fields":[{"_id":"asc"}]}},
                      "analysis":{"usable":true,"reasons":[{"name":"unfavored_type"}],"ranking":1,"covering":null}}]
                    """#)))
    }

    @Test func explainedKeysFollowCouchDB() throws {
        let a = try Self.index("d", "a", ["a"])
        let eq = try Self.plan(#"{"selector":{"a":1}}"#, [a]).explanation["mrargs"]?.objectValue
        #expect(eq?["start_key"] == [1])
        #expect(eq?["end_key"] == [1, "<MAX>"])
        let desc = try Self.plan(#"{"selector":{"a":{"$gt":5},"b":{"$lt":3}},"sort":[{"a":"desc"}]}"#, [a]).explanation["mrargs"]?.objectValue
        #expect(desc?["start_key"] == ["<MAX>"])
        #expect(desc?["end_key"] == [5])
        #expect(desc?["direction"] == "rev")
        let all = try Self.plan(#"{"selector":{"x":1}}"#, []).explanation["mrargs"]?.objectValue
        #expect(all?["start_key"] == .null)
        #expect(all?["end_key"] == "<MAX>")
        let id = try Self.plan(#"{"selector":{"_id":{"$lt":"a"}},"sort":[{"_id":"desc"}]}"#, []).explanation["mrargs"]?.objectValue
        #expect(id?["start_key"] == "a")
        #expect(id?["end_key"] == "")
    }
}
