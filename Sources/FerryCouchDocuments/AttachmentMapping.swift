import Crypto
import FerryCore
import FerryStore
import Foundation

/// One attachment as a stored Ferry body keeps it: a blob reference (so Ferry peers transfer
/// the bytes as they do any blob) plus what CouchDB clients must see again unchanged.
///
/// Stored under the body's `@attachments` member as
/// `{name: {"@type":"blob","digest":"sha256-…","length":N,"contentType":…,"md5":"md5-…","revpos":R}}`.
package struct StoredAttachment: Equatable, Sendable {
    package var blob: BlobDigest
    package var length: Int64
    package var contentType: String
    /// CouchDB's `digest`: `md5-` and the base64 of the content's MD5.
    package var md5: String
    package var revpos: Int

    /// The member of a stored body that holds the attachments (never a top-level `_` name:
    /// the store reserves those; `@` names are Ferry's, as `@type` is).
    package static let bodyKey = "@attachments"
    /// The content type CouchDB gives an attachment that names none.
    package static let defaultContentType = "application/octet-stream"

    package var json: JSON {
        .object([
            "@type": "blob", "digest": .string(blob.description), "length": .int(length),
            "contentType": .string(contentType), "md5": .string(md5), "revpos": .int(Int64(revpos)),
        ])
    }

    package init(blob: BlobDigest, length: Int64, contentType: String, md5: String, revpos: Int) {
        self.blob = blob
        self.length = length
        self.contentType = contentType
        self.md5 = md5
        self.revpos = revpos
    }

    /// The entry for `bytes` first attached at generation `revpos`.
    package init(bytes: [UInt8], contentType: String, revpos: Int) {
        self.init(
            blob: BlobDigest.of(bytes), length: Int64(bytes.count), contentType: contentType,
            md5: Self.md5Digest(bytes), revpos: revpos)
    }

    /// Reads a stored entry; nil for anything that is not one (stored bodies were checked on the way in).
    package init?(json: JSON) {
        guard let f = json.objectValue, f["@type"] == "blob", let d = f["digest"]?.stringValue,
            let blob = try? BlobDigest(d), let length = f["length"]?.intValue
        else { return nil }
        self.init(
            blob: blob, length: length, contentType: f["contentType"]?.stringValue ?? Self.defaultContentType,
            md5: f["md5"]?.stringValue ?? "", revpos: Int(f["revpos"]?.intValue ?? 1))
    }

    /// CouchDB's digest of `bytes`.
    package static func md5Digest(_ bytes: [UInt8]) -> String {
        "md5-" + Data(Insecure.MD5.hash(data: bytes)).base64EncodedString()
    }

    /// CouchDB's digest of a stored blob, read a chunk at a time (never whole); nil when
    /// the blob is absent or unreadable.
    package static func md5Digest(of digest: BlobDigest, in blobs: BlobStore) -> String? {
        guard let reader = try? blobs.reader(digest) else { return nil }
        var md5 = Insecure.MD5()
        var offset: Int64 = 0
        while offset < reader.length {
            guard let chunk = try? reader.read(offset: offset, count: 1 << 20), !chunk.isEmpty else { return nil }
            md5.update(data: chunk)
            offset += Int64(chunk.count)
        }
        return "md5-" + Data(md5.finalize()).base64EncodedString()
    }

    /// The base64 of the MD5, as `Content-MD5` carries it.
    package var md5Base64: String { md5.hasPrefix("md5-") ? String(md5.dropFirst(4)) : md5 }
}

/// The attachments of one stored revision as CouchDB clients see them: the body's
/// `@attachments` plus, for each blob the body refers to elsewhere, a stub named
/// `sha256-<hex>` so that CouchDB clients can fetch Ferry's own blobs.
package struct AttachmentSet {
    /// Name → attachment, including the blob stubs.
    package var entries: [String: StoredAttachment] = [:]
    /// Names that stand for blob references elsewhere in the body (not kept in `@attachments`).
    package var blobStubNames: Set<String> = []

    /// The attachments of a stored body of a revision of `generation`. MD5 digests of blob
    /// stubs are computed from the blob bytes; a blob this node lacks gets no stub.
    package init(body: JSON, generation: Int, blobs: BlobStore) {
        guard let fields = body.objectValue else { return }
        if let stored = fields[StoredAttachment.bodyKey]?.objectValue {
            for (name, value) in stored {
                if let att = StoredAttachment(json: value) { entries[name] = att }
            }
        }
        var rest = fields
        rest.removeValue(forKey: StoredAttachment.bodyKey)
        guard let refs = try? JSON.object(rest).blobReferences(), !refs.isEmpty else { return }
        for ref in refs {
            let name = Self.blobStubName(ref.digest)
            guard entries[name] == nil, let md5 = StoredAttachment.md5Digest(of: ref.digest, in: blobs) else { continue }
            entries[name] = StoredAttachment(
                blob: ref.digest, length: ref.length, contentType: ref.contentType ?? StoredAttachment.defaultContentType,
                md5: md5, revpos: generation)
            blobStubNames.insert(name)
        }
    }

    package init() {}

    package static func blobStubName(_ digest: BlobDigest) -> String { digest.description }

    package var isEmpty: Bool { entries.isEmpty }
}

