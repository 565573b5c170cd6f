import FerryCore
import FerryStore
import FerrySync
import Foundation
import Testing

@testable import FerryCouch

/// The CouchDB API's doors judged by `DocumentAccess`: writes by what they replace, reads by
/// every revision served, no blob through a digest alone, no `_ferry/` writes, no offsets
/// over hidden documents.
@Suite struct DocumentsAccessTests {
    static let noteUser = CouchPrincipal.user(
        name: "u", policy: PeerPolicy(read: AccessRule(types: ["note"]), write: AccessRule(types: ["note"]), mayDelete: false))

    @Test func aTypeRestrictedUserCannotOverwriteADocumentOfAnotherType() async throws {
        let f = try CouchFixture()
        let secret = try f.store.put(DocumentID("patients/2"), body: ["type": "secret", "pin": "4711"])
        try await f.run(as: Self.noteUser) { c in
            let child = try await c.send(.put, "/ferry/patients%2F2?rev=\(secret)", json: ["type": "note"])
            #expect(child.status == .forbidden)
            // A branch of higher generation, as a replicator would write it.
            let branch: JSON = [
                "_id": "patients/2", "_rev": "3-cccccccccccccccccccccccccccccccc", "type": "note",
                "_revisions": ["start": 3, "ids": ["cccccccccccccccccccccccccccccccc", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]],
            ]
            let bulk = try await c.send(.post, "/ferry/_bulk_docs", json: ["docs": [branch], "new_edits": false])
            #expect(bulk.json.arrayItems.first?["error"] == "forbidden")
            let put = try await c.send(.put, "/ferry/patients%2F2?new_edits=false", json: branch)
            #expect(put.status == .forbidden)
        }
        #expect(try f.store.document(DocumentID("patients/2"))?.revision == secret)
        #expect(try f.store.revisionTree(DocumentID("patients/2"))?.leaves.count == 1)
    }

    @Test func changesTellARestrictedReaderNoPendingCount() async throws {
        let f = try CouchFixture()
        for i in 0..<5 { _ = try f.store.put(DocumentID("secret-\(i)"), body: ["type": "secret"]) }
        _ = try f.store.put(DocumentID("note-1"), body: ["type": "note"])
        try await f.run(as: Self.noteUser) { c in
            let page = try await c.get("/ferry/_changes?limit=1")
            #expect(page.json["pending"] == nil, "\(page.text)")
            #expect(page.json["last_seq"] != nil)
        }
        try await f.run { c in
            // The admin reads everything: it is told what follows, as CouchDB does.
            let page = try await c.get("/ferry/_changes?limit=1")
            #expect(page.json["pending"] == 5, "\(page.text)")
        }
    }

    @Test func openRevsShowsNoLeafOfADocumentWithAnUnreadableLeaf() async throws {
        let f = try CouchFixture()
        _ = try f.store.put(DocumentID("patients/2"), body: ["type": "secret", "pin": "4711"])
        // A winning note branch, written by someone allowed to.
        try await f.run { c in
            let branch: JSON = [
                "_id": "patients/2", "_rev": "3-cccccccccccccccccccccccccccccccc", "type": "note",
                "_revisions": ["start": 3, "ids": ["cccccccccccccccccccccccccccccccc", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]],
            ]
            let put = try await c.send(.put, "/ferry/patients%2F2?new_edits=false", json: branch)
            #expect(put.status == .created)
        }
        try await f.run(as: Self.noteUser) { c in
            let all = try await c.get("/ferry/patients%2F2?open_revs=all")
            #expect(!all.text.contains("4711"))
            #expect(try await c.get("/ferry/patients%2F2").status == .notFound)
            #expect(try await c.get("/ferry/patients%2F2?conflicts=true").status == .notFound)
            let listed = try await c.get("/ferry/_all_docs")
            #expect(!listed.text.contains("patients/2"))
            let bulk = try await c.send(.post, "/ferry/_bulk_get", json: ["docs": [["id": "patients/2"]]])
            #expect(!bulk.text.contains("4711"))
            let found = try await c.send(.post, "/ferry/_find", json: ["selector": ["type": "note"], "conflicts": true])
            #expect(found.status == .ok)
            #expect(!found.text.contains("patients/2"), "\(found.text)")
        }
    }

    @Test func allDocsOffsetAndTotalCountOnlyReadableDocuments() async throws {
        let f = try CouchFixture()
        for id in ["a", "b-hidden", "c", "d-hidden", "e"] { _ = try f.store.put(DocumentID(id), body: [:]) }
        let user = CouchPrincipal.user(name: "u", policy: PeerPolicy(read: AccessRule(idPatterns: ["a", "c", "e"])))
        try await f.run(as: user) { c in
            let page = try await c.get("/ferry/_all_docs?startkey=%22e%22&limit=0")
            #expect(page.json["offset"] == 2)
            #expect(page.json["total_rows"] == 3)
            // Probing between two hidden IDs says nothing of them.
            let probe1 = try await c.get("/ferry/_all_docs?startkey=%22b%22&limit=0").json["offset"]
            let probe2 = try await c.get("/ferry/_all_docs?startkey=%22b-z%22&limit=0").json["offset"]
            #expect(probe1 == probe2)
        }
    }

    @Test func aRestrictedUserCannotReadABlobItKnowsOnlyByDigest() async throws {
        let f = try CouchFixture()
        let ref = try f.store.blobs.put(Array("x-ray of patient 2".utf8))
        _ = try f.store.put(DocumentID("patients/2"), body: ["type": "secret", "scan": ref.json])
        try await f.run(as: Self.noteUser) { c in
            let steal = try await c.send(.put, "/ferry/notes%2Fsteal", json: ["type": "note", "scan": ref.json])
            #expect(steal.status == .forbidden)
            // With the content itself (an inline attachment), it is its own to refer to.
            let data = Data("x-ray of patient 2".utf8).base64EncodedString()
            let own = try await c.send(
                .put, "/ferry/notes%2Fown",
                json: ["type": "note", "_attachments": ["scan": ["content_type": "image/png", "data": .string(data)]]])
            #expect(own.status == .created)
        }
    }

    @Test func nothingIsWrittenUnderFerrysOwnNamespace() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let doc: JSON = ["_id": "_ferry/hidden", "_rev": "1-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "x": 1]
            let bulk = try await c.send(.post, "/ferry/_bulk_docs", json: ["docs": [doc], "new_edits": false])
            #expect(bulk.json.arrayItems.first?["error"] == "forbidden")
            let put = try await c.send(.put, "/ferry/_ferry%2Fhidden?new_edits=false", json: doc)
            #expect(put.status != .created)
        }
        #expect(try f.store.document(try DocumentID("_ferry/hidden", allowReserved: true)) == nil)
    }
}
