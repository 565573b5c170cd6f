import FerryCore
import FerryStore
import Foundation

/// A document as a CouchDB client sends it, with the reserved `_` members taken out and
/// checked; `fields` holds only the user's members.
package struct CouchDocumentInput {
    package var id: String?
    package var rev: String?
    package var deleted = false
    /// `_revisions`: the generation of `_rev` and the hashes of its history, newest first.
    package var revisions: (start: Int, ids: [String])?
    package var fields: [String: JSON] = [:]
    /// `_attachments`, nil when the document has no such member.
    package var attachments: [String: IncomingAttachment]?

    /// Members CouchDB accepts on input and ignores.
    package static let ignoredMembers: Set<String> = ["_conflicts", "_deleted_conflicts", "_revs_info", "_local_seq"]

    package init(parsing value: JSON) throws(CouchError) {
        guard let object = value.objectValue else {
            throw .badRequest("Document must be a JSON object")
        }
        for (key, v) in object {
            if !key.hasPrefix("_") {
                if key == StoredAttachment.bodyKey {
                    throw CouchError(.badRequest, "doc_validation", "Bad document member: \(key) is reserved for attachments")
                }
                fields[key] = v
                continue
            }
            switch key {
            case "_id":
                guard let s = v.stringValue else { throw CouchError(.badRequest, "illegal_docid", "Document id must be a string") }
                id = s
            case "_rev":
                guard let s = v.stringValue else { throw .badRequest("Invalid rev format") }
                rev = s
            case "_deleted":
                guard let b = v.boolValue else { throw .badRequest("_deleted must be a boolean") }
                deleted = b
            case "_revisions":
                guard let r = v.objectValue, let start = r["start"]?.intValue, start >= 1, start <= Int64(Int32.max),
                    case .array(let list)? = r["ids"], !list.isEmpty
                else { throw .badRequest("_revisions must be {\"start\": N, \"ids\": [hash, …]} with N ≥ 1") }
                var ids: [String] = []
                for item in list {
                    guard let s = item.stringValue, !s.isEmpty else { throw .badRequest("_revisions ids must be strings") }
                    ids.append(s)
                }
                guard Int64(ids.count) <= start else { throw .badRequest("_revisions has more ids than its start generation") }
                revisions = (Int(start), ids)
            case "_attachments":
                guard let atts = v.objectValue else { throw .badRequest("_attachments must be an object") }
                var parsed: [String: IncomingAttachment] = [:]
                for (name, att) in atts { parsed[name] = try IncomingAttachment(name: name, parsing: att) }
                attachments = parsed
            default:
                if Self.ignoredMembers.contains(key) { continue }
                throw CouchError(.badRequest, "doc_validation", "Bad special document member: \(key)")
            }
        }
    }

    /// The revision history `_revisions` gives for `rev` (ancestors, newest first, without
    /// `rev` itself), or nil when there is none; 400 when it does not fit `rev`.
    package func history(for rev: String) throws(CouchError) -> [String]? {
        guard let revisions else { return nil }
        guard let dash = rev.firstIndex(of: "-"), let generation = Int(rev[..<dash]),
            generation == revisions.start, String(rev[rev.index(after: dash)...]) == revisions.ids[0]
        else { throw .badRequest("_revisions do not match _rev \(rev)") }
        return revisions.ids.dropFirst().enumerated().map { "\(revisions.start - 1 - $0.offset)-\($0.element)" }
    }
}

/// One `_attachments` entry as sent.
package enum IncomingAttachment {
    /// Already stored: the client names it by digest and revpos only.
    case stub(digest: String?, revpos: Int?)
    /// New content, inline (`data`) or in a MIME part (`follows`; `bytes` nil until matched).
    /// `encoding` is nil for identity bytes, `gzip` when the bytes are gzip-encoded.
    case content(bytes: [UInt8]?, contentType: String, length: Int64?, digest: String?, revpos: Int?, encoding: String?)
    /// New content that a `multipart/related` part streamed into the blob store already
    /// (identity bytes); `stored` has its digests, `digest` and `length` are what was declared.
    case spooled(stored: StoredAttachment, length: Int64?, digest: String?, revpos: Int?)

    package init(name: String, parsing value: JSON) throws(CouchError) {
        try Self.checkName(name)
        guard let f = value.objectValue else { throw .badRequest("Attachment \(name) must be an object") }
        var encoding: String?
        if let e = f["encoding"], f["stub"] != true {
            // CouchDB's replicator sends compressible attachments as it stores them, gzip-encoded.
            guard e == "gzip" else {
                throw CouchError(.unsupportedMediaType, "bad_content_type", "Attachment \(name): unsupported encoding \(e)")
            }
            encoding = "gzip"
        }
        let revpos = f["revpos"]?.intValue.map { Int($0) }
        let digest = f["digest"]?.stringValue
        if f["stub"] == true {
            self = .stub(digest: digest, revpos: revpos)
            return
        }
        let contentType = f["content_type"]?.stringValue ?? StoredAttachment.defaultContentType
        var length: Int64?
        if let l = f["length"] {
            guard let n = l.intValue, n >= 0 else { throw .badRequest("Attachment \(name): length must be a number") }
            length = n
        }
        if let data = f["data"] {
            guard let text = data.stringValue, let decoded = Data(base64Encoded: text) else {
                throw .badRequest("Invalid attachment data for \(name)")
            }
            self = .content(
                bytes: Array(decoded), contentType: contentType, length: length, digest: digest, revpos: revpos,
                encoding: encoding)
        } else if f["follows"] == true {
            self = .content(
                bytes: nil, contentType: contentType, length: length, digest: digest, revpos: revpos, encoding: encoding)
        } else {
            throw .badRequest("Attachment \(name) has neither data, stub nor follows")
        }
    }

    /// CouchDB's rule: a name is non-empty and does not start with `_`.
    package static func checkName(_ name: String) throws(CouchError) {
        if name.isEmpty { throw .badRequest("Attachment name can't be empty") }
        if name.hasPrefix("_") { throw .badRequest("Attachment name '\(name)' starts with prohibited character '_'") }
        if name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw .badRequest("Attachment name '\(name)' contains a control character")
        }
    }

    package var follows: Bool {
        if case .content(nil, _, _, _, _, _) = self { return true }
        return false
    }
}

