import FerryCore
import FerryQuery
import Testing

/// `_explain` members for the same indexes and queries as on Apache CouchDB 3.4.3, whose
/// answers (`index`, `index_candidates`, `selector_hints`, `mrargs`, `covering`) are recorded here.
@Suite struct ExplainConformanceTests {
    static let ready: [MangoIndex] = [
        #"{"index":{"fields":["a"]},"ddoc":"d","name":"a"}"#,
        #"{"index":{"fields":["b"]},"ddoc":"e","name":"b"}"#,
        #"{"index":{"fields":["a","b"]},"ddoc":"f","name":"ab"}"#,
        #"{"index":{"fields":["a"],"partial_filter_selector":{"t":"x"}},"ddoc":"g","name":"pa"}"#,
    ].map { try! MangoIndexRequest(parsing: JSON.parse($0)).index }

    @Test(arguments: [
        (
            #"{"selector":{"a":1}}"#,
            #"{"covering":false,"index":{"ddoc":"_design/d","def":{"fields":[{"a":"asc"}]},"name":"a","partitioned":false,"type":"json"},"index_candidates":[{"analysis":{"covering":false,"ranking":3,"reasons":[{"name":"is_partial"}],"usable":false},"index":{"ddoc":"_design/g","def":{"fields":[{"a":"asc"}],"partial_filter_selector":{"t":{"$eq":"x"}}},"name":"pa","partitioned":false,"type":"json"}},{"analysis":{"covering":false,"ranking":2,"reasons":[{"name":"field_mismatch"}],"usable":false},"index":{"ddoc":"_design/f","def":{"fields":[{"a":"asc"},{"b":"asc"}]},"name":"ab","partitioned":false,"type":"json"}},{"analysis":{"covering":false,"ranking":2,"reasons":[{"name":"field_mismatch"}],"usable":false},"index":{"ddoc":"_design/e","def":{"fields":[{"b":"asc"}]},"name":"b","partitioned":false,"type":"json"}},{"analysis":{"covering":null,"ranking":1,"reasons":[{"name":"unfavored_type"}],"usable":true},"index":{"ddoc":null,"def":{"fields":[{"_id":"asc"}]},"name":"_all_docs","type":"special"}}],"mrargs":{"conflicts":"undefined","direction":"fwd","end_key":[1,"<MAX>"],"include_docs":true,"partition":null,"reduce":false,"stable":false,"start_key":[1],"update":true,"view_type":"map"},"selector_hints":[{"indexable_fields":["a"],"type":"json","unindexable_fields":[]}]}"#
        ),
        (
            #"{"selector":{"a":1,"b":{"$gt":2}},"sort":["a"]}"#,
            #"{"covering":false,"index":{"ddoc":"_design/f","def":{"fields":[{"a":"asc"},{"b":"asc"}]},"name":"ab","partitioned":false,"type":"json"},"index_candidates":[{"analysis":{"covering":false,"ranking":3,"reasons":[{"name":"is_partial"}],"usable":false},"index":{"ddoc":"_design/g","def":{"fields":[{"a":"asc"}],"partial_filter_selector":{"t":{"$eq":"x"}}},"name":"pa","partitioned":false,"type":"json"}},{"analysis":{"covering":false,"ranking":2,"reasons":[{"name":"sort_order_mismatch"}],"usable":false},"index":{"ddoc":"_design/e","def":{"fields":[{"b":"asc"}]},"name":"b","partitioned":false,"type":"json"}},{"analysis":{"covering":false,"ranking":1,"reasons":[{"name":"less_overlap"}],"usable":true},"index":{"ddoc":"_design/d","def":{"fields":[{"a":"asc"}]},"name":"a","partitioned":false,"type":"json"}},{"analysis":{"covering":null,"ranking":2,"reasons":[{"name":"field_mismatch"}],"usable":false},"index":{"ddoc":null,"def":{"fields":[{"_id":"asc"}]},"name":"_all_docs","type":"special"}}],"mrargs":{"conflicts":"undefined","direction":"fwd","end_key":[1,"<MAX>"],"include_docs":true,"partition":null,"reduce":false,"stable":false,"start_key":[1,2],"update":true,"view_type":"map"},"selector_hints":[{"indexable_fields":["b","a"],"type":"json","unindexable_fields":[]}]}"#
        ),
        (
            #"{"selector":{"a":1,"t":"x"},"use_index":"g","fields":["a"]}"#,
            #"{"covering":false,"index":{"ddoc":"_design/g","def":{"fields":[{"a":"asc"}],"partial_filter_selector":{"t":{"$eq":"x"}}},"name":"pa","partitioned":false,"type":"json"},"index_candidates":[{"analysis":{"covering":true,"ranking":2,"reasons":[{"name":"field_mismatch"}],"usable":false},"index":{"ddoc":"_design/f","def":{"fields":[{"a":"asc"},{"b":"asc"}]},"name":"ab","partitioned":false,"type":"json"}},{"analysis":{"covering":false,"ranking":2,"reasons":[{"name":"field_mismatch"}],"usable":false},"index":{"ddoc":"_design/e","def":{"fields":[{"b":"asc"}]},"name":"b","partitioned":false,"type":"json"}},{"analysis":{"covering":true,"ranking":1,"reasons":[{"name":"excluded_by_user"}],"usable":true},"index":{"ddoc":"_design/d","def":{"fields":[{"a":"asc"}]},"name":"a","partitioned":false,"type":"json"}},{"analysis":{"covering":null,"ranking":1,"reasons":[{"name":"excluded_by_user"}],"usable":true},"index":{"ddoc":null,"def":{"fields":[{"_id":"asc"}]},"name":"_all_docs","type":"special"}}],"mrargs":{"conflicts":"undefined","direction":"fwd","end_key":[1,"<MAX>"],"include_docs":true,"partition":null,"reduce":false,"stable":false,"start_key":[1],"update":true,"view_type":"map"},"selector_hints":[{"indexable_fields":["t","a"],"type":"json","unindexable_fields":[]}]}"#
        ),
        (
            #"{"selector":{"b":{"$beginsWith":"x"}}}"#,
            #"{"covering":false,"index":{"ddoc":"_design/e","def":{"fields":[{"b":"asc"}]},"name":"b","partitioned":false,"type":"json"},"index_candidates":[{"analysis":{"covering":false,"ranking":3,"reasons":[{"name":"is_partial"}],"usable":false},"index":{"ddoc":"_design/g","def":{"fields":[{"a":"asc"}],"partial_filter_selector":{"t":{"$eq":"x"}}},"name":"pa","partitioned":false,"type":"json"}},{"analysis":{"covering":false,"ranking":2,"reasons":[{"name":"field_mismatch"}],"usable":false},"index":{"ddoc":"_design/f","def":{"fields":[{"a":"asc"},{"b":"asc"}]},"name":"ab","partitioned":false,"type":"json"}},{"analysis":{"covering":false,"ranking":2,"reasons":[{"name":"field_mismatch"}],"usable":false},"index":{"ddoc":"_design/d","def":{"fields":[{"a":"asc"}]},"name":"a","partitioned":false,"type":"json"}},{"analysis":{"covering":null,"ranking":1,"reasons":[{"name":"unfavored_type"}],"usable":true},"index":{"ddoc":null,"def":{"fields":[{"_id":"asc"}]},"name":"_all_docs","type":"special"}}],"mrargs":{"conflicts":"undefined","direction":"fwd","end_key":["x\uffff","<MAX>"],"include_docs":true,"partition":null,"reduce":false,"stable":false,"start_key":["x"],"update":true,"view_type":"map"},"selector_hints":[{"indexable_fields":["b"],"type":"json","unindexable_fields":[]}]}"#
        ),
    ])
    func theExplanationEqualsCouchDBs(query: String, expected: String) throws {
        let plan = try QueryPlanner.plan(MangoQuery(parsing: JSON.parse(query)), ready: Self.ready, explaining: true)
        #expect(JSON.object(plan.explanation) == (try JSON.parse(expected)))
    }
}
