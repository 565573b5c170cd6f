import Crypto
import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import HummingbirdCore
import HTTPTypes
import NIOCore

// Standalone attachments: `GET|HEAD|PUT|DELETE /{db}/{id}/{name}`.
extension CouchDatabase {
    /// `GET|HEAD|PUT|DELETE /{db}/{id}/{name}`.
    func attachment(_ request: Request, context: CouchRequestContext, docID: String, name: String) async throws -> Response {
        let principal = try context.requirePrincipal()
        switch request.method {
        case .get, .head: return try await readAttachment(request, principal: principal, rawID: docID, name: name)
        case .put, .delete: return try await writeAttachment(request, principal: principal, rawID: docID, name: name)
        default: throw CouchError.methodNotAllowed("GET,HEAD,PUT,DELETE")
        }
    }

    func readAttachment(_ request: Request, principal: CouchPrincipal, rawID: String, name: String) async throws -> Response {
        let id = try couchDocumentID(rawID, replicated: true)
        guard let tree = try store.revisionTree(id), let winner = tree.winner else { throw CouchError.notFound("missing") }
        try checkReadable(id, tree: tree, principal: principal)
        var revision = winner.id
        if let revText = try editRevision(
            query: request.uri.queryParameters.get("rev").map { String($0) }, ifMatch: request.headers[.ifMatch], body: nil)
        {
            revision = try parseRevision(revText)
            try checkReadable(id, revision: revision, tree: tree, principal: principal)
        } else if winner.deleted {
            throw CouchError.notFound("deleted")
        }
        guard let view = try view(of: id, revision: revision, in: tree) else { throw CouchError.notFound("missing") }
        let set = AttachmentSet(body: view.body, generation: revision.generation, blobs: store.blobs)
        guard let att = set.entries[name] else { throw CouchError.notFound("Document is missing attachment") }
        if case .deferred = store.blobs.state(att.blob), let fetch = fetchDeferredBlob {
            // Left for first read by a lazy policy: fetched now from a connected peer, or 503.
            do { _ = try await fetch(att.blob) } catch {
                throw CouchError(
                    .serviceUnavailable, "blob_unavailable",
                    "The content of this attachment is not fetched yet and no connected peer can send it; try again later.")
            }
        }
        guard let reader = try store.blobs.reader(att.blob) else {
            throw CouchError(.internalServerError, "missing_blob", "The content of this attachment is not on this node.")
        }
        let total = reader.length
        var headers = Self.rawContentHeaders
        headers[.contentType] = att.contentType
        headers[.eTag] = "\"\(att.md5Base64)\""
        headers[.couchContentMD5] = att.md5Base64
        headers[.cacheControl] = "must-revalidate"
        headers[.acceptRanges] = "bytes"
        var status = HTTPResponse.Status.ok
        var range: Range<Int64> = 0..<total
        if let header = request.headers[.range] {
            switch Self.byteRange(header, total: Int(total)) {
            case .whole: break
            case .part(let r):
                status = .partialContent
                range = Int64(r.lowerBound)..<Int64(r.upperBound)
                headers[.contentRange] = "bytes \(r.lowerBound)-\(r.upperBound - 1)/\(total)"
            case .unsatisfiable:
                var h = Self.rawContentHeaders
                h[.contentRange] = "bytes */\(total)"
                return Response(status: .rangeNotSatisfiable, headers: h, body: .init())
            }
        }
        headers[.contentLength] = String(range.count)
        if request.method == .head { return Response(status: status, headers: headers, body: .init()) }
        return Response(status: status, headers: headers, body: Self.streamedBody(reader, range: range, verify: range == 0..<total))
    }

    /// The headers of every answer that carries attachment bytes as they were stored (an
    /// attachment, a multipart document): as in CouchDB 3, content a user uploaded (HTML, SVG)
    /// opened in a browser runs sandboxed, in an opaque origin, so its scripts cannot use the
    /// reader's session cookie on this API; nor does the browser sniff it into another type.
    static var rawContentHeaders: HTTPFields {
        var h = HTTPFields()
        h[.contentSecurityPolicy] = "sandbox"
        h[.xContentTypeOptions] = "nosniff"
        return h
    }

    /// Bytes read from a blob file per write: memory holds about one chunk per response
    /// (the connection's backpressure makes a slow reader slow the reads).
    static let attachmentChunkBytes = 256 << 10

    /// A body that reads `range` of the blob a chunk at a time. The whole content is checked
    /// against its digest as it goes; a mismatch found at the end breaks the connection
    /// instead of finishing the answer, so the client never takes corrupt bytes for good ones.
    static func streamedBody(_ reader: BlobReader, range: Range<Int64>, verify: Bool) -> ResponseBody {
        ResponseBody(contentLength: Int(range.count)) { writer in
            var hasher = verify ? SHA256() : nil
            var offset = range.lowerBound
            while offset < range.upperBound {
                let want = Int(min(Int64(attachmentChunkBytes), range.upperBound - offset))
                let chunk = try reader.read(offset: offset, count: want)
                guard chunk.count == want else { throw StoreError.blobCorrupt(reader.digest) }
                hasher?.update(data: chunk)
                try await writer.write(ByteBuffer(bytes: chunk))
                offset += Int64(want)
            }
            if let hasher, BlobDigest(uncheckedHex: Hex.encode(hasher.finalize())) != reader.digest {
                throw StoreError.blobCorrupt(reader.digest)
            }
            try await writer.finish(nil)
        }
    }

