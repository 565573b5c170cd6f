import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import Testing

@Suite struct DatabaseEndpointTests {
    @Test func welcomeNamesACouchDB3VersionAndFerryAsVendor() async throws {
        let f = try DatabaseFixture()
        try await f.test(as: nil) { c async throws in
            let a = try await c.get("/")
            #expect(a.status == 200)
            #expect(a["couchdb"] == "Welcome")
            #expect(a["version"]?.stringValue?.hasPrefix("3.") == true)
            #expect(a["vendor"]?["name"] == "Ferry")
            #expect(a["uuid"] == "test-uuid")
            #expect(try await c.get("/_up")["status"] == "ok")
        }
    }

    @Test func allDbsListsTheOneDatabaseThroughItsOptions() async throws {
        let f = try DatabaseFixture(name: "garden")
        try await f.test { c async throws in
            #expect(try await c.get("/_all_dbs").json == ["garden"])
            #expect(try await c.get("/_all_dbs?limit=0").json == [])
            #expect(try await c.get("/_all_dbs?skip=1").json == [])
            #expect(try await c.get("/_all_dbs?startkey=%22h%22").json == [])
            #expect(try await c.get("/_all_dbs?startkey=%22h%22&descending=true").json == ["garden"])
            #expect(try await c.get("/_all_dbs?limit=x").status == 400)
        }
        try await f.test(as: nil) { c async throws in #expect(try await c.get("/_all_dbs").status == 401) }
    }

    @Test func databaseInfoCountsLiveAndDeletedDocumentsWithoutLocalOnes() async throws {
        let f = try DatabaseFixture()
        let rev = try f.put("a", ["n": 1])
        try f.put("b", ["n": 2])
        try f.store.delete(DocumentID(unchecked: "a"), revision: rev)
        try await f.test { c async throws in
            _ = try await c.put("/ferry/_local/x", #"{"k":1}"#)
            let info = try await c.get("/ferry")
            #expect(info.status == 200)
            #expect(info["db_name"] == "ferry")
            #expect(info["doc_count"] == 1)
            #expect(info["doc_del_count"] == 1)
            #expect(info["update_seq"] == 3)
            #expect(info["instance_start_time"] == "1700000000000000")
            #expect(info["compact_running"] == false)
            #expect(info["sizes"]?["file"]?.intValue != nil)
            let head = try await c.request(.head, "/ferry")
            #expect(head.status == 200)
            #expect(head.text.isEmpty)
        }
    }

    @Test func creatingTheNodesDatabaseAnswersFileExistsAndOtherNamesAreRefused() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            let existing = try await c.request(.put, "/ferry")
            #expect(existing.status == 412)
            #expect(existing.error == "file_exists")
            #expect(existing["reason"] == "The database could not be created, the file already exists.")
            let other = try await c.request(.put, "/other")
            #expect(other.status == 403)
            #expect(other["reason"]?.stringValue?.contains("one database") == true)
            #expect(try await c.delete("/ferry").status == 403)
            #expect(try await c.get("/ferry").status == 200)
            let missing = try await c.get("/other")
            #expect(missing.status == 404)
            #expect(missing.error == "not_found")
        }
    }

    @Test func unknownUnderscoreEndpointsAndMissingCredentialsAreRefused() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            let unknown = try await c.get("/ferry/_bogus")
            #expect(unknown.status == 400)
            #expect(unknown.error == "illegal_docid")
            #expect(try await c.get("/ferry/_revs_diff").status == 405)
        }
        try await f.test(as: nil) { c async throws in
            #expect(try await c.get("/ferry").status == 401)
            #expect(try await c.get("/ferry/_changes").status == 401)
            #expect(try await c.get("/ferry/_local/x").status == 401)
        }
    }

    @Test func ensureFullCommitAnswersCreatedWithTheInfosStartTime() async throws {
        let f = try DatabaseFixture()
        try f.put("a", ["n": 1])
        try await f.test { c async throws in
            let a = try await c.post("/ferry/_ensure_full_commit", "")
            #expect(a.status == 201)
            #expect(a["ok"] == true)
            #expect(a["instance_start_time"] == (try await c.get("/ferry"))["instance_start_time"])
        }
    }

    @Test func revsLimitIsTheStoresHistoryDepthAndAPutIsAcknowledged() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            #expect(try await c.get("/ferry/_revs_limit").json == .int(Int64(f.store.options.maxRevisionDepth)))
            #expect(try await c.put("/ferry/_revs_limit", "50")["ok"] == true)
            #expect(try await c.put("/ferry/_revs_limit", #""many""#).status == 400)
            #expect(try await c.put("/ferry/_revs_limit", "0").status == 400)
        }
        try await f.test(as: .user(name: "u", policy: .trusted)) { c async throws in
            #expect(try await c.put("/ferry/_revs_limit", "50").status == 401)
        }
    }

    @Test func revsDiffAnswersMissingRevisionsWithPossibleAncestors() async throws {
        let f = try DatabaseFixture()
        let r1 = try f.put("a", ["n": 1])
        let r2 = try f.put("a", ["n": 2], parent: r1)
        try f.put("b", ["n": 1])
        let b = try f.store.document(DocumentID(unchecked: "b"))!.revision.description
        let missing3 = "3-" + String(repeating: "a", count: 64)
        let missing1 = "1-" + String(repeating: "b", count: 64)
        try await f.test { c async throws in
            let body = #"{"a":["\#(r2)","\#(missing3)"],"b":["\#(b)"],"c":["\#(missing1)"]}"#
            let a = try await c.post("/ferry/_revs_diff", body)
            #expect(a.status == 200)
            #expect(a["a"]?["missing"] == [.string(missing3)])
            #expect(a["a"]?["possible_ancestors"] == [.string(r2.description)])
            #expect(a["b"] == nil)
            #expect(a["c"]?["missing"] == [.string(missing1)])
            #expect(a["c"]?["possible_ancestors"] == nil)
            // A missing revision no newer than the held leaf has no possible ancestors.
            let older = "1-" + String(repeating: "c", count: 64)
            let o = try await c.post("/ferry/_revs_diff", #"{"a":["\#(older)"]}"#)
            #expect(o["a"]?["missing"] == [.string(older)])
            #expect(o["a"]?["possible_ancestors"] == nil)
            #expect(try await c.post("/ferry/_revs_diff", #"{"a":["nope"]}"#).status == 400)
            #expect(try await c.post("/ferry/_revs_diff", #"{"a":"1-abc"}"#).status == 400)
            #expect(try await c.post("/ferry/_revs_diff", "[").status == 400)
        }
    }
}
