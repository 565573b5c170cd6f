import FerryCore
import FerryCouch
import FerryQuery
import FerryStore
import FerrySync
import Testing

/// `_index`, `_explain` and `_active_tasks`: an index's life from creation to deletion, and
/// the answers `_find` gives along the way.
@Suite struct IndexTests {
    static let noIndex = "No matching index found, create an index to optimize query time."

    func fixture(count: Int = 30) throws -> DatabaseFixture {
        let f = try DatabaseFixture()
        for i in 0..<count {
            // Mixed types on purpose: numbers, strings, a missing field every seventh document.
            var body: [String: JSON] = ["i": .int(Int64(i))]
            if i % 7 != 0 { body["score"] = i % 3 == 0 ? .string("s\(i % 5)") : .int(Int64(i % 5)) }
            try f.put(String(format: "doc%03d", i), .object(body))
        }
        return f
    }

    func ids(_ r: DatabaseAnswer) -> [String] {
        (r["docs"]?.arrayElements ?? []).compactMap { $0["_id"]?.stringValue }
    }

    @Test func anIndexIsCreatedListedUsedFoundAgainAndDeleted() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let before = try await c.post("/ferry/_find", #"{"selector":{"score":{"$gte":2}}}"#)
            #expect(before["warning"] == .string(Self.noIndex))

            let created = try await c.post("/ferry/_index", #"{"index":{"fields":["score"]},"name":"by-score","ddoc":"q"}"#)
            #expect(created.status == 200)
            #expect(created.json == ["result": "created", "id": "_design/q", "name": "by-score"])
            let again = try await c.post("/ferry/_index", #"{"index":{"fields":["score"]},"name":"by-score","ddoc":"q"}"#)
            #expect(again.json == ["result": "exists", "id": "_design/q", "name": "by-score"])

            let listed = try await c.get("/ferry/_index")
            #expect(listed["total_rows"] == 2)
            #expect(
                listed["indexes"] == [
                    ["ddoc": .null, "name": "_all_docs", "type": "special", "def": ["fields": [["_id": "asc"]]]],
                    [
                        "ddoc": "_design/q", "name": "by-score", "type": "json", "partitioned": false,
                        "def": ["fields": [["score": "asc"]]],
                    ],
                ])
            let ddoc = try await c.get("/ferry/_design/q")
            #expect(ddoc["language"] == "query")
            #expect(ddoc["views"]?["by-score"]?["options"]?["def"]?["fields"] == ["score"])

            let used = try await c.post("/ferry/_find", #"{"selector":{"score":{"$gte":2}},"sort":["score"],"limit":100}"#)
            #expect(used.status == 200)
            #expect(used["warning"] == nil)
            // Index order: numbers 2, 3, 4 then strings, ties by document ID.
            let scores = (used["docs"]?.arrayElements ?? []).compactMap { $0["score"] }
            #expect(scores.count == before["docs"]?.arrayElements.count)
            for (x, y) in zip(scores, scores.dropFirst()) { #expect(CouchCollation.compareForTest(x, y) <= 0) }

            let explained = try await c.post("/ferry/_explain", #"{"selector":{"score":{"$gte":2}}}"#)
            #expect(explained["index"]?["name"] == "by-score")
            #expect(explained["dbname"] == "ferry")
            #expect(explained["selector"] == ["score": ["$gte": 2]])
            #expect(explained["opts"]?["limit"] == 25)

            let deleted = try await c.delete("/ferry/_index/q/json/by-score")
            #expect(deleted.status == 200)
            #expect(deleted.json == ["ok": true])
            #expect(try await c.get("/ferry/_design/q").status == 404)
            #expect(try await c.get("/ferry/_index")["total_rows"] == 1)
            let gone = try await c.delete("/ferry/_index/_design/q/json/by-score")
            #expect(gone.status == 404)
            #expect(gone.json == ["error": "not_found", "reason": "missing"])
            let after = try await c.post("/ferry/_find", #"{"selector":{"score":{"$gte":2}}}"#)
            #expect(after["warning"] == .string(Self.noIndex))
            #expect(ids(after) == ids(before))
        }
    }

    @Test func sortDescendingUsesTheIndexBackwards() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            _ = try await c.post("/ferry/_index", #"{"index":{"fields":["i"]},"name":"by-i","ddoc":"q"}"#)
            let r = try await c.post("/ferry/_find", #"{"selector":{"i":{"$lt":5}},"sort":[{"i":"desc"}]}"#)
            #expect(ids(r) == ["doc004", "doc003", "doc002", "doc001", "doc000"])
            #expect(r["warning"] == nil)
            var seen: [String] = []
            var bookmark: String?
            for _ in 0..<20 {
                let more = bookmark.map { #","bookmark":"\#($0)""# } ?? ""
                let page = try await c.post(
                    "/ferry/_find", #"{"selector":{"i":{"$gte":3}},"sort":[{"i":"desc"}],"limit":4\#(more)}"#)
                if ids(page).isEmpty { break }
                seen += ids(page)
                bookmark = page["bookmark"]?.stringValue
            }
            #expect(seen == (3..<30).reversed().map { String(format: "doc%03d", $0) })
        }
    }

    @Test func aWriteIsSeenThroughTheIndexRightAfterItsReply() async throws {
        let f = try fixture(count: 3)
        try await f.test { c async throws in
            _ = try await c.post("/ferry/_index", #"{"index":{"fields":["tag"]},"name":"by-tag","ddoc":"q"}"#)
            #expect(try await c.put("/ferry/new1", #"{"tag":"fresh"}"#).status == 201)
            let r = try await c.post("/ferry/_find", #"{"selector":{"tag":"fresh"},"use_index":"q"}"#)
            #expect(ids(r) == ["new1"])
            #expect(r["warning"] == nil)
            let replicated = try await c.post(
                "/ferry/_bulk_docs",
                #"{"new_edits":false,"docs":[{"_id":"new2","_rev":"1-00112233445566778899aabbccddeeff","tag":"fresh"}]}"#)
            #expect(replicated.status == 201)
            #expect(ids(try await c.post("/ferry/_find", #"{"selector":{"tag":"fresh"}}"#)) == ["new1", "new2"])
        }
    }

    @Test func useIndexOfAMissingIndexWarnsAndStillAnswers() async throws {
        let f = try fixture(count: 5)
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"i":{"$gt":2}},"use_index":"nosuch"}"#)
            #expect(r.status == 200)
            #expect(ids(r) == ["doc003", "doc004"])
            #expect(r["warning"]?.stringValue?.contains("_design/nosuch") == true)
        }
    }

    @Test func aUserWhoMayNotWriteTheDesignDocumentIsRefused() async throws {
        let f = try fixture(count: 2)
        let writer = CouchPrincipal.user(name: "w", policy: PeerPolicy(write: AccessRule(idPrefixes: ["doc"])))
        try await f.test(as: writer) { c async throws in
            let r = try await c.post("/ferry/_index", #"{"index":{"fields":["i"]},"ddoc":"q"}"#)
            #expect(r.status == 403)
            #expect(r.error == "forbidden")
        }
        #expect(try f.store.document(DocumentID(unchecked: "_design/q")) == nil)
    }

    @Test func badIndexRequestsAreCouchDBErrors() async throws {
        let f = try fixture(count: 1)
        try await f.test { c async throws in
            let noIndex = try await c.post("/ferry/_index", #"{"foo":1}"#)
            #expect(noIndex.status == 400)
            #expect(noIndex.json == ["error": "missing_required_key", "reason": "Missing required key: index"])
            let noFields = try await c.post("/ferry/_index", #"{"index":{}}"#)
            #expect(noFields.json == ["error": "missing_required_key", "reason": "Missing required key: fields"])
            #expect(try await c.post("/ferry/_index", "[1]").status == 400)
            #expect(try await c.delete("/ferry/_index/q/text/x").status == 404)
            #expect(try await c.delete("/ferry/_index/q").status == 404)
            #expect(try await c.get("/ferry/_index/q/json/x").status == 405)
        }
    }

    @Test func activeTasksListIndexesStillBuildingForAdminsOnly() async throws {
        let f = try fixture(count: 1)
        try await f.test { c async throws in
            let r = try await c.get("/_active_tasks")
            #expect(r.status == 200)
            #expect(r.json == [])
        }
        try await f.test(as: .user(name: "u", policy: .trusted)) { c async throws in
            #expect(try await c.get("/_active_tasks").status == 401)
        }
    }
}

extension CouchCollation {
    /// -1, 0 or 1 as `compare` orders two values.
    static func compareForTest(_ a: JSON, _ b: JSON) -> Int {
        switch compare(a, b) {
        case .ascending: return -1
        case .same: return 0
        case .descending: return 1
        }
    }
}
