import FerryCore
import FerryStore
import Foundation
import Hummingbird
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

/// What CouchDB's own replicator and the CouchDB client libraries rely on.
@Suite struct CompatibilityTests {
    /// gzip of `{"_id":"gz","n":1}`.
    static let gzippedDocument: [UInt8] = [
        0x1f, 0x8b, 0x8, 0x0, 0x0, 0x0, 0x0, 0x0, 0x2, 0x3, 0xab, 0x56, 0x8a, 0xcf, 0x4c, 0x51, 0xb2, 0x52, 0x4a,
        0xaf, 0x52, 0xd2, 0x51, 0xca, 0x53, 0xb2, 0x32, 0xac, 0x5, 0x0, 0x2b, 0x61, 0xc9, 0xff, 0x12, 0x0, 0x0, 0x0,
    ]
    /// gzip of `{"pad":"aaaa…"}` (5,011 bytes decoded, 53 encoded).
    static let gzippedLargeDocument: [UInt8] = [
        0x1f, 0x8b, 0x8, 0x0, 0x0, 0x0, 0x0, 0x0, 0x2, 0x3, 0xed, 0xc1, 0x41, 0xd, 0x0, 0x30, 0x8, 0x4, 0x30, 0x2f,
        0x27, 0x3, 0x37, 0x24, 0x13, 0xb0, 0xff, 0x32, 0xef, 0xa8, 0xe0, 0xd7, 0xf6, 0xe5, 0xf6, 0x49, 0xa5, 0x1, 0x0,
        0x0, 0x0, 0x80, 0x75, 0xf9, 0x3, 0x2b, 0xbf, 0xce, 0xc3, 0x92, 0x13, 0x0, 0x0,
    ]

    static func gzipHeaders() -> HTTPFields {
        var h = HTTPFields()
        h[.contentType] = "application/json"
        h[.contentEncoding] = "gzip"
        return h
    }

