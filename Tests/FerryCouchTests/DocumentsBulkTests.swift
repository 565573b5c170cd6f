import FerryCore
import FerryStore
import Foundation
import Hummingbird
import Testing

@testable import FerryCouch

@Suite struct DocumentsBulkTests {
    @Test func bulkDocsStoresEachValidDocumentAndReportsEachBadOne() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let existing = try await c.put("taken", ["v": 1])
            let reply = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: ["docs": [["_id": "a", "v": 1], ["_id": "taken", "v": 2], ["_id": "bad", "_foo": 1], ["v": 3]]])
            #expect(reply.status == .created)
            let items = reply.json.arrayItems
            #expect(items.count == 4)
            #expect(items[0]["ok"] == true && items[0]["id"] == "a" && items[0]["rev"]?.stringValue?.hasPrefix("1-") == true)
            #expect(items[1] == ["id": "taken", "error": "conflict", "reason": "Document update conflict."])
            #expect(items[2]["error"] == "doc_validation")
            #expect(items[3]["ok"] == true)
            #expect(try await c.get("/ferry/taken").json["_rev"] == .string(existing))
            #expect(try await c.get("/ferry/bad").status == .notFound)
        }
    }

    @Test func bulkDocsNeedsJSONAndADocsList() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let wrongType = try await c.send(.post, "/ferry/_bulk_docs", headers: [.contentType: "text/plain"], bytes: Array("{\"docs\":[]}".utf8))
            #expect(wrongType.status == .unsupportedMediaType)
            #expect(wrongType.json["error"] == "bad_content_type")
            let noDocs = try await c.send(.post, "/ferry/_bulk_docs", json: ["doc": []])
            #expect(noDocs.status == .badRequest)
            #expect(try await c.send(.get, "/ferry/_bulk_docs").status == .methodNotAllowed)
        }
    }

    @Test func newEditsFalseKeepsTheGivenHistory() async throws {
        let f = try CouchFixture()
        let b1: JSON = ["v": 1]
        let r1 = ferryRev(b1)
        let r2 = ferryRev(["v": 2], parent: r1)
        let r3 = ferryRev(["v": 3], parent: r2)
        try await f.run { c in
            let reply = try await c.send(
                .post, "/ferry/_bulk_docs", json: ["new_edits": false, "docs": [replicated("a", r3, history: [r2, r1], ["v": 3])]])
            #expect(reply.json == [])
            let doc = try await c.get("/ferry/a?revs=true")
            #expect(doc.json["_rev"] == .string(r3))
            #expect(doc.json["_revisions"] == ["start": 3, "ids": .array([r3, r2, r1].map { .string(hashPart($0)) })])
            let again = try await c.send(
                .post, "/ferry/_bulk_docs", json: ["new_edits": false, "docs": [replicated("a", r3, history: [r2, r1], ["v": 3])]])
            #expect(again.json == [])
        }
    }

    @Test func badRevisionsHistoryIsAPerDocumentErrorAndTheRestIsStored() async throws {
        let f = try CouchFixture()
        let r1 = ferryRev(["v": 1])
        let r2 = ferryRev(["v": 2], parent: r1)
        var mismatched = replicated("bad", r2, history: [r1], ["v": 2]).objectValue!
        mismatched["_revisions"] = ["start": 5, "ids": .array([.string(hashPart(r2))])]
        let mismatchedDoc = JSON.object(mismatched)
        try await f.run { c in
            let reply = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: [
                    "new_edits": false,
                    "docs": [
                        mismatchedDoc, ["_id": "nohist", "_rev": .string(r2), "v": 2], ["_id": "norev", "v": 1],
                        replicated("good", r1, history: [], ["v": 1]),
                    ],
                ])
            let errors = reply.json.arrayItems
            #expect(errors.map { $0["id"] } == ["bad", "nohist", "norev"])
            #expect(errors.allSatisfy { $0["error"] == "bad_request" })
            #expect(try await c.get("/ferry/good").status == .ok)
            #expect(try await c.get("/ferry/bad").status == .notFound)
        }
    }

    @Test func bulkGetAnswersEachRequestWithDocsOrErrors() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let r1 = try await c.put("a", ["v": 1, "_attachments": ["t": ["content_type": "text/plain", "data": .string(base64("t"))]]])
            let r2 = try await c.put("a", ["v": 2, "_rev": .string(r1)])
            let unknown = "1-" + String(repeating: "cd", count: 32)
            let reply = try await c.send(
                .post, "/ferry/_bulk_get?revs=true&attachments=true&latest=true",
                json: ["docs": [["id": "a", "rev": .string(r1)], ["id": "a"], ["id": "a", "rev": .string(unknown)], ["id": "zz"]]])
            #expect(reply.status == .ok)
            let results = reply.json["results"]!.arrayItems
            #expect(results.count == 4)
            #expect(results[0]["docs"]?.arrayItems.first?["ok"]?["_rev"] == .string(r2))  // latest
            #expect(results[1]["docs"]?.arrayItems.first?["ok"]?["_revisions"]?["start"] == 2)
            #expect(
                results[2]["docs"]?.arrayItems.first
                    == ["error": ["id": "a", "rev": .string(unknown), "error": "not_found", "reason": "missing"]])
            #expect(results[3]["docs"]?.arrayItems.first?["error"]?["error"] == "not_found")
            let old = try await c.send(.post, "/ferry/_bulk_get?attachments=true", json: ["docs": [["id": "a", "rev": .string(r1)]]])
            let doc = old.json["results"]?.arrayItems.first?["docs"]?.arrayItems.first?["ok"]
            #expect(doc?["_attachments"]?["t"]?["data"] == .string(base64("t")))
        }
    }

    @Test func bulkDocsDeletesWithDeletedTrueAndTheCurrentRevision() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1])
            let reply = try await c.send(.post, "/ferry/_bulk_docs", json: ["docs": [["_id": "a", "_rev": .string(rev), "_deleted": true]]])
            #expect(reply.json.arrayItems.first?["ok"] == true)
            #expect(try await c.get("/ferry/a").json == ["error": "not_found", "reason": "deleted"])
        }
    }

    @Test func renderDocumentGivesIncludeDocsTheCouchForm() async throws {
        let f = try CouchFixture()
        let id = try DocumentID("a")
        try await f.run { c in
            _ = try await c.put("a", ["v": 1, "_attachments": ["t": ["content_type": "text/plain", "data": .string(base64("t"))]]])
        }
        let document = try f.store.document(id)!
        var options = CouchRenderOptions()
        options.conflicts = true
        options.revs = true
        let json = try f.database.renderDocument(document, options: options)
        #expect(json["_id"] == "a" && json["v"] == 1 && json["@attachments"] == nil)
        #expect(json["_attachments"]?["t"]?["stub"] == true)
        #expect(json["_revisions"]?["start"] == 1)
        #expect(json["_conflicts"] == nil)
    }
}
