import FerryCore
import FerryCouch
import FerryCouchDocuments
import FerryQuery
import FerryStore
import FerrySync
import Foundation
import Testing

/// `_find` within bounds: oversized selectors and costly regexes are refused with CouchDB's
/// 400, a cancelled or overdue query stops, and a restricted reader's statistics, plans and
/// `_explain` say nothing of the documents it may not read.
@Suite struct FindBoundsTests {
    static let reader = CouchPrincipal.user(name: "r", policy: PeerPolicy(read: AccessRule(idPrefixes: ["pub/"])))

    /// Public and hidden documents with a `secret` field, and an index on it in a design
    /// document the reader may not read.
    func fixture() async throws -> DatabaseFixture {
        let f = try DatabaseFixture()
        try f.put("pub/1", ["secret": "open", "s": "aaaa"])
        try f.put("priv/1", ["secret": "hunter2"])
        try f.put("priv/2", ["secret": "hunter2"])
        _ = try f.database.createIndex(["index": ["fields": ["secret"]], "ddoc": "hidden", "name": "by-secret"], principal: .admin)
        return f
    }

    @Test func aTwoHundredThousandValueInIsRefusedWithBadRequest() async throws {
        let f = try await fixture()
        let values = (0..<200_000).map { "\"v\($0)\"" }.joined(separator: ",")
        try await f.test(as: Self.reader) { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"secret":{"$in":[\#(values)]}}}"#)
            #expect(r.status == 400)
            #expect(r.error == "bad_request")
            #expect(r["reason"]?.stringValue?.contains("maximumOperands") == true)
        }
    }

    @Test func aCatastrophicRegexIsRefusedWithBadRequest() async throws {
        let f = try await fixture()
        try f.put("pub/evil", ["s": .string(String(repeating: "a", count: 36) + "!")])
        try await f.test(as: Self.reader) { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"s":{"$regex":"(a+)+$"}}}"#)
            #expect(r.status == 400)
            #expect(r.error == "bad_request")
            #expect(r["reason"]?.stringValue?.contains("maximumRegexTicks") == true)
            let fine = try await c.post("/ferry/_find", #"{"selector":{"s":{"$regex":"^a+$"}}}"#)
            #expect(fine.status == 200, "\(fine.text)")
        }
    }

    @Test func aQueryInACancelledTaskEndsWithCancellationError() async throws {
        let f = try await fixture()
        let database = f.database
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return Result { try database.find(body: ["selector": ["secret": "open"]], principal: .admin) }
        }
        let result = await task.value
        #expect(throws: CancellationError.self) { try result.get() }
        // A budget cancelled from elsewhere (the client went away) stops it the same way.
        let budget = QueryBudget(timeout: nil)
        budget.cancel()
        #expect(throws: CancellationError.self) {
            try database.find(body: ["selector": ["secret": "open"]], principal: .admin, budget: budget)
        }
    }

    @Test func aQueryPastItsDeadlineAnswersTimeout() async throws {
        let f = try await fixture()
        let error = #expect(throws: CouchError.self) {
            try f.database.find(body: ["selector": ["secret": "open"]], principal: .admin, budget: QueryBudget(timeout: .zero))
        }
        #expect(error?.error == "timeout")
        #expect(error?.reason.contains("couch.queryTimeoutSeconds") == true)
    }

    @Test func executionStatsCountOnlyDocumentsTheReaderMayRead() async throws {
        let f = try await fixture()
        #expect(!Self.reader.policy.read.admitsEverything)
        // The reader's probe for a hidden value must look the same whether or not it exists.
        try await f.test(as: Self.reader) { c async throws in
            var seen: [String: [JSON?]] = [:]
            for (selector, index) in [
                (#"{"secret":"hunter2"}"#, #"["_design/hidden","by-secret"]"#),
                (#"{"secret":"nothing"}"#, #"["_design/hidden","by-secret"]"#),
                (#"{"_id":"priv/1"}"#, #"[]"#), (#"{"_id":"priv/9"}"#, #"[]"#),
            ] {
                let r = try await c.post(
                    "/ferry/_find", #"{"selector":\#(selector),"execution_stats":true,"use_index":\#(index)}"#)
                #expect(r.status == 200)
                #expect(r["docs"]?.arrayElements.isEmpty == true)
                let stats = r["execution_stats"]
                seen[selector] = [stats?["total_keys_examined"], stats?["total_docs_examined"], stats?["results_returned"]]
            }
            #expect(seen[#"{"secret":"hunter2"}"#] == seen[#"{"secret":"nothing"}"#])
            #expect(seen[#"{"_id":"priv/1"}"#] == [0, 0, 0])
            #expect(seen[#"{"_id":"priv/9"}"#] == [0, 0, 0])
        }
        // What the reader may read is counted as before.
        try await f.test(as: Self.reader) { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"secret":"open"},"execution_stats":true}"#)
            #expect(r["execution_stats"]?["total_docs_examined"] == 1)
            #expect(r["execution_stats"]?["results_returned"] == 1)
        }
        // The admin still sees every document counted.
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"secret":"hunter2"},"execution_stats":true}"#)
            #expect(r["execution_stats"]?["total_docs_examined"] == 2)
        }
    }

    @Test func explainAndWarningsDoNotNameIndexesOfUnreadableDesignDocuments() async throws {
        let f = try await fixture()
        try await f.test(as: Self.reader) { c async throws in
            let explained = try await c.post("/ferry/_explain", #"{"selector":{"secret":"hunter2"}}"#)
            #expect(explained.status == 200)
            #expect(explained["index"]?["name"] == "_all_docs")
            #expect(!explained.text.contains("hidden"))
            #expect(!explained.text.contains("by-secret"))
            // The bookmark names the scan it continues: the reader's is over `_all_docs`.
            let found = try await c.post("/ferry/_find", #"{"selector":{"secret":"open"}}"#)
            #expect(found["docs"]?.arrayElements.count == 1)
            let bookmark = try #require(found["bookmark"]?.stringValue)
            var base64 = bookmark.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while base64.count % 4 != 0 { base64 += "=" }
            let decoded = try #require(Data(base64Encoded: base64))
            #expect(!String(decoding: decoded, as: UTF8.self).contains("hidden"))
        }
        try await f.test { c async throws in
            let explained = try await c.post("/ferry/_explain", #"{"selector":{"secret":"hunter2"}}"#)
            #expect(explained["index"]?["name"] == "by-secret")
        }
    }
}
