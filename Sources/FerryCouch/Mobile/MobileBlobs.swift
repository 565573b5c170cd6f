import Crypto
import FerryBLIP
import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation

/// Couchbase Lite's blobs as Ferry blobs. An app's blob is a body member
/// `{"@type":"blob","digest":"sha1-…","length":N,"content_type":T}`; Ferry keeps the same
/// member as its own reference (`sha256-` digest, `contentType`) with the app's digest in
/// `sha1`, stores the content once in the blob store (so it replicates to every peer as any
/// blob), and lists it as the attachment `blob_/NAME` for CouchDB clients, as Sync Gateway
/// does. On the way back the member is the app's again, byte for byte.
enum MobileBlobs {
    /// The content's digest as Couchbase Lite writes it: `sha1-` and base64.
    static func sha1(_ bytes: [UInt8]) -> String {
        "sha1-" + Data(Insecure.SHA1.hash(data: bytes)).base64EncodedString()
    }

    /// Every blob member of a body, with its path of keys (arrays are entered, not named).
    static func blobMembers(_ value: JSON, path: [String] = []) -> [([String], [String: JSON])] {
        switch value {
        case .object(let o):
            if o["@type"]?.stringValue == "blob" { return [(path, o)] }
            return o.sorted { $0.key < $1.key }.flatMap { blobMembers($0.value, path: path + [$0.key]) }
        case .array(let a):
            return a.flatMap { blobMembers($0, path: path) }
        default:
            return []
        }
    }

    /// Replaces every blob member (at any depth) by `transform`'s result.
    static func mapBlobs(_ value: JSON, _ transform: ([String: JSON]) throws -> JSON) rethrows -> JSON {
        switch value {
        case .object(let o):
            if o["@type"]?.stringValue == "blob" { return try transform(o) }
            var out: [String: JSON] = [:]
            for (k, v) in o { out[k] = try mapBlobs(v, transform) }
            return .object(out)
        case .array(let a):
            return .array(try a.map { try mapBlobs($0, transform) })
        default:
            return value
        }
    }
}

extension MobileSession {
    /// Turns an app's revision body into Ferry's: each blob it names is fetched from the app
    /// (`getAttachment`, streamed to the blob store as it arrives) unless this principal
    /// reads everything and the node already holds it, checked against its digest and
    /// length, and referred to by Ferry's digest. Returns the body and, for CouchDB clients,
    /// the attachments it holds (the app's `_attachments`, and each blob as `blob_/NAME`),
    /// already in the blob store.
    func importBlobs(_ fields: [String: JSON], docID: String, tree: RevisionTree?) async throws -> (
        fields: [String: JSON], attachments: [String: StoredAttachment]
    ) {
        var fields = fields
        let legacy = fields.removeValue(forKey: "_attachments")?.objectValue ?? [:]
        var known: [String: MobileBlob] = [:]  // by the app's sha1
        if DocumentAccess(principal.policy).readsEverything, let tree {
            for r in tree.revisions {
                guard let bytes = r.body, let body = try? JSON.parse(bytes) else { continue }
                for (_, member) in MobileBlobs.blobMembers(body) {
                    if let sha1 = member["sha1"]?.stringValue, let d = member["digest"]?.stringValue, let digest = try? BlobDigest(d),
                        let length = member["length"]?.intValue, database.store.blobs.has(digest)
                    {
                        known[sha1] = MobileBlob(digest: digest, length: length, md5: nil)
                    }
                }
            }
        }
        func fetch(_ sha1: String, length: Int64?) async throws -> MobileBlob {
            if let k = known[sha1] { return k }
            guard sha1.hasPrefix("sha1-") else { throw MobileRequestError(code: 400, "\(docID): blob digest \(sha1) is not a Couchbase Lite digest") }
            let intake = try MobileBlobIntake(store: database.store.blobs, limit: length ?? database.maxAttachmentBytes, docID: docID, sha1: sha1)
            do {
                let reply = try await request(.request("getAttachment", [("digest", sha1), ("docID", docID)]), streamingInto: intake)
                if let e = reply.error { throw MobileRequestError(code: 502, "\(docID): the app did not send blob \(sha1): \(e.message)") }
                let blob = try intake.finish(length: length)
                known[sha1] = blob
                return blob
            } catch {
                intake.discard()
                throw error
            }
        }
        func md5(_ blob: MobileBlob) throws -> String {
            if let m = blob.md5 { return m }
            guard let m = StoredAttachment.md5Digest(of: blob.digest, in: database.store.blobs) else {
                throw MobileRequestError(code: 500, "blob \(blob.digest) is not readable on this node")
            }
            return m
        }
        var converted: [String: (MobileBlob, String?)] = [:]
        // Each blob is also an attachment for CouchDB clients, named as Sync Gateway names it.
        var named: [String: (sha1: String, contentType: String?)] = [:]
        for (path, member) in MobileBlobs.blobMembers(.object(fields)) {
            guard let sha1 = member["digest"]?.stringValue else { throw MobileRequestError(code: 400, "\(docID): a blob has no digest") }
            let blob = try await fetch(sha1, length: member["length"]?.intValue)
            converted[sha1] = (blob, member["content_type"]?.stringValue)
            named["blob_/" + path.joined(separator: "/")] = (sha1, member["content_type"]?.stringValue)
        }
        for (name, entry) in legacy {
            guard let sha1 = entry["digest"]?.stringValue else { continue }
            named[name] = (sha1, entry["content_type"]?.stringValue)
        }
        let body = try MobileBlobs.mapBlobs(.object(fields)) { member in
            guard let sha1 = member["digest"]?.stringValue, let (blob, type) = converted[sha1] else {
                throw MobileRequestError(code: 400, "\(docID): a blob has no digest")
            }
            var out = member
            out["digest"] = .string(blob.digest.description)
            out["length"] = .int(blob.length)
            out["sha1"] = .string(sha1)
            out.removeValue(forKey: "content_type")
            if let type { out["contentType"] = .string(type) }
            return .object(out)
        }
        fields = body.objectValue ?? fields
        var attachments: [String: StoredAttachment] = [:]
        for (name, entry) in named {
            let blob = try await fetch(entry.sha1, length: nil)
            attachments[name] = StoredAttachment(
                blob: blob.digest, length: blob.length, contentType: entry.contentType ?? StoredAttachment.defaultContentType,
                md5: try md5(blob), revpos: 1)
        }
        return (fields, attachments)
    }

