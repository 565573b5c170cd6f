import FerryCore
import FerryQuery
import Testing

/// `POST /{db}/_index` bodies: what is accepted, and the errors Apache CouchDB 3.4.3 answered
/// for each bad body (recorded from the reference server).
@Suite struct MangoIndexRequestTests {
    static func parse(_ text: String) throws -> MangoIndexRequest {
        try MangoIndexRequest(parsing: JSON.parse(text))
    }

    static func error(_ text: String) throws -> MangoError? {
        let body = try JSON.parse(text)
        do {
            _ = try MangoIndexRequest(parsing: body)
            return nil
        } catch {
            return error
        }
    }

    @Test(arguments: [
        (#"{}"#, "missing_required_key", "Missing required key: index"),
        (#"{"index":{}}"#, "missing_required_key", "Missing required key: fields"),
        (#"{"index":{"fields":"a"}}"#, "invalid_sort_json", #"Sort must be an array of sort specs, not: <<"a">>"#),
        (#"{"index":{"fields":[1]}}"#, "invalid_sort_field", "Invalid sort field: 1"),
        (#"{"index":{"fields":[{"a":"up"}]}}"#, "invalid_sort_field", #"Invalid sort field: {[{<<"a">>,<<"up">>}]}"#),
        (#"{"index":{"fields":[""]}}"#, "invalid_sort_field", "Invalid sort field: <<>>"),
        (
            #"{"index":{"fields":[{"a":"asc","b":"asc"}]}}"#, "invalid_sort_field",
            #"Invalid sort field: {[{<<"a">>,<<"asc">>},{<<"b">>,<<"asc">>}]}"#
        ),
        (
            #"{"index":{"fields":[{"a":"desc"},"b"]}}"#, "unsupported_mixed_sort",
            "Sorts currently only support a single direction for all fields."
        ),
        (#"{"index":{"fields":["a"]},"type":"text"}"#, "required index service unavailable", "text"),
        (#"{"index":{"fields":["a"]},"type":"nouveau"}"#, "required index service unavailable", "nouveau"),
        (#"{"index":{"fields":["a"]},"type":"geo"}"#, "invalid_index", "Invalid type for index: geo"),
        (#"{"index":{"fields":["a"]},"type":5}"#, "invalid_string", "Invalid string: 5"),
        (#"{"index":{"fields":["a"]},"name":""}"#, "invalid_empty_string", "Index name or ddoc cannot be empty string"),
        (#"{"index":{"fields":["a"]},"name":5}"#, "invalid_string", "Invalid string: 5"),
        (#"{"index":{"fields":["a"]},"ddoc":""}"#, "invalid_empty_string", "Index name or ddoc cannot be empty string"),
        (#"{"index":{"fields":["a"]},"w":0}"#, "invalid_pos_integer", "0 is not an integer greater than zero"),
        (#"{"index":{"fields":["a"]},"foo":1}"#, "invalid_key", "Invalid key foo for this request."),
        (#"{"index":{"fields":["a"],"foo":1}}"#, "invalid_key", "Invalid key foo for this request."),
        (#"{"index":5}"#, "invalid_index", "JSON indexes must be an object, not: 5"),
        (#"{"index":[]}"#, "invalid_index", "JSON indexes must be an object, not: []"),
        (
            #"{"index":{"fields":["a"],"partial_filter_selector":5}}"#, "invalid_selector_json",
            "Selector must be a JSON object, not: 5"
        ),
        (#"{"index":{"fields":["a"],"partial_filter_selector":{"a":{"$foo":1}}}}"#, "invalid_operator", "Invalid operator: $foo"),
        (#"[]"#, "bad_request", "Request body must be a JSON object"),
    ])
    func badBodiesGetCouchDBsErrors(body: String, error: String, reason: String) throws {
        let thrown = try Self.error(body)
        #expect(thrown?.code == error)
        #expect(thrown?.description == reason)
        #expect(thrown?.failure.httpStatus == 400)
    }

    @Test func fieldsASelectorCannotSeeAreRefusedWithTheReason() throws {
        for field in ["_attachments", "_deleted", "_conflicts", "_id.x", "@attachments"] {
            let thrown = try Self.error(#"{"index":{"fields":["\#(field)"]}}"#)
            #expect(thrown?.code == "invalid_index", "\(field)")
            #expect(thrown?.description.contains("Cannot index \(field)") == true)
        }
        #expect(try Self.parse(#"{"index":{"fields":["_id","_rev","a"]}}"#).index.fields.count == 3)
    }

    @Test func anIndexWithoutFieldsIsRefused() throws {
        let thrown = try Self.error(#"{"index":{"fields":[]}}"#)
        #expect(thrown?.code == "invalid_index")
        #expect(thrown?.description == "A JSON index needs at least one field.")
    }

    @Test func partitionedIsAcceptedOnlyAsFalse() throws {
        #expect(try Self.parse(#"{"index":{"fields":["a"]},"partitioned":false}"#).index.name.count == 40)
        #expect(try Self.error(#"{"index":{"fields":["a"]},"partitioned":true}"#)?.code == "invalid_partitioned_option")
        #expect(try Self.error(#"{"index":{"fields":["a"]},"partitioned":"x"}"#)?.code == "invalid_partitioned_value")
    }

    @Test func theSameDefinitionGetsTheSameGeneratedNameAndDesignDocument() throws {
        let a = try Self.parse(#"{"index":{"fields":["a",{"b.c":"asc"}]}}"#)
        let b = try Self.parse(#"{"index":{"fields":[{"a":"asc"},"b.c"]},"type":"json","w":2}"#)
        #expect(a.index == b.index)
        #expect(a.index.name.count == 40)
        let hex = a.index.name.allSatisfy { $0.isHexDigit }
        #expect(hex)
        #expect(a.index.designDocument == "_design/" + a.index.name)
        let other = try Self.parse(#"{"index":{"fields":["a","b.c"],"partial_filter_selector":{"x":1}}}"#)
        #expect(other.index.name != a.index.name)
        let reordered = try Self.parse(#"{"index":{"fields":["b.c","a"]}}"#)
        #expect(reordered.index.name != a.index.name)
    }

    @Test func ddocIsTakenWithOrWithoutTheDesignPrefix() throws {
        let bare = try Self.parse(#"{"index":{"fields":["a"]},"ddoc":"x","name":"n"}"#)
        let full = try Self.parse(#"{"index":{"fields":["a"]},"ddoc":"_design/x","name":"n"}"#)
        #expect(bare.index.designDocument == "_design/x")
        #expect(bare == full)
        #expect(bare.index.name == "n")
        let named = try Self.parse(#"{"index":{"fields":["a"]},"ddoc":"_design/x"}"#)
        #expect(named.index.name == MangoIndexRequest.generatedName(named.index))
    }

    @Test func aFieldListedTwiceCountsOnceAndDirectionsAreKept() throws {
        let r = try Self.parse(#"{"index":{"fields":["a","a","b"]}}"#)
        #expect(r.index.fields.map(\.path.description) == ["a", "b"])
        let d = try Self.parse(#"{"index":{"fields":[{"a":"desc"}]}}"#)
        #expect(d.index.fields == [MangoIndex.Field(path: FieldPath(components: ["a"]), descending: true)])
    }

    @Test func anEmptyPartialFilterIsNoFilter() throws {
        let r = try Self.parse(#"{"index":{"fields":["a"],"partial_filter_selector":{}}}"#)
        #expect(r.index.partialFilter == nil)
        #expect(r.index == (try Self.parse(#"{"index":{"fields":["a"]}}"#)).index)
    }

    @Test func theIndexListEntryHasCouchDBsShape() throws {
        let r = try Self.parse(#"{"index":{"fields":["a"],"partial_filter_selector":{"b":1}},"name":"p","ddoc":"d"}"#)
        #expect(
            r.index.json
                == (try JSON.parse(
                    #"{"ddoc":"_design/d","name":"p","type":"json","partitioned":false,"def":{"fields":[{"a":"asc"}],"partial_filter_selector":{"b":{"$eq":1}}}}"#
                )))
        #expect(
            MangoIndex.allDocsJSON
                == (try JSON.parse(#"{"ddoc":null,"name":"_all_docs","type":"special","def":{"fields":[{"_id":"asc"}]}}"#)))
        let desc = try Self.parse(#"{"index":{"fields":[{"a":"desc"},{"b":"desc"}]},"name":"n","ddoc":"d"}"#)
        #expect(desc.index.json.objectValue?["def"] == (try JSON.parse(#"{"fields":[{"a":"desc"},{"b":"desc"}]}"#)))
    }
}

/// Index definitions written into design documents and read back, as the store reads them.
@Suite struct MangoDesignDocumentTests {
    @Test func anAddedIndexIsReadBackFromTheDesignDocument() throws {
        let request = try MangoIndexRequest(
            parsing: JSON.parse(#"{"index":{"fields":["b",{"a\\.x":"asc"},"c.d"],"partial_filter_selector":{"t":"x"}},"ddoc":"d","name":"n"}"#))
        let body = MangoDesignDocument.adding(request.index, to: nil)
        let read = MangoDesignDocument.indexes(designDocumentID: "_design/d", body: body)
        #expect(read == [request.index])
    }

    @Test func aSecondIndexJoinsTheFirstAndRemovingTheLastDeletesTheDocument() throws {
        let one = try MangoIndexRequest(parsing: JSON.parse(#"{"index":{"fields":["a"]},"ddoc":"d","name":"one"}"#)).index
        let two = try MangoIndexRequest(parsing: JSON.parse(#"{"index":{"fields":["b"]},"ddoc":"d","name":"two"}"#)).index
        let both = MangoDesignDocument.adding(two, to: MangoDesignDocument.adding(one, to: nil))
        #expect(MangoDesignDocument.indexes(designDocumentID: "_design/d", body: both) == [one, two])
        let left = try #require(MangoDesignDocument.removing(name: "one", from: both))
        #expect(MangoDesignDocument.indexes(designDocumentID: "_design/d", body: left) == [two])
        #expect(MangoDesignDocument.removing(name: "two", from: left) == nil)
    }

    @Test func couchDBsOwnDesignDocumentDefinesTheSameIndex() throws {
        // Written by CouchDB 3.4.3 for {"index":{"fields":["a"],"partial_filter_selector":{"b":1}},"name":"p","ddoc":"d"}.
        let body = try JSON.parse(
            #"{"_id":"_design/d","language":"query","views":{"p":{"map":{"fields":{"a":"asc"},"partial_filter_selector":{"b":{"$eq":1}}},"reduce":"_count","options":{"def":{"fields":["a"],"partial_filter_selector":{"b":1}}}}}}"#
        )
        let request = try MangoIndexRequest(
            parsing: JSON.parse(#"{"index":{"fields":["a"],"partial_filter_selector":{"b":1}},"name":"p","ddoc":"d"}"#))
        #expect(MangoDesignDocument.indexes(designDocumentID: "_design/d", body: body) == [request.index])
    }
}