    /// Views and the other JavaScript handlers answer that they are not supported, not
    /// that an attachment is missing; a design document's real attachment still reads.
    @Test func aViewOrOtherJavaScriptHandlerIsNotImplemented() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let design: JSON = ["views": ["by": ["map": "function(d){emit(d._id)}"]]]
            #expect(try await c.send(.put, "/ferry/_design/app", json: design).status == .created)
            for path in ["/ferry/_design/app/_view/by", "/ferry/_design/app/_show/s/doc", "/ferry/_design/app/_list/l/by"] {
                let r = try await c.get(path)
                #expect(r.status == .notImplemented, "\(path): \(r.status) \(r.text)")
                #expect(r.json["error"] == "not_implemented")
                #expect(r.json["reason"]?.stringValue?.contains("_find") == true, "\(r.text)")
            }
            #expect(try await c.get("/ferry/_design/app/logo.png").status == .notFound)
        }
    }

    @Test func aGzipEncodedRequestBodyIsDecoded() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let put = try await c.send(.put, "/ferry/gz", headers: Self.gzipHeaders(), bytes: Self.gzippedDocument)
            #expect(put.status == .created, "\(put.text)")
            let got = try await c.get("/ferry/gz")
            #expect(got.json["n"] == 1)
        }
    }

    @Test func aGzipBodyDecodingPastTheLimitIsTooLargeAndStoresNothing() async throws {
        let f = try CouchFixture(maxRequestBytes: 1000)
        try await f.run { c in
            let before = try storeSnapshot(f.store)
            let put = try await c.send(.put, "/ferry/big", headers: Self.gzipHeaders(), bytes: Self.gzippedLargeDocument)
            #expect(put.status == .contentTooLarge)
            #expect(put.json["error"] == "too_large")
            #expect(try storeSnapshot(f.store) == before)
        }
    }

    @Test func aCorruptGzipBodyIsABadRequest() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            var corrupt = Self.gzippedDocument
            corrupt[corrupt.count - 6] ^= 0xFF  // the CRC no longer matches
            let put = try await c.send(.put, "/ferry/gz", headers: Self.gzipHeaders(), bytes: corrupt)
            #expect(put.status == .badRequest)
            #expect(put.json["error"] == "bad_request")
            let truncated = Array(Self.gzippedDocument.prefix(20))
            #expect(try await c.send(.put, "/ferry/gz", headers: Self.gzipHeaders(), bytes: truncated).status == .badRequest)
            #expect(try await c.get("/ferry/gz").status == .notFound)
        }
    }

    @Test func anUnknownContentEncodingIsUnsupported() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            var h = HTTPFields()
            h[.contentType] = "application/json"
            h[.contentEncoding] = "br"
            let put = try await c.send(.put, "/ferry/x", headers: h, bytes: Array(#"{"n":1}"#.utf8))
            #expect(put.status == .unsupportedMediaType)
            #expect(try await c.get("/ferry/x").status == .notFound)
        }
    }

    static func encoded(_ revs: [String]) -> String {
        let list = "[" + revs.map { "\"\($0)\"" }.joined(separator: ",") + "]"
        return list.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
    }

    /// The JSON part and attachment parts of each revision of a `multipart/mixed` answer.
    static func mixedRevisions(_ reply: CouchReply) throws -> [(json: JSON, attachments: [[UInt8]])] {
        let outer = try Multipart.parse(reply.bytes, boundary: Multipart.boundary(of: reply.headers[.contentType] ?? "")!)
        return try outer.map { part in
            let type = part.headers["content-type"] ?? ""
            guard type.hasPrefix("multipart/related") else { return (try JSON.parse(part.body), []) }
            let inner = try Multipart.parse(part.body, boundary: Multipart.boundary(of: type)!)
            return (try JSON.parse(inner[0].body), inner.dropFirst().map(\.body))
        }
    }

    @Test func openRevsAsMultipartSendsAttachmentBodiesWithoutTheAttachmentsOption() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let first = try await c.put(
                "a", ["_attachments": ["one.txt": ["content_type": "text/plain", "data": .string(base64("first"))]]])
            let second = try await c.put(
                "a",
                [
                    "_rev": .string(first),
                    "_attachments": [
                        "one.txt": ["stub": true],
                        "two.txt": ["content_type": "text/plain", "data": .string(base64("second"))],
                    ],
                ])
            // As CouchDB's replicator asks: no `attachments=true`.
            let all = try await c.get(
                "/ferry/a?revs=true&latest=true&open_revs=\(Self.encoded([second]))", headers: [.accept: "multipart/mixed"])
            #expect(all.status == .ok)
            let revisions = try Self.mixedRevisions(all)
            #expect(revisions.count == 1)
            #expect(revisions.first?.json["_attachments"]?["one.txt"]?["follows"] == true)
            #expect(revisions.first?.json["_attachments"]?["two.txt"]?["follows"] == true)
            #expect(revisions.first?.attachments == [Array("first".utf8), Array("second".utf8)])
            // With `atts_since`, only the newer attachment's body follows; the older is a stub.
            let since = try await c.get(
                "/ferry/a?revs=true&latest=true&open_revs=\(Self.encoded([second]))&atts_since=\(Self.encoded([first]))",
                headers: [.accept: "multipart/mixed"])
            let newer = try Self.mixedRevisions(since)
            #expect(newer.first?.json["_attachments"]?["one.txt"]?["stub"] == true)
            #expect(newer.first?.json["_attachments"]?["two.txt"]?["follows"] == true)
            #expect(newer.first?.attachments == [Array("second".utf8)])
            // As JSON, without `attachments=true`, they stay stubs.
            let json = try await c.get(
                "/ferry/a?open_revs=\(Self.encoded([second]))", headers: [.accept: "application/json"])
            guard case .array(let items) = json.json else {
                Issue.record("open_revs as JSON is not an array: \(json.text)")
                return
            }
            #expect(items.first?["ok"]?["_attachments"]?["two.txt"]?["stub"] == true)
        }
    }

    @Test func openRevsOfAMissingDocumentListsEachRevisionAsMissing() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let reply = try await c.get(
                "/ferry/nothere?open_revs=\(Self.encoded(["1-abc", "2-def"]))", headers: [.accept: "application/json"])
            #expect(reply.status == .ok)
            #expect(reply.json == [["missing": "1-abc"], ["missing": "2-def"]])
            let mixed = try await c.get(
                "/ferry/nothere?open_revs=\(Self.encoded(["1-abc"]))", headers: [.accept: "multipart/mixed"])
            #expect(mixed.status == .ok)
            #expect(try Self.mixedRevisions(mixed).map(\.json) == [["missing": "1-abc"]])
            #expect(try await c.get("/ferry/nothere?open_revs=all").status == .notFound)
        }
    }

    @Test func aReadOfAnEscapedDesignDocumentIDIsRedirectedToTheDesignPath() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            _ = try await c.put("_design/x", ["language": "javascript"])
            let reply = try await c.get("/ferry/_design%2Fx?revs=true")
            #expect(reply.status == .movedPermanently)
            #expect(reply.headers[.location] == "/ferry/_design/x?revs=true")
            let attachment = try await c.get("/ferry/_design%2fx/a.txt")
            #expect(attachment.headers[.location] == "/ferry/_design/x/a.txt")
            // Writes through the escaped form name the same design document.
            let rev = try await c.get("/ferry/_design/x").json["_rev"]!
            let put = try await c.send(.put, "/ferry/_design%2Fx", json: ["_rev": rev, "language": "query"])
            #expect(put.status == .created, "\(put.text)")
            #expect(try await c.get("/ferry/_design/x").json["language"] == "query")
        }
    }

    @Test func anAttachmentReplicatedWithoutRevposIsSentWhenBodiesAreAskedFor() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            // CouchDB keeps revpos 0 for an attachment written with new_edits=false and no
            // revpos, and its replicator passes that 0 on.
            let rev = "1-" + String(repeating: "ab", count: 16)
            let bulk = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: [
                    "new_edits": false,
                    "docs": [
                        [
                            "_id": "r", "_rev": .string(rev),
                            "_attachments": [
                                "c.txt": ["content_type": "text/plain", "revpos": 0, "data": .string(base64("conflict"))]
                            ],
                        ]
                    ],
                ])
            #expect(bulk.status == .created, "\(bulk.text)")
            let stub = try await c.get("/ferry/r")
            #expect(stub.json["_attachments"]?["c.txt"]?["revpos"] == 0)
            let inline = try await c.get("/ferry/r?attachments=true")
            #expect(inline.json["_attachments"]?["c.txt"]?["data"] == .string(base64("conflict")))
            let mixed = try await c.get(
                "/ferry/r?revs=true&latest=true&open_revs=\(Self.encoded([rev]))", headers: [.accept: "multipart/mixed"])
            let revisions = try Self.mixedRevisions(mixed)
            #expect(revisions.first?.json["_attachments"]?["c.txt"]?["follows"] == true)
            #expect(revisions.first?.attachments == [Array("conflict".utf8)])
        }
    }

    /// Writes `doc` with one gzip-encoded attachment part as CouchDB's replicator does,
    /// digest taken of the encoded bytes.
    static func putReplicatedGzip(_ c: CouchClient, id: String, text: String, level: Int32) async throws -> String {
        let identity = Array(text.utf8)
        let encoded = Gzip.encode(identity, level: level)!
        let rev = "1-" + String(repeating: "cd", count: 16)
        let doc: JSON = [
            "_id": .string(id), "_rev": .string(rev),
            "_attachments": [
                "t.txt": [
                    "content_type": "text/plain", "revpos": 1, "digest": .string(StoredAttachment.md5Digest(encoded)),
                    "length": .int(Int64(identity.count)), "follows": true, "encoding": "gzip",
                    "encoded_length": .int(Int64(encoded.count)),
                ]
            ],
        ]
        let boundary = "b0undary"
        let body = Multipart.write(
            [([("Content-Type", "application/json")], doc.canonicalBytes),
             ([("Content-Disposition", "attachment; filename=\"t.txt\""), ("Content-Type", "text/plain"),
               ("Content-Encoding", "gzip")], encoded)],
            boundary: boundary)
        let put = try await c.send(
            .put, "/ferry/\(id)?new_edits=false", headers: [.contentType: "multipart/related; boundary=\"\(boundary)\""],
            bytes: body)
        #expect(put.status == .created, "\(put.text)")
        return StoredAttachment.md5Digest(encoded)
    }

    @Test func gzipStoredContentFromCouchDBGoesOutGzipEncodedWithTheDigestItCameWith() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let text = String(repeating: "compressible text ", count: 50)
            let digest = try await Self.putReplicatedGzip(c, id: "g", text: text, level: 8)
            let reply = try await c.get("/ferry/g?revs=true&open_revs=all&latest=true", headers: [.accept: "multipart/mixed"])
            let outer = try Multipart.parse(reply.bytes, boundary: Multipart.boundary(of: reply.headers[.contentType]!)!)
            let inner = try Multipart.parse(outer[0].body, boundary: Multipart.boundary(of: outer[0].headers["content-type"]!)!)
            let att = try JSON.parse(inner[0].body)["_attachments"]?["t.txt"]
            #expect(att?["digest"] == .string(digest))
            #expect(att?["encoding"] == "gzip")
            #expect(att?["length"] == .int(Int64(text.utf8.count)))
            #expect(StoredAttachment.md5Digest(inner[1].body) == digest)
            #expect(inner[1].headers["content-encoding"] == "gzip")
            #expect(Gzip.decode(inner[1].body, limit: 1 << 20) == Array(text.utf8))
            // A stub keeps the digest as CouchDB gave it.
            #expect(try await c.get("/ferry/g").json["_attachments"]?["t.txt"]?["digest"] == .string(digest))
        }
    }

    @Test func gzipStoredContentThatCannotBeReencodedAlikeGoesOutAsIdentityWithItsOwnDigest() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let text = String(repeating: "other compressible text ", count: 50)
            let digest = try await Self.putReplicatedGzip(c, id: "h", text: text, level: 1)
            let reply = try await c.get("/ferry/h?revs=true&open_revs=all&latest=true", headers: [.accept: "multipart/mixed"])
            let outer = try Multipart.parse(reply.bytes, boundary: Multipart.boundary(of: reply.headers[.contentType]!)!)
            let inner = try Multipart.parse(outer[0].body, boundary: Multipart.boundary(of: outer[0].headers["content-type"]!)!)
            let att = try JSON.parse(inner[0].body)["_attachments"]?["t.txt"]
            #expect(att?["digest"] == .string(StoredAttachment.md5Digest(Array(text.utf8))))
            #expect(att?["digest"] != .string(digest))
            #expect(att?["encoding"] == nil)
            #expect(inner[1].body == Array(text.utf8))
        }
    }
}