    /// Turns a stored body into what the app expects: Ferry blob references become Couchbase
    /// Lite blobs (`sha1-` digests, computed and remembered when a reference came from a Ferry
    /// peer or a CouchDB client), and attachments the body does not already hold as blobs
    /// become `_attachments` with `sha1-` digests, which the app then asks for.
    func exportBlobs(_ view: RevisionView) throws -> [String: JSON] {
        var fields = view.body.objectValue ?? [:]
        let attachmentsValue = fields.removeValue(forKey: StoredAttachment.bodyKey)
        for key in fields.keys where key.hasPrefix("_") { fields.removeValue(forKey: key) }
        let body = try MobileBlobs.mapBlobs(.object(fields)) { member in
            guard let d = member["digest"]?.stringValue, let digest = try? BlobDigest(d) else { return .object(member) }
            var out = member
            out["digest"] = .string(try sha1(of: digest, stored: member["sha1"]?.stringValue))
            out.removeValue(forKey: "sha1")
            if let type = out.removeValue(forKey: "contentType") { out["content_type"] = type }
            return .object(out)
        }
        fields = body.objectValue ?? fields
        let held = Set(MobileBlobs.blobMembers(body).compactMap { $0.1["digest"]?.stringValue })
        var legacy: [String: JSON] = [:]
        for (name, value) in attachmentsValue?.objectValue ?? [:] {
            guard let att = StoredAttachment(json: value) else { continue }
            let sha1 = try sha1(of: att.blob, stored: nil)
            if held.contains(sha1) { continue }  // the app holds it as a blob member already
            legacy[name] = [
                "stub": true, "digest": .string(sha1), "length": .int(att.length), "content_type": .string(att.contentType),
                "revpos": .int(Int64(att.revpos)),
            ]
        }
        if !legacy.isEmpty { fields["_attachments"] = .object(legacy) }
        return fields
    }

    /// A blob's `sha1-` digest: the one the app gave, else computed from the content.
    func sha1(of digest: BlobDigest, stored: String?) throws -> String {
        if let stored, stored.hasPrefix("sha1-") { return stored }
        if let cached = sha1Cache.withLock({ $0[digest] }) { return cached }
        guard let reader = try? database.store.blobs.reader(digest) else {
            throw MobileRequestError(code: 404, "blob \(digest) is not on this node")
        }
        var hash = Insecure.SHA1()
        var offset: Int64 = 0
        while offset < reader.length {
            let chunk = try reader.read(offset: offset, count: 1 << 20)
            guard !chunk.isEmpty else { break }
            hash.update(data: chunk)
            offset += Int64(chunk.count)
        }
        let text = "sha1-" + Data(hash.finalize()).base64EncodedString()
        sha1Cache.withLock { $0[digest] = text }
        return text
    }

