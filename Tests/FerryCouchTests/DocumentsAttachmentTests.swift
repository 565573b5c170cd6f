import FerryCore
import FerryStore
import Foundation
import Hummingbird
import Testing

@testable import FerryCouch

@Suite struct DocumentsAttachmentTests {
    @Test func inlineAttachmentIsServedAsAStubAndInlineOnRequest() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put(
                "a", ["v": 1, "_attachments": ["hello.txt": ["content_type": "text/plain", "data": .string(base64("hello"))]]])
            let doc = try await c.get("/ferry/a")
            #expect(
                doc.json["_attachments"]
                    == [
                        "hello.txt": [
                            "content_type": "text/plain", "digest": .string(md5Digest("hello")), "length": 5, "revpos": 1,
                            "stub": true,
                        ]
                    ])
            let inline = try await c.get("/ferry/a?attachments=true")
            #expect(inline.json["_attachments"]?["hello.txt"]?["data"] == .string(base64("hello")))
            #expect(inline.json["_attachments"]?["hello.txt"]?["stub"] == nil)
            #expect(inline.json["_rev"] == .string(rev))
        }
    }

    @Test func documentWithAttachmentsCopiedToAnotherNodeKeepsItsRevisionAndMetadata() async throws {
        let source = try CouchFixture()
        let target = try CouchFixture()
        let (full, stubbed) = try await source.run { c in
            let r1 = try await c.put(
                "a", ["_attachments": ["a.bin": ["content_type": "application/x-a", "data": .string(base64("one"))]]])
            var doc = try await c.get("/ferry/a").json.objectValue!
            doc["v"] = 2
            let r2 = try await c.put(
                "a",
                .object(
                    doc.merging(
                        [
                            "_attachments": .object(
                                doc["_attachments"]!.objectValue!.merging(
                                    ["b.txt": ["content_type": "text/plain", "data": .string(base64("two"))]]) { a, _ in a })
                        ]) { _, b in b }))
            #expect(r2.hasPrefix("2-") && r1.hasPrefix("1-"))
            return (
                try await c.get("/ferry/a?revs=true&attachments=true").json,
                try await c.get("/ferry/a").json["_attachments"]!
            )
        }
        #expect(stubbed["a.bin"]?["revpos"] == 1)
        #expect(stubbed["b.txt"]?["revpos"] == 2)
        try await target.run { c in
            let reply = try await c.send(.post, "/ferry/_bulk_docs", json: ["new_edits": false, "docs": [full]])
            #expect(reply.json == [], "\(reply.text)")
            let copy = try await c.get("/ferry/a")
            #expect(copy.json["_rev"] == full["_rev"])
            #expect(copy.json["_attachments"] == stubbed)
            let bytes = try await c.get("/ferry/a/b.txt")
            #expect(bytes.text == "two")
        }
    }

    @Test func couchDBDocumentWithAForeignRevisionRoundTripsUnchanged() async throws {
        let f = try CouchFixture()
        let rev = "1-" + String(repeating: "0123456789abcdef", count: 2)
        let attachment: JSON = [
            "content_type": "image/png", "digest": .string(md5Digest("png-bytes")), "length": 9, "revpos": 1,
            "data": .string(base64("png-bytes")),
        ]
        try await f.run { c in
            let reply = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: ["new_edits": false, "docs": [["_id": "p", "_rev": .string(rev), "x": 1, "_attachments": ["i.png": attachment]]]])
            let back = try await c.get("/ferry/p?attachments=true")
            #expect(reply.json == [])
            #expect(back.json == ["_id": "p", "_rev": .string(rev), "x": 1, "_attachments": ["i.png": attachment]])
        }
    }

    @Test func dataThatDoesNotMatchItsDigestOrLengthIsRefusedAndNothingIsStored() async throws {
        let f = try CouchFixture()
        let before = try storeSnapshot(f.store)
        try await f.run { c in
            let badDigest = try await c.send(
                .put, "/ferry/a",
                json: ["_attachments": ["x": ["content_type": "text/plain", "data": .string(base64("abc")), "digest": .string(md5Digest("abd"))]]])
            #expect(badDigest.status == .badRequest)
            let badLength = try await c.send(
                .put, "/ferry/a", json: ["_attachments": ["x": ["content_type": "text/plain", "data": .string(base64("abc")), "length": 4]]])
            #expect(badLength.status == .badRequest)
            let notBase64 = try await c.send(.put, "/ferry/a", json: ["_attachments": ["x": ["data": "***"]]])
            #expect(notBase64.status == .badRequest)
            let reservedName = try await c.send(.put, "/ferry/a", json: ["_attachments": ["_x": ["data": "eHg="]]])
            #expect(reservedName.status == .badRequest)
            let standaloneReserved = try await c.send(.put, "/ferry/a/_x", headers: [.contentType: "text/plain"], bytes: [1])
            #expect(standaloneReserved.status == .badRequest)
        }
        #expect(try storeSnapshot(f.store) == before)
    }

    @Test func stubForAnAttachmentTheParentLacksIsMissingStub() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1])
            let reply = try await c.send(
                .put, "/ferry/a", json: ["_rev": .string(rev), "_attachments": ["x": ["stub": true, "revpos": 1]]])
            #expect(reply.status == .preconditionFailed)
            #expect(reply.json["error"] == "missing_stub")
            #expect(try await c.get("/ferry/a").json["_rev"] == .string(rev))
        }
    }

    @Test func editWithoutAttachmentsDropsThemAndStubsKeepThem() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let r1 = try await c.put("a", ["_attachments": ["x": ["content_type": "text/plain", "data": .string(base64("x"))]]])
            let stubs = try await c.get("/ferry/a").json["_attachments"]!
            let r2 = try await c.put("a", ["_rev": .string(r1), "v": 2, "_attachments": stubs])
            #expect(try await c.get("/ferry/a").json["_attachments"] == stubs)
            _ = try await c.put("a", ["_rev": .string(r2), "v": 3])
            #expect(try await c.get("/ferry/a").json["_attachments"] == nil)
        }
    }

    @Test func attsSinceSendsOnlyNewerAttachmentContent() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let r1 = try await c.put("a", ["_attachments": ["old": ["content_type": "text/plain", "data": .string(base64("o"))]]])
            var atts = try await c.get("/ferry/a").json["_attachments"]!.objectValue!
            atts["new"] = ["content_type": "text/plain", "data": .string(base64("n"))]
            _ = try await c.put("a", ["_rev": .string(r1), "_attachments": .object(atts)])
            let since = "[\"\(r1)\"]".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
            let reply = try await c.get("/ferry/a?atts_since=\(since)")
            #expect(reply.json["_attachments"]?["old"]?["stub"] == true)
            #expect(reply.json["_attachments"]?["new"]?["data"] == .string(base64("n")))
        }
    }

    @Test func standaloneAttachmentPutGetHeadAndDelete() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let created = try await c.send(.put, "/ferry/doc/dir/f.txt", headers: [.contentType: "text/plain"], bytes: Array("content".utf8))
            #expect(created.status == .created)
            let r1 = created.json["rev"]!.stringValue!
            let got = try await c.get("/ferry/doc/dir/f.txt")
            #expect(got.text == "content")
            #expect(got.headers[.contentType] == "text/plain")
            let md5 = String(md5Digest("content").dropFirst(4))
            #expect(got.headers[.couchContentMD5] == md5)
            #expect(got.headers[.eTag] == "\"\(md5)\"")
            let part = try await c.get("/ferry/doc/dir/f.txt", headers: [.range: "bytes=2-4"])
            #expect(part.status == .partialContent && part.text == "nte")
            #expect(part.headers[.contentRange] == "bytes 2-4/7")
            #expect(try await c.get("/ferry/doc/dir/f.txt", headers: [.range: "bytes=-3"]).text == "ent")
            #expect(try await c.get("/ferry/doc/dir/f.txt", headers: [.range: "bytes=9-"]).status == .rangeNotSatisfiable)
            #expect(try await c.get("/ferry/doc/dir/f.txt", headers: [.range: "bytes=0-1,3-4"]).text == "content")
            let head = try await c.send(.head, "/ferry/doc/dir/f.txt")
            #expect(head.bytes.isEmpty && head.headers[.contentLength] == "7")
            let stale = try await c.send(.put, "/ferry/doc/g", headers: [.contentType: "text/plain"], bytes: [1])
            #expect(stale.status == .conflict)
            let second = try await c.send(
                .put, "/ferry/doc/g?rev=\(r1)", headers: [.contentType: "application/octet-stream"], bytes: [1, 2, 3])
            #expect(second.status == .created)
            let r2 = second.json["rev"]!.stringValue!
            #expect(try await c.get("/ferry/doc").json["_attachments"]?.objectValue?.keys.sorted() == ["dir/f.txt", "g"])
            let deleted = try await c.send(.delete, "/ferry/doc/dir/f.txt?rev=\(r2)")
            #expect(deleted.status == .ok)
            #expect(try await c.get("/ferry/doc/dir/f.txt").status == .notFound)
            #expect(try await c.get("/ferry/doc/g").bytes == [1, 2, 3])
        }
    }

    @Test func ferryBlobReferencesAreServedAsFetchableStubsAndDroppedOnTheWayIn() async throws {
        let f = try CouchFixture()
        let ref = try f.store.blobs.put(Array("blob!".utf8), contentType: "text/plain")
        let id = try DocumentID("b")
        let r1 = try f.store.put(id, body: ["photo": ref.json, "v": 1])
        try await f.run { c in
            let doc = try await c.get("/ferry/b")
            let name = ref.digest.description
            #expect(doc.json["_attachments"]?[name]?["revpos"] == 1)
            #expect(doc.json["_attachments"]?[name]?["digest"] == .string(md5Digest("blob!")))
            #expect(try await c.get("/ferry/b/\(name)").text == "blob!")
            var edited = doc.json.objectValue!
            edited["v"] = 2
            let r2 = try await c.put("b", .object(edited))
            #expect(r2.hasPrefix("2-"))
        }
        let stored = try f.store.document(id)!.body
        #expect(stored == ["photo": ref.json, "v": 2])
        _ = r1
    }

    @Test func gzipEncodedContentIsStoredAsIdentityBytes() async throws {
        // What CouchDB's replicator sends for a compressible attachment (gzip of "hello gzip world").
        let gz = "H4sIAAAAAAACA8tIzcnJV0ivyixQKM8vykkBAGt96LcQAAAA"
        let f = try CouchFixture()
        try await f.run { c in
            let reply = try await c.send(
                .put, "/ferry/a",
                json: [
                    "_attachments": [
                        "t.txt": [
                            "content_type": "text/plain", "data": .string(gz), "encoding": "gzip", "encoded_length": 36,
                            "length": 16, "digest": .string(md5Digest("hello gzip world")),
                        ]
                    ]
                ])
            #expect(reply.status == .created, "\(reply.text)")
            #expect(try await c.get("/ferry/a/t.txt").text == "hello gzip world")
            let stub = try await c.get("/ferry/a").json["_attachments"]?["t.txt"]
            #expect(stub?["length"] == 16 && stub?["encoding"] == nil)
            let lying = try await c.send(
                .put, "/ferry/b",
                json: ["_attachments": ["t": ["data": .string(gz), "encoding": "gzip", "length": 15]]])
            #expect(lying.status == .badRequest)
            let unknown = try await c.send(.put, "/ferry/b", json: ["_attachments": ["t": ["data": "eHg=", "encoding": "br"]]])
            #expect(unknown.status == .unsupportedMediaType)
            #expect(try await c.get("/ferry/b").status == .notFound)
        }
    }

    @Test func everyAnswerCarryingAttachmentBytesIsSandboxedAndNotSniffed() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let page = "<script>fetch('/ferry/_all_docs?include_docs=true')</script>"
            let rev = try await c.put(
                "page", ["_attachments": ["x.html": ["content_type": "text/html", "data": .string(base64(page))]]])
            func sandboxed(_ reply: CouchReply, _ what: String) {
                #expect(reply.headers[.contentSecurityPolicy] == "sandbox", "\(what): \(reply.headers)")
                #expect(reply.headers[.xContentTypeOptions] == "nosniff", "\(what): \(reply.headers)")
            }
            let got = try await c.get("/ferry/page/x.html")
            #expect(got.status == .ok && got.text == page && got.headers[.contentType] == "text/html")
            sandboxed(got, "GET")
            sandboxed(try await c.send(.head, "/ferry/page/x.html"), "HEAD")
            sandboxed(try await c.get("/ferry/page/x.html?rev=\(rev)"), "GET ?rev=")
            let part = try await c.get("/ferry/page/x.html", headers: [.range: "bytes=0-7"])
            #expect(part.status == .partialContent)
            sandboxed(part, "Range")
            sandboxed(try await c.get("/ferry/page/x.html", headers: [.range: "bytes=999-"]), "416")
            // The multipart forms carry the same bytes raw in a part.
            let related = try await c.get("/ferry/page?attachments=true", headers: [.accept: "multipart/related"])
            #expect(related.headers[.contentType]?.hasPrefix("multipart/related") == true && related.text.contains(page))
            sandboxed(related, "multipart/related")
            let mixed = try await c.get("/ferry/page?open_revs=all", headers: [.accept: "multipart/mixed"])
            #expect(mixed.headers[.contentType]?.hasPrefix("multipart/mixed") == true && mixed.text.contains(page))
            sandboxed(mixed, "open_revs multipart/mixed")
            let bulk = try await c.send(
                .post, "/ferry/_bulk_get?attachments=true", json: ["docs": [["id": "page"]]], headers: [.accept: "multipart/related"])
            #expect(bulk.text.contains(page), "\(bulk.text)")
            sandboxed(bulk, "_bulk_get multipart")
        }
    }
}
