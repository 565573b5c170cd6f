import FerryCore
import FerryQuery
import Testing

private func json(_ text: String) -> JSON { try! JSON.parse(text) }

@Suite struct MangoQueryTests {
    @Test func aBodyWithOnlyASelectorTakesCouchDBsDefaults() throws {
        let query = try MangoQuery(parsing: json(#"{"selector": {"type": "order"}}"#))
        #expect(query.limit == 25)
        #expect(query.skip == 0)
        #expect(query.fields == nil)
        #expect(query.sort.isEmpty)
        #expect(query.bookmark == nil)
        #expect(query.useIndex.isEmpty)
        #expect(query.r == 1)
        #expect(query.update && !query.stable && !query.conflicts && !query.executionStats)
        #expect(query.selector.matches(json(#"{"type": "order"}"#)))
    }

    @Test func everyOptionIsRead() throws {
        let query = try MangoQuery(parsing: json(#"""
            {"selector": {"year": {"$gt": 2010}}, "fields": ["_id", "title", "imdb.rating"],
             "sort": [{"year": "desc"}, {"title": "desc"}], "limit": 2, "skip": 1,
             "bookmark": "g1AAAA", "use_index": ["_design/idx", "by-year"], "execution_stats": true,
             "conflicts": true, "r": 2, "update": false, "stable": true, "partition": ""}
            """#))
        #expect(query.fields == [
            FieldPath(components: ["_id"]), FieldPath(components: ["title"]),
            FieldPath(components: ["imdb", "rating"]),
        ])
        #expect(query.sort == [
            .init(path: FieldPath(components: ["year"]), descending: true),
            .init(path: FieldPath(components: ["title"]), descending: true),
        ])
        #expect(query.limit == 2 && query.skip == 1 && query.r == 2)
        #expect(query.bookmark == "g1AAAA")
        #expect(query.useIndex == ["_design/idx", "by-year"])
        #expect(query.executionStats && query.conflicts && !query.update && query.stable)
        #expect(query.partition == nil)
    }

    @Test func sortAcceptsBareFieldNamesAscending() throws {
        let query = try MangoQuery(parsing: json(#"{"selector": {}, "sort": ["a", {"b": "asc"}], "use_index": "idx"}"#))
        #expect(query.sort.map(\.descending) == [false, false])
        #expect(query.useIndex == ["idx"])
    }

    static let refusals: [(String, String, String)] = [
        (#"{}"#, "missing_required_key", "Missing required key: selector"),
        (#"[]"#, "bad_request", "Request body must be a JSON object"),
        (#"{"selector": []}"#, "invalid_selector_json", "Selector must be a JSON object, not: []"),
        (#"{"selector": {}, "limits": 1}"#, "invalid_key", "Invalid key limits for this request."),
        (#"{"selector": {}, "limit": -1}"#, "invalid_non_neg_integer", "-1 is not an integer greater than or equal to zero"),
        (#"{"selector": {}, "limit": "5"}"#, "invalid_non_neg_integer", #""5" is not an integer greater than or equal to zero"#),
        (#"{"selector": {}, "skip": 1.5}"#, "invalid_non_neg_integer", "1.5 is not an integer greater than or equal to zero"),
        (#"{"selector": {}, "r": 0}"#, "invalid_pos_integer", "0 is not an integer greater than zero"),
        (#"{"selector": {}, "conflicts": "yes"}"#, "invalid_boolean", #"Invalid boolean value: "yes""#),
        (#"{"selector": {}, "fields": "a"}"#, "invalid_fields", #"Fields must be an array of strings, not: "a""#),
        (#"{"selector": {}, "fields": ["a", 1]}"#, "invalid_field", "Invalid JSON for field spec: 1"),
        (#"{"selector": {}, "fields": ["a..b"]}"#, "invalid_field_name", "Invalid field name: a..b"),
        (#"{"selector": {}, "sort": {"a": "asc"}}"#, "invalid_sort_json", #"Sort must be an array of sort specs, not: {"a":"asc"}"#),
        (#"{"selector": {}, "sort": [{"a": "up"}]}"#, "invalid_sort_field", #"Invalid sort field: {[{<<"a">>,<<"up">>}]}"#),
        (#"{"selector": {}, "sort": [1]}"#, "invalid_sort_field", "Invalid sort field: 1"),
        (#"{"selector": {}, "sort": [{"a": "asc", "b": "asc"}]}"#, "invalid_sort_field", #"Invalid sort field: {"a":"asc","b":"asc"}"#),
        (#"{"selector": {}, "sort": ["a", {"b": "desc"}]}"#, "unsupported_mixed_sort", "Sorts currently only support a single direction for all fields."),
        (#"{"selector": {}, "use_index": 5}"#, "invalid_index_name", "Invalid index name: 5"),
        (#"{"selector": {}, "use_index": ["a", "b", "c"]}"#, "invalid_index_name", #"Invalid index name: ["a","b","c"]"#),
        (#"{"selector": {}, "bookmark": 5}"#, "invalid_bookmark", "Invalid bookmark value: 5"),
        (#"{"selector": {"a": {"$in": 1}}}"#, "bad_arg", "Bad argument for operator $in: 1"),
    ]

    @Test func badBodiesAreRefusedWithCouchDBsErrorAndReason() {
        for (text, code, reason) in Self.refusals {
            do {
                _ = try MangoQuery(parsing: json(text))
                Issue.record("\(text) was accepted")
            } catch {
                #expect(error.code == code, "\(text)")
                #expect(error.description == reason, "\(text)")
            }
        }
    }

    @Test func projectionKeepsOnlyTheRequestedFieldsAtTheirPaths() throws {
        let query = try MangoQuery(parsing: json(#"{"selector": {}, "fields": ["_id", "imdb.rating", "missing", "tags.1"]}"#))
        let document = json(#"{"_id": "m1", "_rev": "1-a", "title": "T", "imdb": {"rating": 8, "votes": 3}, "tags": ["x", "y"]}"#)
        #expect(query.project(document) == json(#"{"_id": "m1", "imdb": {"rating": 8}, "tags": {"1": "y"}}"#))
    }

    @Test func withoutFieldsTheWholeDocumentIsReturned() throws {
        let query = try MangoQuery(parsing: json(#"{"selector": {}, "fields": []}"#))
        let document = json(#"{"_id": "m1", "a": [1]}"#)
        #expect(query.project(document) == document)
    }

    @Test func documentsSortByTheSortFieldsInCollationOrder() throws {
        let query = try MangoQuery(parsing: json(#"{"selector": {}, "sort": [{"year": "desc"}, {"title": "desc"}]}"#))
        let docs = [
            json(#"{"year": 2001, "title": "b"}"#), json(#"{"year": 2001, "title": "B"}"#),
            json(#"{"year": 1999, "title": "z"}"#), json(#"{"title": "none"}"#), json(#"{"year": "2000"}"#),
        ]
        let sorted = docs.sorted { query.compareForSort($0, $1) == .ascending }
        #expect(sorted == [docs[4], docs[1], docs[0], docs[2], docs[3]])
    }
}
