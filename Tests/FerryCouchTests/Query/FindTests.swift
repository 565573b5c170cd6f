import FerryCore
import FerryCouch
import FerryQuery
import FerryStore
import FerrySync
import Testing

/// `POST /{db}/_find` over the in-process API: options, paging, conflicts, statistics,
/// warnings, read policy and freshness after writes.
@Suite struct FindTests {
    static let noIndex = "No matching index found, create an index to optimize query time."

    /// Documents of mixed types, a design document and a node-internal one.
    func fixture() throws -> DatabaseFixture {
        let f = try DatabaseFixture()
        let docs: [(String, JSON)] = [
            ("a", ["n": 1, "s": "x", "tags": ["red"]]),
            ("b", ["n": 2, "s": "y", "sub": ["k": 1]]),
            ("c", ["n": 3]),
            ("d", ["n": "3", "s": "z"]),
            ("e", ["n": .null]),
            ("f", ["n": 2.5, "s": "x"]),
            ("g", ["other": true]),
        ]
        for (id, body) in docs { try f.put(id, body) }
        try f.put("_design/x", ["language": "javascript", "n": 1])
        _ = try f.store.insertRevisions([
            IncomingRevision(
                id: DocumentID(unchecked: "_ferry/member"), revision: RevisionID.compute(parent: nil, deleted: false, canonicalBody: JSON.object(["n": 1]).canonicalBytes),
                history: [], deleted: false, body: ["n": 1])
        ])
        return f
    }

    func ids(_ r: DatabaseAnswer) -> [String] {
        (r["docs"]?.arrayElements ?? []).compactMap { $0["_id"]?.stringValue }
    }