/// Turns a CouchDB document into Ferry's stored body, deterministically: the same CouchDB
/// JSON (with the same attachment bytes) always yields the same body, because Ferry-form
/// revision IDs are verified against it.
package struct AttachmentResolver {
    package let docID: String
    /// The attachment a stub names: by name, matching the stub's digest when it gives one.
    package let lookup: (_ name: String, _ digest: String?) -> StoredAttachment?
    /// The generation of the revision being made: the revpos of new content.
    package let generation: Int
    /// With `new_edits=false`, the revpos a client sends is kept (it came from the revision's origin).
    package let keepGivenRevpos: Bool
    /// Largest decoded size of gzip-encoded content.
    package var maxDecodedBytes = 256 << 20

    package init(
        docID: String, lookup: @escaping (_ name: String, _ digest: String?) -> StoredAttachment?, generation: Int, keepGivenRevpos: Bool,
        maxDecodedBytes: Int = 256 << 20
    ) {
        self.docID = docID
        self.lookup = lookup
        self.generation = generation
        self.keepGivenRevpos = keepGivenRevpos
        self.maxDecodedBytes = maxDecodedBytes
    }

    /// The stored body and the attachment contents to put in the blob store before the write.
    package func storedBody(_ input: CouchDocumentInput) throws(CouchError) -> (body: JSON, blobs: [[UInt8]]) {
        var fields = input.fields
        guard let attachments = input.attachments, !attachments.isEmpty else { return (.object(fields), []) }
        let bodyBlobs = Set(((try? JSON.object(input.fields).blobReferences()) ?? []).map(\.digest))
        var stored: [String: JSON] = [:]
        var contents: [[UInt8]] = []
        for (name, att) in attachments.sorted(by: { $0.key < $1.key }) {
            // A stub that stands for one of the body's own blob references is not an attachment.
            if let digest = try? BlobDigest(name), name.hasPrefix("sha256-"), bodyBlobs.contains(digest) {
                if case .content(let bytes?, _, _, _, _, let encoding) = att, let bytes = try decoded(bytes, encoding, name: name, length: nil) {
                    guard BlobDigest.of(bytes) == digest else {
                        throw .badRequest("Attachment \(name): content does not match its sha256 name")
                    }
                    contents.append(bytes)
                }
                continue
            }
            switch att {
            case .stub(let digest, let revpos):
                guard var found = lookup(name, digest) else {
                    throw CouchError(.preconditionFailed, "missing_stub", "Invalid attachment stub in \(docID) for \(name)")
                }
                if keepGivenRevpos, let revpos { found.revpos = revpos }
                stored[name] = found.json
            case .spooled(var entry, let length, let digest, let revpos):
                if let length, length != entry.length {
                    throw .badRequest("Attachment \(name): length \(length) does not match its \(entry.length) bytes")
                }
                if let digest, digest.hasPrefix("md5-"), digest != entry.md5 {
                    throw .badRequest("Attachment \(name): content does not match its digest \(digest)")
                }
                entry.revpos = keepGivenRevpos ? (revpos ?? generation) : generation
                stored[name] = entry.json
            case .content(let sent, let contentType, let length, let digest, let revpos, let encoding):
                guard let sent else { throw .badRequest("Attachment \(name) says follows but no MIME part carries it") }
                guard let bytes = try decoded(sent, encoding, name: name, length: length) else { continue }
                if let length, length != Int64(bytes.count) {
                    throw .badRequest("Attachment \(name): length \(length) does not match its \(bytes.count) bytes")
                }
                var entry = StoredAttachment(
                    bytes: bytes, contentType: contentType,
                    revpos: keepGivenRevpos ? (revpos ?? generation) : generation)
                if let digest, digest.hasPrefix("md5-"), digest != entry.md5 {
                    // CouchDB gives content it keeps gzip-encoded the digest of the encoded bytes, and
                    // sends it so (or inline as identity bytes with that digest): kept as sent.
                    let sentEncoded = encoding != nil && digest == StoredAttachment.md5Digest(sent)
                    guard sentEncoded || Gzip.encode(bytes).map(StoredAttachment.md5Digest) == digest else {
                        throw .badRequest("Attachment \(name): content does not match its digest \(digest)")
                    }
                    entry.md5 = digest
                }
                stored[name] = entry.json
                contents.append(bytes)
            }
        }
        if !stored.isEmpty { fields[StoredAttachment.bodyKey] = .object(stored) }
        return (.object(fields), contents)
    }

    /// Identity bytes of sent content: gzip is decoded (at most `maxDecodedBytes`, and to
    /// exactly `length` when given).
    private func decoded(_ bytes: [UInt8], _ encoding: String?, name: String, length: Int64?) throws(CouchError) -> [UInt8]? {
        guard encoding == "gzip" else { return bytes }
        let limit = length.map { Int(min($0, Int64(maxDecodedBytes))) } ?? maxDecodedBytes
        guard let out = Gzip.decode(bytes, limit: limit) else {
            throw .badRequest("Attachment \(name): gzip content is invalid or larger than its length")
        }
        return out
    }
}
