import FerryCore
import FerryStore
import Foundation
import Hummingbird
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

@Suite struct DocumentsMultipartTests {
    static func related(_ doc: JSON, _ parts: [(name: String?, bytes: [UInt8])], boundary: String = "abc123") -> [UInt8] {
        var out: [(headers: [(String, String)], body: [UInt8])] = [([("Content-Type", "application/json")], doc.canonicalBytes)]
        for p in parts {
            var h: [(String, String)] = [("Content-Type", "application/octet-stream")]
            if let name = p.name { h.append(("Content-Disposition", "attachment; filename=\"\(name)\"")) }
            out.append((h, p.bytes))
        }
        return Multipart.write(out, boundary: boundary)
    }

    @Test func parserSplitsPartsAndKeepsBinaryBytes() throws {
        let body = Self.related(["a": 1], [("x", [0x0D, 0x0A, 0x2D, 0x2D, 0x00]), (nil, [])])
        let parts = try Multipart.parse(body, boundary: "abc123")
        #expect(parts.count == 3)
        #expect(try JSON.parse(parts[0].body) == ["a": 1])
        #expect(parts[1].body == [0x0D, 0x0A, 0x2D, 0x2D, 0x00])
        #expect(Multipart.filename(parts[1].headers["content-disposition"]) == "x")
        #expect(parts[2].body.isEmpty)
        #expect(Multipart.boundary(of: "multipart/related; boundary=\"abc123\"") == "abc123")
    }

    @Test func parserRefusesMalformedBodies() {
        #expect(throws: CouchError.self) { try Multipart.parse(Array("no boundary here".utf8), boundary: "b") }
        #expect(throws: CouchError.self) { try Multipart.parse(Array("--b\r\nContent-Type: x\r\n\r\nunterminated".utf8), boundary: "b") }
        #expect(throws: CouchError.self) { try Multipart.parse(Array("--b\r\nno header end".utf8), boundary: "b") }
        #expect(throws: CouchError.self) { try Multipart.parse(Array("--b\r\nbad header\r\n\r\nx\r\n--b--".utf8), boundary: "b") }
    }