    /// What a `Range` header asks of `total` bytes: one `bytes=` range is served (206);
    /// anything else (several ranges, other units, malformed) gets the whole content.
    enum ByteRangeRequest: Equatable {
        case whole
        case part(Range<Int>)
        case unsatisfiable
    }

    static func byteRange(_ header: String, total: Int) -> ByteRangeRequest {
        guard header.hasPrefix("bytes="), !header.contains(",") else { return .whole }
        let spec = header.dropFirst(6).split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false)
        guard spec.count == 2 else { return .whole }
        let first = spec[0].trimmingCharacters(in: .whitespaces)
        let last = spec[1].trimmingCharacters(in: .whitespaces)
        if first.isEmpty {
            guard let suffix = Int(last), suffix > 0 else { return .whole }
            guard total > 0 else { return .unsatisfiable }
            return .part(max(0, total - suffix)..<total)
        }
        guard let start = Int(first), start >= 0 else { return .whole }
        guard start < total else { return .unsatisfiable }
        if last.isEmpty { return .part(start..<total) }
        guard let end = Int(last), end >= start else { return .whole }
        return .part(start..<min(end + 1, total))
    }

    /// `PUT` adds or replaces the attachment, `DELETE` removes it; each makes a new revision.
    func writeAttachment(_ request: Request, principal: CouchPrincipal, rawID: String, name: String) async throws -> Response {
        let id = try couchDocumentID(rawID)
        try IncomingAttachment.checkName(name)
        let revText = try editRevision(
            query: request.uri.queryParameters.get("rev").map { String($0) }, ifMatch: request.headers[.ifMatch], body: nil)
        let isDelete = request.method == .delete
        let tree = try store.revisionTree(id)
        var parent: RevisionID?
        var fields: [String: JSON] = [:]
        var generation = 1
        if let revText {
            let rev = try parseRevision(revText)
            guard let tree, let r = tree.revision(rev), r.isLeaf, !r.deleted, let bytes = r.body else { throw CouchError.conflict() }
            parent = rev
            generation = rev.generation + 1
            fields = (try? JSON.parse(bytes))?.objectValue ?? [:]
        } else {
            if isDelete { throw CouchError.conflict() }
            if let w = tree?.winner {
                guard w.deleted else { throw CouchError.conflict() }
                generation = w.id.generation + 1
            }
        }
        var attachments = fields[StoredAttachment.bodyKey]?.objectValue ?? [:]
        if isDelete {
            guard attachments.removeValue(forKey: name) != nil else {
                throw CouchError.notFound("Document is missing attachment")
            }
        }
        // Who may write is judged on the document's own members, before any content is read.
        var user = fields
        user.removeValue(forKey: StoredAttachment.bodyKey)
        if let refusal = DocumentAccess(principal.policy).writeRefusal(
            id: id, body: .object(user), deleted: false, ancestors: parent.map { [$0] } ?? [], existing: tree)
        {
            throw CouchError.forbidden("You may not write document \(id): \(refusal).")
        }
        if !isDelete {
            let contentType = request.headers[.contentType] ?? StoredAttachment.defaultContentType
            let entry: StoredAttachment
            if Self.contentEncodings(request).isEmpty {
                // Streamed to the blob store as it arrives: memory stays flat whatever its size.
                entry = try await spoolAttachment(request.body, contentType: contentType, revpos: generation)
            } else {
                let bytes = Array(try await readBody(request).readableBytesView)
                entry = StoredAttachment(bytes: bytes, contentType: contentType, revpos: generation)
                try storeContents([bytes])
            }
            if let md5 = request.headers[.couchContentMD5], md5 != entry.md5Base64 {
                throw CouchError.badRequest("Content-MD5 does not match the attachment's content")
            }
            attachments[name] = entry.json
        }
        if attachments.isEmpty { fields.removeValue(forKey: StoredAttachment.bodyKey) } else {
            fields[StoredAttachment.bodyKey] = .object(attachments)
        }
        let edit = PreparedEdit(id: id, parent: parent, deleted: false, body: .object(fields))
        let rev: RevisionID
        do { rev = try store.write { txn throws(StoreError) in try apply(edit, in: txn) } } catch { throw couchError(error) }
        var response = writeAnswer(id: rawID, rev: rev)
        if isDelete { response.status = .ok }
        return response
    }
}

extension HTTPField.Name {
    /// `Content-MD5`: the base64 MD5 of an attachment's bytes, as CouchDB sends and checks it.
    static let couchContentMD5 = HTTPField.Name("Content-MD5")!
}
