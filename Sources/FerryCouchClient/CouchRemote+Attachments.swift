import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import NIOCore

/// One attachment a pulled revision names by stub, fetched on its own: its stored entry,
/// and its bytes while they are held in memory (small ones, stored only once the revision
/// is accepted) — large ones went to the blob store as they arrived.
struct FetchedAttachment: Sendable {
    var attachment: StoredAttachment
    var bytes: [UInt8]?
}

/// What the attachment downloads of one connection share.
struct CouchDownloadState {
    /// Resume keys being written now (two fetches of one page may name the same content).
    var activeKeys: Set<String> = []
    /// Large attachments already streamed into the blob store this connection, by CouchDB
    /// digest and length, so that a second document naming them does not fetch them again.
    var stored: [String: StoredAttachment] = [:]
    /// Attachment GETs made and bytes received, and how many resumed a partial file.
    var requests = 0
    var bytes: Int64 = 0
    var resumed = 0
}

/// Collects a small download's bytes, refusing more than `limit`.
private final class Collector: Sendable {
    let lock = Locked<[UInt8]>([])
    let limit: Int64
    init(limit: Int64) { self.limit = limit }
    func add(_ buffer: ByteBuffer) throws {
        try lock.withLock { bytes in
            guard Int64(bytes.count + buffer.readableBytes) <= limit else {
                throw CouchClientError(.badResponse, message: "an attachment is longer than its stub says", isTransient: true)
            }
            bytes.append(contentsOf: buffer.readableBytesView)
        }
    }
    var bytes: [UInt8] { lock.withLock { $0 } }
}

// Attachments of pulled revisions, fetched as the CouchDB replicator's stubs allow: the
// revisions come with stubs (`attachments=false`), and each attachment this node lacks is
// fetched with its own `GET /{db}/{doc}/{name}?rev=…`, streamed. Small ones (up to
// `heldAttachmentBytes`) are held in memory until the puller asks for them, so a revision
// the trust boundary refuses leaves nothing behind; larger ones stream into the blob store
// through a resumable file keyed by their MD5 and length, which a later attempt continues
// with a `Range` request. A large attachment of a revision that is then refused stays in the
// blob store unreferenced until blob collection removes it.
extension CouchRemote {
    /// Attachments up to this size are held in memory; larger ones stream to disk.
    static let heldAttachmentBytes: Int64 = 1 << 20