    @Test func findMatchesTheWholeSelectorAndWarnsWithoutAnIndex() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"n":{"$gt":1}}}"#)
            #expect(r.status == 200)
            // `$gt` compares by collation: the string "3" sorts after every number, null before.
            #expect(ids(r) == ["b", "c", "d", "f"])
            #expect(r["warning"] == .string(Self.noIndex))
            #expect(r["bookmark"]?.stringValue != "nil")
            let typed = try await c.post("/ferry/_find", #"{"selector":{"n":{"$type":"number","$gte":2}}}"#)
            #expect(ids(typed) == ["b", "c", "f"])
            let nested = try await c.post("/ferry/_find", #"{"selector":{"sub.k":1}}"#)
            #expect(ids(nested) == ["b"])
            let missing = try await c.post("/ferry/_find", #"{"selector":{"n":{"$exists":false}}}"#)
            #expect(ids(missing) == ["g"])
        }
    }

    @Test func designAndNodeInternalDocumentsAreNeverReturned() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"n":1}}"#)
            #expect(ids(r) == ["a"])
            let all = try await c.post("/ferry/_find", #"{"selector":{"_id":{"$gt":null}},"limit":100}"#)
            #expect(ids(all) == ["a", "b", "c", "d", "e", "f", "g"])
        }
    }

    @Test func emptyResultsAndZeroLimitAnswerTheNilBookmark() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let none = try await c.post("/ferry/_find", #"{"selector":{"n":100}}"#)
            #expect(ids(none) == [])
            #expect(none["bookmark"] == "nil")
            let zero = try await c.post("/ferry/_find", #"{"selector":{"n":{"$gt":0}},"limit":0}"#)
            #expect(ids(zero) == [])
            #expect(zero["bookmark"] == "nil")
            // Skipping past the end still matched documents: the bookmark is the last one's.
            let past = try await c.post("/ferry/_find", #"{"selector":{"n":{"$gt":0}},"skip":10}"#)
            #expect(ids(past) == [])
            #expect(past["bookmark"]?.stringValue != "nil")
            let all = try await c.post("/ferry/_find", #"{"selector":{"n":{"$gt":0}}}"#)
            #expect(past["bookmark"] == all["bookmark"])
        }
    }

    @Test func fieldsSkipAndLimitShapeThePage() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.post(
                "/ferry/_find", #"{"selector":{"n":{"$gte":1}},"fields":["_id","s","sub.k"],"skip":1,"limit":2}"#)
            #expect(r["docs"] == [["_id": "b", "s": "y", "sub": ["k": 1]], ["_id": "c"]])
        }
    }

    @Test func bookmarksPageThroughTheWholeResultWithoutGapsOrDuplicates() async throws {
        let f = try DatabaseFixture()
        for i in 0..<57 { try f.put("doc\(1000 + i)", ["i": .int(Int64(i)), "even": .bool(i % 2 == 0)]) }
        try await f.test { c async throws in
            var seen: [String] = []
            var bookmark: String?
            for _ in 0..<20 {
                let more = bookmark.map { #","bookmark":"\#($0)""# } ?? ""
                let r = try await c.post("/ferry/_find", #"{"selector":{"even":true},"limit":5\#(more)}"#)
                #expect(r.status == 200)
                let page = ids(r)
                if page.isEmpty {
                    #expect(r["bookmark"]?.stringValue == bookmark)  // the last page's bookmark, again
                    break
                }
                seen += page
                bookmark = r["bookmark"]?.stringValue ?? ""
            }
            #expect(seen == (0..<57).filter { $0 % 2 == 0 }.map { "doc\(1000 + $0)" })
        }
    }

    @Test func aBookmarkOfAnotherScanOrMalformedIsInvalid() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let bad = try await c.post("/ferry/_find", #"{"selector":{"n":1},"bookmark":"garbage"}"#)
            #expect(bad.status == 400)
            #expect(bad.error == "invalid_bookmark")
            #expect(bad["reason"] == #"Invalid bookmark value: "garbage""#)
            let asc = try await c.post("/ferry/_find", #"{"selector":{"_id":{"$gt":null}},"limit":1}"#)
            let b = asc["bookmark"]?.stringValue ?? ""
            let desc = try await c.post(
                "/ferry/_find", #"{"selector":{"_id":{"$gt":null}},"sort":[{"_id":"desc"}],"bookmark":"\#(b)"}"#)
            #expect(desc.status == 400)
            #expect(desc.error == "invalid_bookmark")
            let notString = try await c.post("/ferry/_find", #"{"selector":{"n":1},"bookmark":5}"#)
            #expect(notString.error == "invalid_bookmark")
        }
    }

    @Test func sortByIDOnAnIDSelectorRunsBothWays() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.post(
                "/ferry/_find", #"{"selector":{"_id":{"$gt":null},"s":{"$exists":true}},"sort":[{"_id":"desc"}]}"#)
            #expect(ids(r) == ["f", "d", "b", "a"])
        }
    }

    @Test func conflictsAddTheOtherLeavesAndExecutionStatsCount() async throws {
        let f = try DatabaseFixture()
        let revs = try f.conflict("k", ["v": 1], ["v": 2])
        try f.put("z", ["v": 3])
        let winner = try f.store.document(DocumentID(unchecked: "k"))!.revision
        let loser = revs.first { $0 != winner }!
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"v":{"$gt":0}},"conflicts":true,"execution_stats":true}"#)
            let docs = r["docs"]?.arrayElements ?? []
            #expect(docs.count == 2)
            #expect(docs.first?["_conflicts"] == [.string(loser.description)])
            #expect(docs.last?["_conflicts"] == nil)
            let stats = r["execution_stats"]
            #expect(stats?["total_keys_examined"] == 2)
            #expect(stats?["total_docs_examined"] == 2)
            #expect(stats?["total_quorum_docs_examined"] == 0)
            #expect(stats?["results_returned"] == 2)
            #expect(stats?["execution_time_ms"]?.doubleValue != nil)
            let plain = try await c.post("/ferry/_find", #"{"selector":{"v":{"$gt":0}}}"#)
            #expect(plain["docs"]?.arrayElements.first?["_conflicts"] == nil)
            #expect(plain["execution_stats"] == nil)
            let projected = try await c.post("/ferry/_find", #"{"selector":{"v":{"$gt":0}},"conflicts":true,"fields":["v"]}"#)
            #expect(projected["docs"]?.arrayElements.first == ["v": .int(winner == revs[0] ? 1 : 2)])
        }
    }

    @Test func everyAnswerEqualsTheDocumentAsAReadServesItWithOrWithoutAttachments() async throws {
        let f = try DatabaseFixture()
        try f.put("plain", ["n": 1, "s": "x \"quoted\" \u{e9}", "nested": ["a": [1, 2.5, .null]]])
        try f.put("empty", [:])
        try f.put("mention", ["n": 1, "s": "@attachments"])
        try await f.test { c async throws in
            _ = try await c.request(.put, "/ferry/withatt/a.txt", body: "hello", headers: [.contentType: "text/plain"])
            _ = try await c.put("/ferry/withatt2", #"{"n":1,"_attachments":{"b.txt":{"content_type":"text/plain","data":"aGk="}}}"#)
            let all = try await c.post("/ferry/_find", #"{"selector":{"_id":{"$gt":null}}}"#)
            let docs = all["docs"]?.arrayElements ?? []
            #expect(docs.count == 5)
            for doc in docs {
                let id = try #require(doc["_id"]?.stringValue)
                let read = try await c.get("/ferry/\(id)")
                #expect(doc == read.json, "\(id)")
            }
            // A selector on `_attachments` reads the whole rendered document.
            let withAttachment = try await c.post("/ferry/_find", #"{"selector":{"_attachments.b\\.txt.content_type":"text/plain"}}"#)
            #expect(ids(withAttachment) == ["withatt2"])
        }
        // A reader restricted by policy has every document decoded whole; the answers are the same.
        let reader = CouchPrincipal.user(name: "r", policy: PeerPolicy(read: AccessRule(idPrefixes: ["plain", "empty", "mention", "withatt"])))
        let query: JSON = ["selector": ["n": 1], "fields": ["_id", "s", "n"]]
        let asAdmin = try f.database.find(body: query, principal: .admin).docs
        let restricted = try f.database.find(body: query, principal: reader).docs
        #expect(restricted == asAdmin)
        #expect(restricted.compactMap { $0["_id"]?.stringValue } == ["mention", "plain", "withatt2"])
    }

    @Test func aRestrictedReaderFindsOnlyWhatItMayRead() async throws {
        let f = try DatabaseFixture()
        try f.put("pub/1", ["n": 1])
        try f.put("priv/1", ["n": 1])
        try f.put("t1", ["n": 1, "type": "note"])
        let reader = CouchPrincipal.user(name: "r", policy: PeerPolicy(read: AccessRule(idPrefixes: ["pub/"], types: ["note"])))
        try await f.test(as: reader) { c async throws in
            let r = try await c.post("/ferry/_find", #"{"selector":{"n":1}}"#)
            #expect(ids(r) == ["pub/1", "t1"])
        }
    }

    @Test func aQueryAfterAWritesReplySeesIt() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            for i in 0..<5 {
                let put = try await c.put("/ferry/w\(i)", #"{"score":\#(i)}"#)
                #expect(put.status == 201)
                let r = try await c.post("/ferry/_find", #"{"selector":{"score":\#(i)}}"#)
                #expect(ids(r) == ["w\(i)"])
            }
            let replicated = try await c.post(
                "/ferry/_bulk_docs",
                #"{"new_edits":false,"docs":[{"_id":"r1","_rev":"1-0123456789abcdef0123456789abcdef","score":99}]}"#)
            #expect(replicated.status == 201)
            let r = try await c.post("/ferry/_find", #"{"selector":{"score":99}}"#)
            #expect(ids(r) == ["r1"])
            let rev = try await c.get("/ferry/w0")["_rev"]?.stringValue ?? ""
            #expect(try await c.delete("/ferry/w0?rev=\(rev)").status == 200)
            #expect(ids(try await c.post("/ferry/_find", #"{"selector":{"score":0}}"#)) == [])
        }
    }

    @Test func findAndExplainAcceptOnlyPost() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let get = try await c.get("/ferry/_find")
            #expect(get.status == 405)
            #expect(get.error == "method_not_allowed")
            #expect(get["reason"] == "Only POST allowed")
            #expect(try await c.get("/ferry/_explain").status == 405)
            let put = try await c.put("/ferry/_index", "{}")
            #expect(put.status == 405)
            #expect(put["reason"] == "Only GET,POST allowed")
            let form = try await c.request(.post, "/ferry/_find", body: "{}", headers: [.contentType: "text/plain"])
            #expect(form.status == 415)
        }
    }

    @Test func explainWithoutAnIndexNamesAllDocsInCouchDBsShape() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_explain", #"{"selector":{"n":{"$gt":0}},"limit":3,"fields":["n"]}"#)
            #expect(r.status == 200)
            #expect(r["dbname"] == "ferry")
            #expect(r["index"] == ["ddoc": .null, "name": "_all_docs", "type": "special", "def": ["fields": [["_id": "asc"]]]])
            #expect(r["partitioned"] == false)
            #expect(r["selector"] == ["n": ["$gt": 0]])
            #expect(r["limit"] == 3)
            #expect(r["skip"] == 0)
            #expect(r["fields"] == ["n"])
            #expect(r["opts"]?["bookmark"] == "nil")
            #expect(r["opts"]?["use_index"] == [])
            #expect(r["opts"]?["execution_stats"] == false)
            let list = try await c.get("/ferry/_index?limit=1&skip=0")
            #expect(list["total_rows"] == 1)
            #expect(list["indexes"]?.arrayElements.count == 1)
        }
    }

    @Test func everyDocumentIDIsValidJSONInAnAnswerBuiltFromStoredText() throws {
        let f = try DatabaseFixture()
        let ids = ["plain", "quo\"te", "back\\slash", "ctl\u{1}x", "tab\tx", "ünï"]
        for id in ids { try f.put(id, ["k": 1, "v": .string(id)]) }
        let result = try f.database.find(try MangoQuery(parsing: ["selector": ["k": 1]]), principal: .admin)
        let docs = try result.encodedDocs.map { try JSON.parse($0) }
        #expect(Set(docs.compactMap { $0["_id"]?.stringValue }) == Set(ids))
        for doc in docs { #expect(doc["_id"] == doc["v"]) }
    }
}
