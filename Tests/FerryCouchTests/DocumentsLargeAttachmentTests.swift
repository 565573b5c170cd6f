import FerryCore
import FerryStore
import Foundation
import HTTPTypes
import NIOCore
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

/// Attachments larger than a request may be: standalone PUTs and `multipart/related` parts
/// stream into the blob store, GETs stream out of it, with ranges.
@Suite struct DocumentsLargeAttachmentTests {
    static func content(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) } }

    @Test func anAttachmentPutLargerThanTheRequestBoundIsStreamedAndServedBackWithRanges() async throws {
        // A 1 MiB request bound; the attachment is 3 MiB.
        let f = try CouchFixture(maxRequestBytes: 1 << 20)
        let bytes = Self.content(3 << 20 + 3)
        try await f.run { c in
            let put = try await c.send(.put, "/ferry/doc/big.bin", headers: [.contentType: "application/octet-stream"], bytes: bytes)
            #expect(put.status == .created, "\(put.text)")
            let whole = try await c.get("/ferry/doc/big.bin")
            #expect(whole.status == .ok)
            #expect(whole.bytes == bytes)
            #expect(whole.headers[.contentLength] == String(bytes.count))
            let part = try await c.get("/ferry/doc/big.bin", headers: [.range: "bytes=1000000-"])
            #expect(part.status == .partialContent)
            #expect(part.bytes == Array(bytes[1_000_000...]))
            #expect(part.headers[.contentRange] == "bytes 1000000-\(bytes.count - 1)/\(bytes.count)")
            let doc = try await c.get("/ferry/doc")
            #expect(doc.json["_attachments"]?["big.bin"]?["length"]?.intValue == Int64(bytes.count))
            #expect(doc.json["_attachments"]?["big.bin"]?["digest"]?.stringValue == StoredAttachment.md5Digest(bytes))
        }
        #expect(try f.store.blobs.get(BlobDigest.of(bytes)) == bytes)
    }

    @Test func anAttachmentPutPastTheAttachmentLimitIs413AndStoresNothing() async throws {
        var f = try CouchFixture()
        f.database.maxAttachmentBytes = 1000
        let bytes = Self.content(5000)
        try await f.run { c in
            let put = try await c.send(.put, "/ferry/doc/a.bin", headers: [.contentType: "application/octet-stream"], bytes: bytes)
            #expect(put.status == .contentTooLarge)
            #expect(try await c.get("/ferry/doc").status == .notFound)
        }
        #expect(!f.store.blobs.has(BlobDigest.of(bytes)))
    }

    @Test func aMultipartDocumentWithAPartLargerThanTheRequestBoundIsAccepted() async throws {
        let f = try CouchFixture(maxRequestBytes: 1 << 20)
        let big = Self.content(3 << 20)
        let small = Array("hello".utf8)
        let doc: JSON = [
            "v": 1,
            "_attachments": [
                "big.bin": ["follows": true, "content_type": "application/octet-stream", "length": .int(Int64(big.count))],
                "small.txt": ["follows": true, "content_type": "text/plain", "length": .int(Int64(small.count))],
            ],
        ]
        let boundary = "abc123"
        let body = Multipart.write(
            [
                ([("Content-Type", "application/json")], doc.canonicalBytes),
                ([("Content-Disposition", "attachment; filename=\"big.bin\""), ("Content-Length", "\(big.count)")], big),
                ([("Content-Disposition", "attachment; filename=\"small.txt\"")], small),
            ], boundary: boundary)
        try await f.run { c in
            let put = try await c.send(
                .put, "/ferry/m", headers: [.contentType: "multipart/related; boundary=\"\(boundary)\""], bytes: body)
            #expect(put.status == .created, "\(put.text)")
            #expect(try await c.get("/ferry/m/big.bin").bytes == big)
            #expect(try await c.get("/ferry/m/small.txt").bytes == small)
        }
    }

    @Test func theStreamingMultipartReaderFindsTheSamePartsWhateverTheChunking() throws {
        let parts: [(headers: [(String, String)], body: [UInt8])] = [
            ([("Content-Type", "application/json")], Array(#"{"a":1}"#.utf8)),
            ([("Content-Disposition", "attachment; filename=\"x\"")], Self.content(70_000)),
            ([], Array("\r\n--ab almost a delimiter\r\n-".utf8)),
            ([("Content-Type", "text/plain")], []),
        ]
        let body = Multipart.write(parts, boundary: "abc")
        for size in [1, 2, 3, 7, 64, 4096, body.count] {
            var reader = MultipartStreamReader(boundary: "abc", maxFirstPartBytes: 1 << 20)
            var document: [UInt8]?
            var seen: [([String: String], [UInt8])] = []
            var i = 0
            while i < body.count {
                let chunk = ByteBuffer(bytes: body[i..<min(i + size, body.count)])
                try reader.feed(chunk) { event in
                    switch event {
                    case .document(let d): document = d
                    case .begin(let h): seen.append((h, []))
                    case .bytes(let b): seen[seen.count - 1].1 += Array(b.readableBytesView)
                    case .end: break
                    }
                }
                i += size
            }
            try reader.finish()
            #expect(document == parts[0].body, "chunk size \(size)")
            #expect(seen.map(\.1) == parts.dropFirst().map(\.body), "chunk size \(size)")
            #expect(seen.first?.0["content-disposition"] == "attachment; filename=\"x\"")
        }
    }

    @Test func aMultipartBodyCutShortIsRefused() throws {
        let body = Multipart.write([([("Content-Type", "application/json")], Array("{}".utf8)), ([], Self.content(100))], boundary: "abc")
        var reader = MultipartStreamReader(boundary: "abc", maxFirstPartBytes: 1 << 20)
        try reader.feed(ByteBuffer(bytes: body.dropLast(10))) { _ in }
        #expect(throws: CouchError.self) { try reader.finish() }
    }
}