    @Test func multipartRelatedPutStoresFollowsAttachments() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let doc: JSON = [
                "v": 1,
                "_attachments": [
                    "one": ["follows": true, "content_type": "text/plain", "length": 3, "digest": .string(md5Digest("one"))],
                    "two": ["follows": true, "content_type": "text/plain", "length": 5],
                ],
            ]
            // "one" is matched by filename, "two" (no filename) by its digest-less length.
            let body = Self.related(doc, [("one", Array("one".utf8)), (nil, Array("twooo".utf8))])
            let reply = try await c.send(
                .put, "/ferry/m", headers: [.contentType: "multipart/related; boundary=\"abc123\""], bytes: body)
            #expect(reply.status == .created, "\(reply.text)")
            #expect(try await c.get("/ferry/m/one").text == "one")
            #expect(try await c.get("/ferry/m/two").text == "twooo")
        }
    }

    @Test func multipartWithAMissingPartIsRefusedAndNothingIsStored() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let doc: JSON = ["_attachments": ["one": ["follows": true, "content_type": "text/plain", "length": 3]]]
            let reply = try await c.send(
                .put, "/ferry/m", headers: [.contentType: "multipart/related; boundary=\"abc123\""], bytes: Self.related(doc, []))
            #expect(reply.status == .badRequest)
            let truncated = Array(Self.related(doc, [("one", Array("one".utf8))]).dropLast(12))
            let reply2 = try await c.send(.put, "/ferry/m", headers: [.contentType: "multipart/related; boundary=abc123"], bytes: truncated)
            #expect(reply2.status == .badRequest)
            #expect(try await c.get("/ferry/m").status == .notFound)
        }
    }

    @Test func openRevsWithMultipartMixedCarriesAttachmentBytes() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1, "_attachments": ["t.txt": ["content_type": "text/plain", "data": .string(base64("bytes"))]]])
            _ = try await c.put("plain", ["v": 1])
            let list = "[\"\(rev)\"]".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
            let reply = try await c.get(
                "/ferry/a?open_revs=\(list)&revs=true&attachments=true", headers: [.accept: "multipart/mixed"])
            let contentType = reply.headers[.contentType] ?? ""
            #expect(contentType.hasPrefix("multipart/mixed"))
            let outer = try Multipart.parse(reply.bytes, boundary: Multipart.boundary(of: contentType)!)
            #expect(outer.count == 1)
            let innerType = outer[0].headers["content-type"] ?? ""
            #expect(innerType.hasPrefix("multipart/related"))
            let inner = try Multipart.parse(outer[0].body, boundary: Multipart.boundary(of: innerType)!)
            #expect(inner.count == 2)
            let json = try JSON.parse(inner[0].body)
            #expect(json["_rev"] == .string(rev))
            #expect(json["_attachments"]?["t.txt"]?["follows"] == true)
            #expect(inner[1].body == Array("bytes".utf8))
            // A revision without attachments is a plain JSON part.
            let plain = try await c.get("/ferry/plain?open_revs=all", headers: [.accept: "multipart/mixed"])
            let parts = try Multipart.parse(plain.bytes, boundary: Multipart.boundary(of: plain.headers[.contentType]!)!)
            #expect(parts.count == 1 && parts[0].headers["content-type"] == "application/json")
        }
    }

    @Test func singleDocumentAsMultipartRelatedWhenAccepted() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            _ = try await c.put("a", ["_attachments": ["t": ["content_type": "text/plain", "data": .string(base64("x"))]]])
            let reply = try await c.get("/ferry/a?attachments=true", headers: [.accept: "multipart/related"])
            let type = reply.headers[.contentType] ?? ""
            #expect(type.hasPrefix("multipart/related"))
            let parts = try Multipart.parse(reply.bytes, boundary: Multipart.boundary(of: type)!)
            #expect(parts.count == 2 && parts[1].body == Array("x".utf8))
            // The multipart answer can be PUT back as it is.
            var doc = try JSON.parse(parts[0].body).objectValue!
            doc["v"] = 2
            var body = Self.related(.object(doc), [("t", parts[1].body)])
            let again = try await c.send(.put, "/ferry/a", headers: [.contentType: "multipart/related; boundary=abc123"], bytes: body)
            #expect(again.status == .created, "\(again.text)")
            body.removeAll()
        }
    }

    @Test func replicatorStyleMultipartPutWithNewEditsFalseKeepsStubsAndDecodesGzip() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            // Generation 1 holds "keep.bin"; generation 2 arrives as CouchDB's replicator sends it:
            // multipart/related, new_edits=false, _revisions, a stub for what the target has and a
            // gzip-encoded part (gzip of "hello gzip world") for the new attachment.
            let r1 = try await c.put("a", ["_attachments": ["keep.bin": ["content_type": "application/x-k", "data": .string(base64("k"))]]])
            let stub = try await c.get("/ferry/a").json["_attachments"]!["keep.bin"]!
            let atts: JSON = [
                "keep.bin": stub,
                "t.txt": [
                    "content_type": "text/plain", "revpos": 2, "digest": .string(md5Digest("hello gzip world")), "length": 16,
                    "follows": true, "encoding": "gzip", "encoded_length": 36,
                ],
            ]
            let stored: JSON = [
                "v": 2,
                "@attachments": [
                    "keep.bin": [
                        "@type": "blob", "digest": .string(BlobDigest.of(Array("k".utf8)).description), "length": 1,
                        "contentType": "application/x-k", "md5": .string(md5Digest("k")), "revpos": 1,
                    ],
                    "t.txt": [
                        "@type": "blob", "digest": .string(BlobDigest.of(Array("hello gzip world".utf8)).description), "length": 16,
                        "contentType": "text/plain", "md5": .string(md5Digest("hello gzip world")), "revpos": 2,
                    ],
                ],
            ]
            let r2 = ferryRev(stored, parent: r1)
            let doc = replicated("a", r2, history: [r1], ["v": 2, "_attachments": atts])
            let gz = [UInt8](Data(base64Encoded: "H4sIAAAAAAACA8tIzcnJV0ivyixQKM8vykkBAGt96LcQAAAA")!)
            let reply = try await c.send(
                .put, "/ferry/a?new_edits=false", headers: [.contentType: "multipart/related; boundary=\"abc123\""],
                bytes: Self.related(doc, [("t.txt", gz)]))
            #expect(reply.status == .created, "\(reply.text)")
            #expect(reply.json["rev"] == .string(r2))
            #expect(try await c.get("/ferry/a/t.txt").text == "hello gzip world")
            #expect(try await c.get("/ferry/a/keep.bin").text == "k")
        }
    }

    @Test func bulkGetAnswersMultipartMixedWhenAccepted() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            _ = try await c.put("a", ["_attachments": ["t": ["content_type": "text/plain", "data": .string(base64("att"))]]])
            _ = try await c.put("b", ["v": 1])
            let reply = try await c.send(
                .post, "/ferry/_bulk_get?attachments=true&revs=true", json: ["docs": [["id": "a"], ["id": "b"], ["id": "zz"]]],
                headers: [.accept: "multipart/mixed"])
            let type = reply.headers[.contentType] ?? ""
            #expect(type.hasPrefix("multipart/mixed"))
            let parts = try Multipart.parse(reply.bytes, boundary: Multipart.boundary(of: type)!)
            #expect(parts.count == 3)
            #expect(parts[0].headers["content-type"]?.hasPrefix("multipart/related") == true)
            let inner = try Multipart.parse(parts[0].body, boundary: Multipart.boundary(of: parts[0].headers["content-type"]!)!)
            #expect(inner.count == 2 && inner[1].body == Array("att".utf8))
            #expect(try JSON.parse(parts[1].body)["_id"] == "b")
            #expect(parts[2].headers["content-type"] == "application/json; error=\"true\"")
            #expect(try JSON.parse(parts[2].body)["error"] == "not_found")
        }
    }

    @Test func openRevsMultipartCanBeWrittenToAnotherNodeAsItCame() async throws {
        // CouchDB's replicator pattern: read open_revs as multipart/mixed with atts_since the
        // target's revision, then PUT each multipart/related part with new_edits=false.
        let source = try CouchFixture()
        let target = try CouchFixture()
        let (first, parts) = try await source.run { c in
            let r1 = try await c.put("a", ["_attachments": ["old.txt": ["content_type": "text/plain", "data": .string(base64("old"))]]])
            let first = try await c.get("/ferry/a?revs=true&attachments=true").json
            var atts = try await c.get("/ferry/a").json["_attachments"]!.objectValue!
            atts["new.bin"] = ["content_type": "application/octet-stream", "data": .string(Data([0, 1, 2, 0x0D, 0x0A]).base64EncodedString())]
            _ = try await c.put("a", ["_rev": .string(r1), "v": 2, "_attachments": .object(atts)])
            let since = "[\"\(r1)\"]".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
            let reply = try await c.get(
                "/ferry/a?open_revs=all&revs=true&latest=true&attachments=true&atts_since=\(since)", headers: [.accept: "multipart/mixed"])
            return (first, try Multipart.parse(reply.bytes, boundary: Multipart.boundary(of: reply.headers[.contentType]!)!))
        }
        try await target.run { c in
            #expect(try await c.send(.post, "/ferry/_bulk_docs", json: ["new_edits": false, "docs": [first]]).json == [])
            #expect(parts.count == 1)
            let type = parts[0].headers["content-type"]!
            let put = try await c.send(.put, "/ferry/a?new_edits=false", headers: [.contentType: type], bytes: parts[0].body)
            #expect(put.status == .created, "\(put.text)")
            let doc = try await c.get("/ferry/a").json
            #expect(doc["_rev"]?.stringValue?.hasPrefix("2-") == true)
            #expect(doc["_attachments"]?["old.txt"]?["revpos"] == 1)
            #expect(try await c.get("/ferry/a/new.bin").bytes == [0, 1, 2, 0x0D, 0x0A])
        }
        let a = try DocumentID("a")
        let original = try source.store.document(a)!
        let copy = try target.store.document(a)!
        #expect(copy.revision == original.revision && copy.body == original.body)
    }
}
