import FerryCore
import FerryCouch
import FerryStore
import Testing

@Suite struct DatabaseAllDocsTests {
    /// IDs whose raw UTF-8 order differs from collation order: "B" < "_design/x" < "a" < "é".
    func fixture() throws -> DatabaseFixture {
        let f = try DatabaseFixture()
        for id in ["a", "é", "B", "_design/x", "c"] { try f.put(id, ["id": .string(id)]) }
        let rev = try f.store.document(DocumentID(unchecked: "c"))!.revision
        try f.store.delete(DocumentID(unchecked: "c"), revision: rev)
        return f
    }

    @Test func allDocsListsLiveDocumentsInRawIDOrder() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_all_docs")
            #expect(r.status == 200)
            #expect(r.ids == ["B", "_design/x", "a", "é"])
            #expect(r["total_rows"] == 4)
            #expect(r["offset"] == 0)
            let a = r.rows[2]
            #expect(a["key"] == "a")
            #expect(a["value"]?["rev"] == .string(try f.store.document(DocumentID(unchecked: "a"))!.revision.description))
            #expect(a["doc"] == nil)
        }
    }

    @Test func theNodesOwnDocumentsAreNeitherListedNorCounted() async throws {
        let f = try fixture()
        for id in ["_ferry/members/x", "_ferry/access/rules/r"] {
            try f.store.put(DocumentID(id, allowReserved: true), body: ["type": "entry"])
        }
        #expect(try f.store.documentCount == 4)
        #expect(try f.store.info().documentCount == 4)
        try await f.test { c async throws in
            let all = try await c.get("/ferry/_all_docs")
            #expect(all.ids == ["B", "_design/x", "a", "é"])
            #expect(all["total_rows"] == 4)
            #expect(try await c.get("/ferry")["doc_count"] == 4)
            // `_ferry/` sorts between `_design/` and `a`: an offset past it does not count it.
            #expect(try await c.get("/ferry/_all_docs?startkey=%22a%22")["offset"] == 2)
            #expect(try await c.get("/ferry/_all_docs?startkey=%22_design/x%22&descending=true")["offset"] == 2)
        }
    }

    @Test func rangeOptionsBoundSkipAndLimitTheRows() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            #expect(try await c.get("/ferry/_all_docs?startkey=%22_%22").ids == ["_design/x", "a", "é"])
            #expect(try await c.get("/ferry/_all_docs?start_key=%22a%22&end_key=%22a%22").ids == ["a"])
            #expect(try await c.get("/ferry/_all_docs?endkey=%22a%22&inclusive_end=false").ids == ["B", "_design/x"])
            #expect(try await c.get("/ferry/_all_docs?descending=true").ids == ["é", "a", "_design/x", "B"])
            let desc = try await c.get("/ferry/_all_docs?descending=true&startkey=%22a%22&endkey=%22B%22&skip=1")
            #expect(desc.ids == ["_design/x", "B"])
            #expect(desc["offset"] == 2)
            let page = try await c.get("/ferry/_all_docs?startkey=%22_design/x%22&limit=1&skip=1")
            #expect(page.ids == ["a"])
            #expect(page["offset"] == 2)
            #expect(try await c.get("/ferry/_all_docs?startkey_docid=a").ids == ["a", "é"])  // a plain string
            #expect(try await c.get("/ferry/_all_docs?startkey=%22b%22&endkey=%22a%22").status == 400)
            #expect(try await c.get("/ferry/_all_docs?startkey=5").status == 400)
            #expect(try await c.get("/ferry/_all_docs?limit=abc").status == 400)
            #expect(try await c.get("/ferry/_all_docs?update_seq=true")["update_seq"] == 6)
        }
    }

    @Test func keysAnswerEachKeyInOrderWithNotFoundAndDeletedRows() async throws {
        let f = try fixture()
        let c1 = try f.store.document(DocumentID(unchecked: "c"))!.revision.description
        try await f.test { c async throws in
            let r = try await c.post("/ferry/_all_docs?include_docs=true", #"{"keys":["é","nope","c","a"]}"#)
            #expect(r.status == 200)
            #expect(r.rows.count == 4)
            #expect(r.rows[0]["doc"]?["id"] == "é")
            #expect(r.rows[1]["key"] == "nope")
            #expect(r.rows[1]["error"] == "not_found")
            #expect(r.rows[2]["value"] == ["rev": .string(c1), "deleted": true])
            #expect(r.rows[2]["doc"] == .null)
            #expect(r.rows[3]["id"] == "a")
            let get = try await c.get("/ferry/_all_docs?keys=%5B%22a%22,%22B%22%5D")
            #expect(get.ids == ["a", "B"])
            let inBody = try await c.post("/ferry/_all_docs", #"{"keys":["a"],"include_docs":true}"#)
            #expect(inBody.rows.map { $0["doc"]?["id"] } == ["a"])
            #expect(try await c.post("/ferry/_all_docs", #"{"keys":"a"}"#).status == 400)
            #expect(try await c.post("/ferry/_all_docs", #"{"keys":["a"],"startkey":"a"}"#).status == 400)
        }
    }

    @Test func includeDocsCarriesEachBody() async throws {
        let f = try fixture()
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_all_docs?include_docs=true&limit=2")
            #expect(r.rows.map { $0["doc"]?["id"] } == ["B", "_design/x"])
            #expect(r.rows[0]["doc"]?["_rev"] == r.rows[0]["value"]?["rev"])
        }
    }

    @Test func designDocsListsOnlyDesignDocuments() async throws {
        let f = try fixture()
        try f.put("_design/a", ["n": 1])
        try f.put("_designer", ["n": 1])
        try await f.test { c async throws in
            #expect(try await c.get("/ferry/_design_docs").ids == ["_design/a", "_design/x"])
            #expect(try await c.get("/ferry/_design_docs?descending=true").ids == ["_design/x", "_design/a"])
            #expect(try await c.get("/ferry/_design_docs?startkey=%22_design/b%22").ids == ["_design/x"])
            #expect(try await c.get("/ferry/_design_docs?endkey=%22z%22").ids == ["_design/a", "_design/x"])
        }
    }

    @Test func allDocsPagesThroughMoreRowsThanOnePage() async throws {
        let f = try DatabaseFixture()
        _ = try f.store.write { txn in
            for i in 0..<1_203 { try txn.put(DocumentID(unchecked: String(format: "d%05d", i)), body: ["i": .int(Int64(i))]) }
        }
        try await f.test { c async throws in
            let r = try await c.get("/ferry/_all_docs")
            #expect(r.rows.count == 1_203)
            #expect(r.ids == (0..<1_203).map { String(format: "d%05d", $0) })
            #expect(try await c.get("/ferry/_all_docs?skip=600&limit=2").ids == ["d00600", "d00601"])
            let changes = try await c.get("/ferry/_changes")
            #expect(changes.results.count == 1_203)
            #expect(changes["last_seq"] == 1_203)
        }
    }
}
