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
    /// (`getAttachment`) unless this principal reads everything and the node already holds
    /// it, checked against its digest and length, stored, and referred to by Ferry's digest;
    /// the `_attachments` Couchbase Lite adds for its blobs become Ferry attachments.
    func importBlobs(_ fields: [String: JSON], docID: String, tree: RevisionTree?) async throws -> [String: JSON] {
        var fields = fields
        let legacy = fields.removeValue(forKey: "_attachments")?.objectValue ?? [:]
        var known: [String: (BlobDigest, Int64)] = [:]  // sha1 → Ferry digest, length
        if DocumentAccess(principal.policy).readsEverything, let tree {
            for r in tree.revisions {
                guard let bytes = r.body, let body = try? JSON.parse(bytes) else { continue }
                for (_, member) in MobileBlobs.blobMembers(body) {
                    if let sha1 = member["sha1"]?.stringValue, let d = member["digest"]?.stringValue, let digest = try? BlobDigest(d),
                        let length = member["length"]?.intValue, database.store.blobs.has(digest)
                    {
                        known[sha1] = (digest, length)
                    }
                }
            }
        }
        func fetch(_ sha1: String, length: Int64?) async throws -> (BlobDigest, Int64) {
            if let k = known[sha1] { return k }
            guard sha1.hasPrefix("sha1-") else { throw MobileRequestError(code: 400, "\(docID): blob digest \(sha1) is not a Couchbase Lite digest") }
            let reply = try await request(.request("getAttachment", [("digest", sha1), ("docID", docID)]))
            if let e = reply.error { throw MobileRequestError(code: 502, "\(docID): the app did not send blob \(sha1): \(e.message)") }
            guard MobileBlobs.sha1(reply.body) == sha1 else { throw MobileRequestError(code: 400, "\(docID): blob \(sha1) does not match its content") }
            if let length, length != Int64(reply.body.count) {
                throw MobileRequestError(code: 400, "\(docID): blob \(sha1) is \(reply.body.count) bytes, not \(length)")
            }
            let ref = try database.store.blobs.put(reply.body)
            known[sha1] = (ref.digest, ref.length)
            return (ref.digest, ref.length)
        }
        var converted: [String: (BlobDigest, Int64, String?)] = [:]
        // Each blob is also an attachment for CouchDB clients, named as Sync Gateway names it.
        var named: [String: (sha1: String, contentType: JSON?)] = [:]
        for (path, member) in MobileBlobs.blobMembers(.object(fields)) {
            guard let sha1 = member["digest"]?.stringValue else { throw MobileRequestError(code: 400, "\(docID): a blob has no digest") }
            let (digest, length) = try await fetch(sha1, length: member["length"]?.intValue)
            converted[sha1] = (digest, length, member["content_type"]?.stringValue)
            named["blob_/" + path.joined(separator: "/")] = (sha1, member["content_type"])
        }
        for (name, entry) in legacy {
            guard let sha1 = entry["digest"]?.stringValue else { continue }
            named[name] = (sha1, entry["content_type"])
        }
        let body = try MobileBlobs.mapBlobs(.object(fields)) { member in
            guard let sha1 = member["digest"]?.stringValue, let (digest, length, type) = converted[sha1] else {
                throw MobileRequestError(code: 400, "\(docID): a blob has no digest")
            }
            var out = member
            out["digest"] = .string(digest.description)
            out["length"] = .int(length)
            out["sha1"] = .string(sha1)
            out.removeValue(forKey: "content_type")
            if let type { out["contentType"] = .string(type) }
            return .object(out)
        }
        fields = body.objectValue ?? fields
        // Attachments for CouchDB clients: the app's `_attachments` (its blobs, as `blob_/NAME`).
        var attachments: [String: JSON] = [:]
        for (name, entry) in named {
            let (digest, _) = try await fetch(entry.sha1, length: nil)
            guard let bytes = try database.store.blobs.get(digest) else { throw MobileRequestError(code: 500, "blob \(digest) vanished") }
            attachments[name] = [
                "data": .string(Data(bytes).base64EncodedString()),
                "content_type": entry.contentType ?? .string(StoredAttachment.defaultContentType),
            ]
        }
        if !attachments.isEmpty { fields["_attachments"] = .object(attachments) }
        return fields
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
                guard let bytes = try database.store.blobs.get(digest) else { continue }
                respond(to: request, body: bytes)
                return
            }
        }
        throw MobileRequestError(code: 404, "no blob \(sha1) in \(rawID)")
    }
}
