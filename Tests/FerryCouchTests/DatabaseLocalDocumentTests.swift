import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import Testing

@Suite struct DatabaseLocalDocumentTests {
    @Test func localDocumentRevisionsCountUpAndTheLastWriteWinsAsInCouchDB3() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            #expect(try await c.get("/ferry/_local/cp").status == 404)
            let created = try await c.put("/ferry/_local/cp", #"{"history":[1]}"#)
            #expect(created.status == 201)
            #expect(created.json == ["ok": true, "id": "_local/cp", "rev": "0-1"])
            let read = try await c.get("/ferry/_local/cp")
            #expect(read.json == ["_id": "_local/cp", "_rev": "0-1", "history": [1]])
            // No _rev: CouchDB 3 accepts it (client libraries write checkpoints that way).
            let unnamed = try await c.put("/ferry/_local/cp", #"{"history":[2]}"#)
            #expect(unnamed.status == 201)
            #expect(unnamed["rev"] == "0-2")
            let second = try await c.put("/ferry/_local/cp", #"{"_id":"_local/cp","_rev":"0-2","history":[3]}"#)
            #expect(second["rev"] == "0-3")
            // A stale _rev is no conflict either; the counter never goes back.
            let stale = try await c.put("/ferry/_local/cp", #"{"_rev":"0-1","history":[4]}"#)
            #expect(stale.status == 201)
            #expect(stale["rev"] == "0-4")
            #expect(try await c.put("/ferry/_local/cp", #"{"_rev":"2-abc"}"#).status == 400)
            #expect(try await c.put("/ferry/_local/cp", #"{"_rev":"0-4","_bogus":1}"#).status == 400)
            #expect(try await c.get("/ferry/_local/cp")["history"] == [4])
            let deleted = try await c.delete("/ferry/_local/cp?rev=0-1")
            #expect(deleted.json == ["ok": true, "id": "_local/cp", "rev": "0-0"])
            #expect(try await c.get("/ferry/_local/cp").status == 404)
            #expect(try await c.delete("/ferry/_local/cp?rev=0-2").status == 404)
            #expect(try await c.put("/ferry/_local/cp", #"{"n":1}"#)["rev"] == "0-1")
        }
    }

    @Test func aReadOnlyUserKeepsCheckpointsButOnlyItsOwnAndBoundedInNumberAndSize() async throws {
        let f = try DatabaseFixture()
        let reader = CouchPrincipal.user(name: "reader", policy: PeerPolicy(read: .all, write: .none, mayDelete: false))
        let other = CouchPrincipal.user(name: "other", policy: PeerPolicy(read: .all, write: .none, mayDelete: false))
        try await f.test(as: reader) { c async throws in
            // A replicator pulling from the node keeps its checkpoint here.
            #expect(try await c.put("/ferry/_local/cp", #"{"history":[1]}"#).status == 201)
            #expect(try await c.put("/ferry/_local/cp", #"{"history":[2]}"#).status == 201)
            #expect(try await c.put("/ferry/_local/big", "{\"x\":\"" + String(repeating: "x", count: 70_000) + "\"}").status == 413)
            for i in 1..<100 { #expect(try await c.put("/ferry/_local/n\(i)", #"{"n":1}"#).status == 201) }
            #expect(try await c.put("/ferry/_local/one-too-many", #"{"n":1}"#).status == 403)
            #expect(try await c.put("/ferry/_local/n1", #"{"n":2}"#).status == 201)
        }
        try await f.test(as: other) { c async throws in
            #expect(try await c.get("/ferry/_local/cp")["history"] == [2])
            #expect(try await c.put("/ferry/_local/cp", #"{"history":[666]}"#).status == 403)
            #expect(try await c.delete("/ferry/_local/cp").status == 403)
            #expect(try await c.put("/ferry/_local/mine", #"{"n":1}"#).status == 201)
        }
        try await f.test(as: .admin) { c async throws in
            #expect(try await c.get("/ferry/_local/cp")["history"] == [2])
            #expect(try await c.delete("/ferry/_local/cp").status == 200)
        }
    }

    @Test func localDocsListsARestrictedUserOnlyWhatItCouldReadOneByOneInEveryForm() async throws {
        let f = try DatabaseFixture()
        let ward = { (name: String, type: String) in
            CouchPrincipal.user(name: name, policy: PeerPolicy(read: AccessRule(types: [type]), write: AccessRule(types: [type])))
        }
        let nurseA = ward("nurse-a", "a")
        let nurseB = ward("nurse-b", "b")
        try await f.test { c async throws in
            #expect(try await c.put("/ferry/_local/admin-cp", #"{"secret":"admin-only"}"#).status == 201)
        }
        try await f.test(as: nurseA) { c async throws in
            for id in ["a-cp", "a-cp2"] { #expect(try await c.put("/ferry/_local/\(id)", #"{"secret":"ward-a"}"#).status == 201) }
        }
        try await f.test(as: nurseB) { c async throws in
            for id in ["b-cp", "b-cp2"] { #expect(try await c.put("/ferry/_local/\(id)", #"{"mine":"ward-b"}"#).status == 201) }
            // The one predicate: each row listed is a document GET would answer, and no other.
            for id in ["admin-cp", "a-cp", "a-cp2"] { #expect(try await c.get("/ferry/_local/\(id)").status == 404) }
            let all = try await c.get("/ferry/_local_docs?include_docs=true")
            #expect(all.status == 200)
            #expect(all.rows.map { $0["id"] } == ["_local/b-cp", "_local/b-cp2"], "\(all.text)")
            #expect(all.rows.map { $0["doc"]?["mine"] } == ["ward-b", "ward-b"])
            #expect(all["total_rows"] == .null && all["offset"] == .null)
            let keyed = try await c.post(
                "/ferry/_local_docs", #"{"keys":["_local/a-cp","_local/admin-cp","_local/b-cp"],"include_docs":true}"#)
            #expect(keyed.rows == [
                ["key": "_local/a-cp", "error": "not_found"], ["key": "_local/admin-cp", "error": "not_found"],
                ["id": "_local/b-cp", "key": "_local/b-cp", "value": ["rev": "0-1"],
                 "doc": ["_id": "_local/b-cp", "_rev": "0-1", "mine": "ward-b"]],
            ], "\(keyed.text)")
            let keyedGet = try await c.get("/ferry/_local_docs?include_docs=true&keys=%5B%22_local%2Fa-cp%22%5D")
            #expect(keyedGet.rows == [["key": "_local/a-cp", "error": "not_found"]], "\(keyedGet.text)")
            let one = try await c.get("/ferry/_local_docs?include_docs=true&key=%22_local%2Fadmin-cp%22")
            #expect(one.rows == [["key": "_local/admin-cp", "error": "not_found"]], "\(one.text)")
            // Pages and ranges skip over hidden documents as if they were absent.
            let paged = try await c.get("/ferry/_local_docs?include_docs=true&skip=1&limit=5")
            #expect(paged.rows.map { $0["id"] } == ["_local/b-cp2"], "\(paged.text)")
            let ranged = try await c.get("/ferry/_local_docs?include_docs=true&startkey=%22_local%2Fa%22&endkey=%22_local%2Fb-cp%22")
            #expect(ranged.rows.map { $0["id"] } == ["_local/b-cp"], "\(ranged.text)")
            let down = try await c.post("/ferry/_local_docs", #"{"descending":true,"limit":1,"include_docs":true}"#)
            #expect(down.rows.map { $0["id"] } == ["_local/b-cp2"], "\(down.text)")
            for answer in [all, keyed, keyedGet, one, paged, ranged, down] {
                #expect(!answer.text.contains("admin-only") && !answer.text.contains("ward-a"), "\(answer.text)")
            }
        }
        // Whoever reads everything lists everything, as GET serves it.
        try await f.test { c async throws in
            let all = try await c.get("/ferry/_local_docs")
            #expect(all.rows.map { $0["id"] } == ["_local/a-cp", "_local/a-cp2", "_local/admin-cp", "_local/b-cp", "_local/b-cp2"])
            let ranged = try await c.get("/ferry/_local_docs?startkey=%22_local%2Fb%22&descending=true")
            #expect(ranged.rows.map { $0["id"] } == ["_local/admin-cp", "_local/a-cp2", "_local/a-cp"], "\(ranged.text)")
        }
        let reader = CouchPrincipal.user(name: "reader", policy: PeerPolicy(read: .all, write: .none, mayDelete: false))
        try await f.test(as: reader) { c async throws in
            #expect(try await c.get("/ferry/_local_docs").rows.count == 5)
            #expect(try await c.get("/ferry/_local/a-cp").status == 200)
        }
    }

    @Test func deletingALocalDocumentWithoutARevisionSucceedsAsInCouchDB3() async throws {
        let f = try DatabaseFixture()
        try await f.test { c async throws in
            #expect(try await c.put("/ferry/_local/cp", #"{"n":1}"#).status == 201)
            let deleted = try await c.delete("/ferry/_local/cp")
            #expect(deleted.status == 200)
            #expect(deleted.json == ["ok": true, "id": "_local/cp", "rev": "0-0"])
            #expect(try await c.get("/ferry/_local/cp").status == 404)
            #expect(try await c.delete("/ferry/_local/cp").status == 404)
        }
    }

    @Test func localDocumentsAreKeptApartFromFerrysOwnLocalDocuments() async throws {
        let f = try DatabaseFixture()
        try f.store.putLocalDocument("checkpoint/x", body: ["seq": 7])
        try await f.test { c async throws in
            #expect(try await c.get("/ferry/_local/checkpoint/x").status == 404)
            #expect(try await c.put("/ferry/_local/checkpoint/x", #"{"seq":1}"#).status == 201)
            #expect(try f.store.localDocument("checkpoint/x") == ["seq": 7])
            let list = try await c.get("/ferry/_local_docs?include_docs=true")
            #expect(list.rows.map { $0["id"] } == ["_local/checkpoint/x"])
            #expect(list.rows[0]["doc"]?["seq"] == 1)
        }
    }
}
