import FerryCore
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