    /// For each fetched item (by request index and item index), the attachments its stubs
    /// name that this node lacks, fetched now. One that cannot be fetched (gone from the
    /// server, or its bytes do not match its stub) is left out, and its revision is refused.
    func fetchAttachments(_ answers: [[JSON]], requests: [RevisionRequest], trees: [DocumentID: RevisionTree]) async throws
        -> [[Int]: [String: FetchedAttachment]]
    {
        var out: [[Int]: [String: FetchedAttachment]] = [:]
        for (index, items) in answers.enumerated() {
            let request = requests[index]
            for (n, item) in items.enumerated() {
                guard let doc = item["ok"], let atts = doc["_attachments"]?.objectValue, let revText = doc["_rev"]?.stringValue else { continue }
                let rawID = doc["_id"]?.stringValue ?? request.id.rawValue
                var fields = doc.objectValue ?? [:]
                for key in fields.keys where key.hasPrefix("_") { fields.removeValue(forKey: key) }
                let bodyBlobs = Set(((try? JSON.object(fields).blobReferences()) ?? []).map(\.digest))
                let generation = (try? RevisionID(revText))?.generation ?? 1
                for (name, entry) in atts.sorted(by: { $0.key < $1.key }) where entry["stub"] == true {
                    let digest = entry["digest"]?.stringValue
                    let length = entry["length"]?.intValue
                    // A stub for one of the body's own blob references: needed only when absent here.
                    let namedBlob = name.hasPrefix("sha256-") ? (try? BlobDigest(name)).flatMap { bodyBlobs.contains($0) ? $0 : nil } : nil
                    if let namedBlob {
                        if store.blobs.has(namedBlob) { continue }
                    } else if StoredAttachment.held(named: name, digest: digest, in: trees[request.id], blobs: store.blobs) != nil {
                        continue
                    }
                    let key = digest.flatMap { Self.resumeKey(md5: $0, length: length) }
                    if namedBlob == nil, let key, let known = downloadState.withLock({ $0.stored[key] }), store.blobs.has(known.blob) {
                        var att = known
                        att.contentType = entry["content_type"]?.stringValue ?? att.contentType
                        att.revpos = entry["revpos"]?.intValue.map { Int($0) } ?? generation
                        out[[index, n], default: [:]][name] = FetchedAttachment(attachment: att, bytes: nil)
                        continue
                    }
                    do {
                        let fetched = try await downloadAttachment(
                            docID: rawID, rev: revText, name: name, length: length, digest: digest,
                            encoded: entry["encoding"] != nil, contentType: entry["content_type"]?.stringValue,
                            revpos: entry["revpos"]?.intValue.map { Int($0) } ?? generation, resumeKey: key)
                        if let namedBlob, fetched?.attachment.blob != namedBlob {
                            throw AttachmentMismatch(reason: "its content does not match its sha256 name")
                        }
                        if let fetched { out[[index, n], default: [:]][name] = fetched }
                    } catch let e as AttachmentMismatch {
                        logger.warning(
                            "an attachment from the server does not match its stub",
                            metadata: ["doc": "\(rawID)", "rev": "\(revText)", "attachment": "\(name)", "reason": "\(e.reason)"])
                    }
                }
            }
        }
        return out
    }

    /// Why fetched bytes were not what the stub described (the revision is refused).
    struct AttachmentMismatch: Error {
        var reason: String
    }

    /// `couch-<md5 hex>-<length>`: names an attachment's content across documents and runs.
    static func resumeKey(md5 digest: String, length: Int64?) -> String? {
        guard let length, digest.hasPrefix("md5-"), let raw = Data(base64Encoded: String(digest.dropFirst(4))), raw.count == 16 else { return nil }
        return "couch-\(Hex.encode(Array(raw)))-\(length)"
    }

