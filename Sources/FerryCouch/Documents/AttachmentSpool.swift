import FerryCore
import FerryCouchDocuments
import FerryStore
import Foundation
import Hummingbird
import NIOCore

extension CouchDatabase {
    /// Streams an attachment's bytes from `body` into the blob store, hashing them (SHA-256
    /// for the blob, MD5 for CouchDB's digest) as they arrive; 413 past `maxAttachmentBytes`.
    /// Nothing is kept when the body breaks off.
    func spoolAttachment<Body: AsyncSequence>(_ body: Body, contentType: String, revpos: Int) async throws -> StoredAttachment
    where Body.Element == ByteBuffer {
        let writer = try BlobWriter(store: store.blobs, md5: true)
        do {
            for try await buffer in body {
                guard writer.length + Int64(buffer.readableBytes) <= maxAttachmentBytes else {
                    throw CouchError.tooLarge("Attachment is larger than \(maxAttachmentBytes) bytes.")
                }
                try buffer.withUnsafeReadableBytes { try writer.write($0) }
            }
            let md5 = writer.md5Digest ?? ""
            let reference = try writer.finish(contentType: contentType)
            return StoredAttachment(blob: reference.digest, length: reference.length, contentType: contentType, md5: md5, revpos: revpos)
        } catch {
            writer.discard()
            throw error
        }
    }
}

/// Takes the attachment parts of a `multipart/related` body as they stream in: a part stays
/// in memory up to `memoryBytes` (and while all such parts stay within `maxMemoryTotal`),
/// then moves to a `BlobWriter` and goes on streaming to disk.
final class MultipartSpool {
    /// One part's content, wherever it ended up.
    struct Part {
        enum Content {
            case bytes([UInt8])
            /// In the blob store; `md5` and `length` computed as it streamed.
            case stored(StoredAttachment)
        }
        var headers: [String: String]
        var content: Content

        var md5: String {
            switch content {
            case .bytes(let b): return StoredAttachment.md5Digest(b)
            case .stored(let s): return s.md5
            }
        }
        var length: Int64 {
            switch content {
            case .bytes(let b): return Int64(b.count)
            case .stored(let s): return s.length
            }
        }
    }

    /// Parts up to this size stay in memory (like inline attachments).
    static let memoryBytes = 1 << 20

    let blobs: BlobStore
    let maxMemoryTotal: Int
    let maxPartBytes: Int64
    private(set) var parts: [Part] = []
    private var headers: [String: String] = [:]
    private var memory: [UInt8] = []
    private var memoryTotal = 0
    private var writer: BlobWriter?
    /// Written since the part began (memory or file).
    private var length: Int64 = 0
    /// Stored parts, removed again when the body fails.
    private var stored: [BlobDigest] = []

    init(blobs: BlobStore, maxMemoryTotal: Int, maxPartBytes: Int64) {
        self.blobs = blobs
        self.maxMemoryTotal = maxMemoryTotal
        self.maxPartBytes = maxPartBytes
    }

    func begin(_ headers: [String: String]) throws {
        self.headers = headers
        memory = []
        length = 0
        writer = nil
        if let declared = headers["content-length"].flatMap({ Int64($0) }), declared > Int64(Self.memoryBytes) {
            writer = try BlobWriter(store: blobs, md5: true)
        }
    }

    func write(_ buffer: ByteBuffer) throws {
        length += Int64(buffer.readableBytes)
        guard length <= maxPartBytes else { throw CouchError.tooLarge("Attachment is larger than \(maxPartBytes) bytes.") }
        if writer == nil && (memory.count + buffer.readableBytes > Self.memoryBytes || memoryTotal + buffer.readableBytes > maxMemoryTotal) {
            let w = try BlobWriter(store: blobs, md5: true)
            try w.write(memory)
            memoryTotal -= memory.count
            memory = []
            writer = w
        }
        if let writer {
            try buffer.withUnsafeReadableBytes { try writer.write($0) }
        } else {
            memory.append(contentsOf: buffer.readableBytesView)
            memoryTotal += buffer.readableBytes
        }
    }

    func end() throws {
        if let writer {
            let md5 = writer.md5Digest ?? ""
            let reference = try writer.finish()
            self.writer = nil
            stored.append(reference.digest)
            let type = headers["content-type"] ?? StoredAttachment.defaultContentType
            parts.append(
                Part(headers: headers, content: .stored(StoredAttachment(blob: reference.digest, length: reference.length, contentType: type, md5: md5, revpos: 1))))
        } else {
            parts.append(Part(headers: headers, content: .bytes(memory)))
            memory = []
        }
    }

    /// The body failed: a part being written is thrown away (stored ones are left to blob collection).
    func discard() {
        writer?.discard()
        writer = nil
    }
}