extension CompatibilityTests {
    @Test func inlineContentWithTheDigestOfCouchDBsGzipFormIsAcceptedAndTheDigestKept() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            // What a server answers for gzip-kept content with attachments=true: identity
            // bytes inline, the digest of CouchDB's gzip form.
            let text = Array(String(repeating: "inline text ", count: 40).utf8)
            let gzipDigest = StoredAttachment.md5Digest(Gzip.encode(text)!)
            let rev = "1-" + String(repeating: "ef", count: 16)
            let bulk = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: [
                    "new_edits": false,
                    "docs": [
                        [
                            "_id": "i", "_rev": .string(rev),
                            "_attachments": [
                                "t.txt": [
                                    "content_type": "text/plain", "revpos": 1, "digest": .string(gzipDigest),
                                    "data": .string(Data(text).base64EncodedString()),
                                ]
                            ],
                        ]
                    ],
                ])
            #expect(bulk.status == .created, "\(bulk.text)")
            #expect(!bulk.text.contains("error"), "\(bulk.text)")
            #expect(try await c.get("/ferry/i").json["_attachments"]?["t.txt"]?["digest"] == .string(gzipDigest))
            // Any other digest is still refused, and nothing is stored.
            let other = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: [
                    "new_edits": false,
                    "docs": [
                        [
                            "_id": "k", "_rev": .string(rev),
                            "_attachments": [
                                "t.txt": [
                                    "content_type": "text/plain", "revpos": 1,
                                    "digest": .string(StoredAttachment.md5Digest(Array("other".utf8))),
                                    "data": .string(Data(text).base64EncodedString()),
                                ]
                            ],
                        ]
                    ],
                ])
            #expect(other.text.contains("error"), "\(other.text)")
            #expect(try await c.get("/ferry/k").status == .notFound)
        }
    }
}