    /// `GET /{db}/{doc}/{name}?rev=…`, checked against the stub's length and (for content
    /// the server keeps as sent) its MD5; nil when the server no longer has it (404).
    func downloadAttachment(
        docID: String, rev: String, name: String, length: Int64?, digest: String?, encoded: Bool, contentType: String?, revpos: Int,
        resumeKey: String?
    ) async throws -> FetchedAttachment? {
        let path = http.databasePath(Self.documentSuffix(docID) + "/" + CouchEndpoint.escapeDatabase(name))
        let query = [("rev", rev)]
        let type = contentType ?? StoredAttachment.defaultContentType
        downloadState.withLock { $0.requests += 1 }
        // The MD5 the stored attachment keeps. A stub's is of the bytes as the server keeps
        // them: for gzip-encoded content (CouchDB's `encoding`, told by `att_encoding_info`)
        // that is not the content's. A Ferry-form revision was made with the content's own
        // MD5 (its ID hashes it), so it gets that back; any other keeps the server's.
        let ferryForm = (try? RevisionID(rev))?.isFerryDigest ?? false
        func keptMD5(stub: String?, computed: String?) -> String? {
            encoded && ferryForm ? computed ?? stub : stub ?? computed
        }
        func check(length got: Int64, md5: String?) throws {
            if let length, got != length { throw AttachmentMismatch(reason: "\(got) bytes arrived, the stub says \(length)") }
            // Content the server keeps gzip-encoded has the MD5 of the encoded bytes; only its length is checked.
            if !encoded, let digest, let md5, digest != md5 { throw AttachmentMismatch(reason: "its MD5 is \(md5), the stub says \(digest)") }
        }
        // Held attachments reach the store through the pull's blob transfer, which counts
        // them; a streamed one goes into the blob store here and is counted here.
        if let length, length <= Self.heldAttachmentBytes {
            let collector = Collector(limit: length)
            let response = try await http.download(path, query: query, headers: [("Accept", "*/*")]) { try collector.add($0) }
            if response.status == 404 { return nil }
            guard (200..<300).contains(response.status) else { throw CouchClientError.http(response, method: .GET, path: path, endpoint: http.endpoint) }
            let bytes = collector.bytes
            downloadState.withLock { $0.bytes += Int64(bytes.count) }
            try check(length: Int64(bytes.count), md5: StoredAttachment.md5Digest(bytes))
            var att = StoredAttachment(bytes: bytes, contentType: type, revpos: revpos)
            if let md5 = keptMD5(stub: digest, computed: att.md5) { att.md5 = md5 }
            return FetchedAttachment(attachment: att, bytes: bytes)
        }
        // Large: streamed to a file, resumed from what an earlier attempt left.
        let claimed = resumeKey.map { key in downloadState.withLock { $0.activeKeys.insert(key).inserted } } ?? false
        defer { if claimed, let resumeKey { _ = downloadState.withLock { $0.activeKeys.remove(resumeKey) } } }
        let writer = try BlobWriter(store: store.blobs, resumeKey: claimed ? resumeKey : nil, md5: true)
        var finished = false
        defer { if !finished { writer.suspend() } }
        if let length, writer.length > length { try writer.restart() }
        let start = writer.length
        if start > 0 { downloadState.withLock { $0.resumed += 1 } }
        if length == nil || start < length! {
            var headers = [("Accept", "*/*")]
            if start > 0 { headers.append(("Range", "bytes=\(start)-")) }
            let limit = length ?? Int64.max
            if let length { countBlob { $0.blobBytesToReceive += length - start } }
            let response = try await http.download(
                path, query: query, headers: headers,
                head: { status, headers in
                    // A server that ignores the range sends everything: start again.
                    if start > 0, status == 200 { try writer.restart() }
                    if status == 206, !(headers.first(name: "Content-Range") ?? "").hasPrefix("bytes \(start)-") {
                        throw CouchClientError(.badResponse, message: "GET \(path): the range answered is not the one asked", isTransient: true)
                    }
                }
            ) { chunk in
                guard writer.length + Int64(chunk.readableBytes) <= limit else {
                    throw CouchClientError(.badResponse, message: "GET \(path): more bytes than the stub's length", isTransient: true)
                }
                try chunk.withUnsafeReadableBytes { try writer.write($0) }
                self.countBlob { $0.blobBytesReceived += Int64(chunk.readableBytes) }
            }
            if response.status == 416 {
                // What is on disk does not fit the server's content: start again next time.
                writer.discard()
                finished = true
                throw CouchClientError(.badResponse, message: "GET \(path): the server refused to resume at \(start)", isTransient: true)
            }
            if response.status == 404 {
                writer.discard()
                finished = true
                return nil
            }
            guard (200..<300).contains(response.status) else { throw CouchClientError.http(response, method: .GET, path: path, endpoint: http.endpoint) }
            downloadState.withLock { $0.bytes += writer.length - start }
        }
        do { try check(length: writer.length, md5: writer.md5Digest) } catch {
            writer.discard()
            finished = true
            throw error
        }
        let md5 = writer.md5Digest
        let reference = try writer.finish(contentType: type)
        finished = true
        countBlob { $0.blobsReceived += 1 }
        let att = StoredAttachment(blob: reference.digest, length: reference.length, contentType: type, md5: keptMD5(stub: digest, computed: md5) ?? "", revpos: revpos)
        if let resumeKey { downloadState.withLock { $0.stored[resumeKey] = att } }
        return FetchedAttachment(attachment: att, bytes: nil)
    }
}