/// How an attachment's content goes out with a document.
package enum AttachmentDelivery {
    /// Metadata with `stub: true`.
    case stub
    /// `data` as base64 in the JSON.
    case inline
    /// `follows: true`; the bytes go in a later MIME part.
    case follows
}

extension StoredAttachment {
    /// CouchDB's `_attachments` entry.
    package func couchJSON(_ delivery: AttachmentDelivery, blobs: BlobStore) throws -> JSON {
        var f: [String: JSON] = [
            "content_type": .string(contentType), "digest": .string(md5), "length": .int(length),
            "revpos": .int(Int64(revpos)),
        ]
        switch delivery {
        case .stub: f["stub"] = true
        case .follows:
            f["follows"] = true
            let wire = try wireForm(blobs)
            f["digest"] = .string(wire.digest)
            if wire.gzip {
                f["encoding"] = "gzip"
                f["encoded_length"] = .int(Int64(wire.bytes.count))
            }
        case .inline: f["data"] = .string(Data(try content(blobs)).base64EncodedString())
        }
        return .object(f)
    }

    /// What a MIME part carries for this attachment, and the digest those bytes match.
    /// CouchDB gives content it stored gzip-encoded (replicated with `new_edits=false`) the
    /// MD5 of the encoded bytes, and a CouchDB target checks a part against its digest: such
    /// content goes out gzip-encoded again when re-encoding reproduces that MD5, else as
    /// identity bytes with their own MD5.
    package func wireForm(_ blobs: BlobStore) throws -> (bytes: [UInt8], digest: String, gzip: Bool) {
        let bytes = try content(blobs)
        let identity = Self.md5Digest(bytes)
        if identity == md5 { return (bytes, md5, false) }
        if let encoded = Gzip.encode(bytes), Self.md5Digest(encoded) == md5 { return (encoded, md5, true) }
        return (bytes, identity, false)
    }

    /// The attachment's bytes, from the blob store.
    package func content(_ blobs: BlobStore) throws -> [UInt8] {
        guard let bytes = try blobs.get(blob) else {
            throw CouchError(.internalServerError, "missing_blob", "The content of this attachment is not on this node.")
        }
        return bytes
    }
}

/// The stored body of a Ferry-form revision that came back through a CouchDB server.
///
/// CouchDB keeps compressible attachments (text, JSON, …) gzip-encoded and from then on
/// gives them the MD5 of the encoded bytes. A revision Ferry made carries the MD5 of the
/// identity bytes in its body, which its ID hashes: rebuilt with the server's digests, the
/// body no longer matches the ID. This finds the body the ID was made from.
package enum FerryFormBody {
    /// `body` when `rev` (a Ferry-form ID) matches it; else `body` with each attachment's
    /// `md5` set to the MD5 of its identity bytes, when that matches; else nil. Content comes
    /// from `contents` (just received) or the blob store.
    package static func matching(
        _ rev: RevisionID, parent: RevisionID?, deleted: Bool, body: JSON, contents: [[UInt8]], blobs: BlobStore
    ) -> JSON? {
        func matches(_ candidate: JSON) -> Bool {
            RevisionID.compute(parent: parent, deleted: deleted, canonicalBody: candidate.canonicalBytes) == rev
        }
        if matches(body) { return body }
        guard var fields = body.objectValue, let stored = fields[StoredAttachment.bodyKey]?.objectValue else { return nil }
        var received: [BlobDigest: [UInt8]] = [:]
        for bytes in contents { received[BlobDigest.of(bytes)] = bytes }
        var changed = false
        var rewritten: [String: JSON] = [:]
        for (name, value) in stored {
            guard var att = StoredAttachment(json: value), let bytes = received[att.blob] ?? (try? blobs.get(att.blob)) else {
                rewritten[name] = value
                continue
            }
            let identity = StoredAttachment.md5Digest(bytes)
            if identity != att.md5 {
                att.md5 = identity
                changed = true
            }
            rewritten[name] = att.json
        }
        guard changed else { return nil }
        fields[StoredAttachment.bodyKey] = .object(rewritten)
        let candidate = JSON.object(fields)
        // Not a ternary: JSON takes `nil` as its null literal there.
        guard matches(candidate) else { return nil }
        return candidate
    }
}

extension StoredAttachment {
    /// The attachment a `new_edits=false` stub names: held by some revision of the document
    /// whose body is kept, with the stub's digest when it gives one.
    package static func held(named name: String, digest: String?, in tree: RevisionTree?, blobs: BlobStore)
        -> StoredAttachment?
    {
        guard let tree else { return nil }
        // Leaves first, newest first: their bodies are always kept.
        let ordered = tree.revisions.sorted { ($0.isLeaf ? 1 : 0, $0.id.generation) > ($1.isLeaf ? 1 : 0, $1.id.generation) }
        for r in ordered {
            guard let bytes = r.body, let body = try? JSON.parse(bytes) else { continue }
            let set = AttachmentSet(body: body, generation: r.id.generation, blobs: blobs)
            if let att = set.entries[name], digest == nil || att.md5 == digest { return att }
        }
        return nil
    }
}
