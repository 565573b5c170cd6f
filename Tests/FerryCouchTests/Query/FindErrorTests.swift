import FerryCore
import FerryCouch
import FerryQuery
import Testing

/// Bad `_find` and `_explain` requests answer CouchDB's 400 errors with their reasons, and
/// the Mango paths route to their endpoints.
@Suite struct FindErrorTests {
    func fixture() throws -> DatabaseFixture {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        return f
    }

    @Test func badSelectorsAndOptionsAreCouchDBErrors() async throws {
        let f = try fixture()
        let cases: [(body: String, error: String, reason: String?)] = [
            (#"{"selector":{"n":{"$foo":0}}}"#, "invalid_operator", "Invalid operator: $foo"),
            (#"{"selector":{"n":{"$regex":"("}}}"#, "bad_arg", nil),
            (#"{"selector":{"n":{"$in":3}}}"#, "bad_arg", nil),
            (#"{"selector":{"n":1},"sort":["n"]}"#, "no_usable_index", "No index exists for this sort, try indexing by the sort fields."),
            (#"{"selector":{"n":1},"bookmark":"garbage"}"#, "invalid_bookmark", #"Invalid bookmark value: "garbage""#),
            (#"{"selector":{"n":1},"limit":-1}"#, "invalid_non_neg_integer", nil),
            (#"{"selector":{"n":1},"nope":1}"#, "invalid_key", "Invalid key nope for this request."),
            (#"{"fields":["n"]}"#, "missing_required_key", "Missing required key: selector"),
            (#"{"selector":[1]}"#, "invalid_selector_json", nil),
        ]
        try await f.test { c async throws in
            for (body, error, reason) in cases {
                let r = try await c.post("/ferry/_find", body)
                #expect(r.status == 400, "\(body)")
                #expect(r.error == error, "\(body)")
                if let reason { #expect(r["reason"]?.stringValue == reason, "\(body)") }
                #expect(r["docs"] == nil, "\(body)")
            }
            let explain = try await c.post("/ferry/_explain", #"{"selector":{"n":{"$foo":0}}}"#)
            #expect(explain.status == 400)
            #expect(explain.error == "invalid_operator")
        }
    }

    @Test func anOverDeepSelectorIsRefusedNotCrashed() async throws {
        let f = try fixture()
        var nested = #"{"n":1}"#
        for _ in 0..<2000 { nested = #"{"$and":[\#(nested)]}"# }
        let selector = nested
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":\#(selector)}"#)
            #expect(r.status == 400)
        }
    }

    @Test func malformedJSONIsABadRequest() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":"#)
            #expect(r.status == 400)
            #expect(r.error == "bad_request")
        }
    }

    @Test func mangoPathsNameTheirEndpoints() {
        #expect(CouchRouting.endpoint(rawPath: "/db/_find") == .databaseSpecial(db: "db", name: "find"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_explain") == .databaseSpecial(db: "db", name: "explain"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_index") == .databaseSpecial(db: "db", name: "index"))
        #expect(CouchRouting.endpoint(rawPath: "/db/_index/q/json/by-n") == .index(db: "db", path: ["q", "json", "by-n"]))
        #expect(
            CouchRouting.endpoint(rawPath: "/db/_index/_design/q/json/n") == .index(db: "db", path: ["_design", "q", "json", "n"]))
        #expect(CouchRouting.endpoint(rawPath: "/db/_index/_design%2Fq/json/n") == .index(db: "db", path: ["_design/q", "json", "n"]))
        #expect(CouchRouting.endpoint(rawPath: "/_active_tasks") == .activeTasks)
        // Unchanged: other underscore paths with more segments are still attachments of their document.
        #expect(CouchRouting.endpoint(rawPath: "/db/_design/x/a.txt") == .attachment(db: "db", docID: "_design/x", name: "a.txt"))
    }
}