    /// `getAttachment`: the content of a blob of a document this principal may read.
    func getAttachment(_ request: BLIPMessage) throws {
        guard let sha1 = request["digest"], let rawID = request["docID"] else {
            throw MobileRequestError(code: 400, "getAttachment needs 'digest' and 'docID'")
        }
        let id = try database.couchDocumentID(rawID, replicated: true)
        guard !CouchDatabase.isNodeInternal(id), let tree = try database.store.revisionTrees([id])[id] else {
            throw MobileRequestError(code: 404, "no blob \(sha1) in \(rawID)")
        }
        let access = DocumentAccess(principal.policy)
        for leaf in tree.leaves where access.mayRead(id, revision: leaf.id, in: tree) {
            guard let view = try database.view(of: id, revision: leaf.id, in: tree) else { continue }
            var digests = MobileBlobs.blobMembers(view.body).compactMap { m -> (BlobDigest, String?)? in
                guard let d = m.1["digest"]?.stringValue, let digest = try? BlobDigest(d) else { return nil }
                return (digest, m.1["sha1"]?.stringValue)
            }
            for (_, value) in view.body[StoredAttachment.bodyKey]?.objectValue ?? [:] {
                if let att = StoredAttachment(json: value) { digests.append((att.blob, nil)) }
            }
            for (digest, stored) in digests where (try? self.sha1(of: digest, stored: stored)) == sha1 {
                guard let reader = try database.store.blobs.reader(digest) else { continue }
                // Read as its frames go: a blob of any size is never whole in memory.
                respond(to: request, body: BlobBodySource(reader: reader))
                return
            }
        }
        throw MobileRequestError(code: 404, "no blob \(sha1) in \(rawID)")
    }
}

/// A blob the node holds for an app's blob: Ferry's digest, its length, and CouchDB's MD5
/// when it was computed on the way in.
struct MobileBlob: Sendable {
    let digest: BlobDigest
    let length: Int64
    let md5: String?
}

/// An app's blob as its `getAttachment` reply streams in: written to the blob store's
/// temporary file while SHA-1 (the app's digest), SHA-256 and MD5 are computed, and refused
/// past `limit` bytes. Only the connection's reader feeds it, then the requester finishes it.
final class MobileBlobIntake: MobileReplySink, @unchecked Sendable {
    // @unchecked: fed only by the connection's reader, and finished by the requester after
    // the reply's last frame (the reader is done with it by then).
    private let writer: BlobWriter
    private var hash = Insecure.SHA1()
    private var length: Int64 = 0
    private let limit: Int64
    private let docID: String
    private let sha1: String

    init(store: BlobStore, limit: Int64, docID: String, sha1: String) throws {
        writer = try BlobWriter(store: store, md5: true)
        self.limit = limit
        self.docID = docID
        self.sha1 = sha1
    }

    func take(_ bytes: [UInt8]) throws {
        guard length + Int64(bytes.count) <= limit else {
            throw MobileRequestError(code: 413, "\(docID): blob \(sha1) is larger than \(limit) bytes")
        }
        hash.update(data: bytes)
        try writer.write(bytes)
        length += Int64(bytes.count)
    }

    /// Checks the content against the app's digest and declared length, and stores it.
    func finish(length declared: Int64?) throws -> MobileBlob {
        guard "sha1-" + Data(hash.finalize()).base64EncodedString() == sha1 else {
            throw MobileRequestError(code: 400, "\(docID): blob \(sha1) does not match its content")
        }
        if let declared, declared != length {
            throw MobileRequestError(code: 400, "\(docID): blob \(sha1) is \(length) bytes, not \(declared)")
        }
        let md5 = writer.md5Digest
        let reference = try writer.finish()
        return MobileBlob(digest: reference.digest, length: reference.length, md5: md5)
    }

    /// Throws away what was written (a no-op once finished).
    func discard() { writer.discard() }
}

/// A stored blob read as BLIP frames go out.
struct BlobBodySource: BLIPBodySource {
    let reader: BlobReader
    var length: Int { Int(reader.length) }

    func read(offset: Int, count: Int) throws(BLIPError) -> [UInt8] {
        do { return try reader.read(offset: Int64(offset), count: count) } catch {
            throw BLIPError("reading blob \(reader.digest): \(error)")
        }
    }
}
