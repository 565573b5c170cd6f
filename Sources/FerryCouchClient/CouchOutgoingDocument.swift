import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation

/// One local revision rendered as the CouchDB document that `_bulk_docs` with
/// `new_edits: false` stores unchanged: the user's members, `_id`, `_rev`, `_deleted`,
/// `_revisions`, and `_attachments` whose content goes inline unless the target holds it.
///
/// An attachment the target already holds goes as a stub, never re-sent: CouchDB's
/// `atts_since` rule, judged against the revisions the target named in `_revs_diff` as
/// possible ancestors, counting only those on this revision's own path (a possible ancestor
/// on another branch says nothing about this revision's attachments). Ferry's blob
/// references outside `@attachments` go as attachments named `sha256-<hex>`, as the
/// server side renders them, so a CouchDB target holds their bytes too.
struct CouchOutgoingDocument {
    let id: String
    let rev: String
    /// The document as `_bulk_docs` takes it.
    let json: JSON
    /// Its encoding, sent as is; also what counts against a request's size bound.
    let bytes: [UInt8]
    /// Attachment names sent with their content, and those sent as stubs.
    let inlineAttachments: [String]
    let stubAttachments: [String]
    /// Attachments whose content follows in MIME parts of a `multipart/related` PUT,
    /// streamed from the blob store, in the order the JSON names them.
    let follows: [(name: String, attachment: StoredAttachment)]
    /// Content longer than this goes as a streamed MIME part instead of inline base64
    /// (nil: always inline).
    let streamAbove: Int64?
    /// What it was rendered from, to render it again with every attachment's content.
    private let wire: WireRevision
    private let tree: RevisionTree?

    /// Why a revision could not be rendered; it is refused here and never reaches the target.
    struct Failure: Error, Equatable, CustomStringConvertible {
        let reason: String
        var description: String { reason }
    }

    /// Renders `wire` (a full body, never a delta). `targetHolds` are the revisions of the
    /// document the target said it holds; `tree` is the local tree (for the history of blob
    /// references); `stubs` false sends every attachment's content (after a target could not
    /// match a stub).
    init(
        _ wire: WireRevision, targetHolds: [RevisionID], tree: RevisionTree?, blobs: BlobStore, stubs: Bool = true, streamAbove: Int64? = nil
    ) throws(Failure) {
        guard !wire.missing, !wire.isDelta else { throw Failure(reason: "only full revisions can be sent to a CouchDB target") }
        let rev: RevisionID
        do { rev = try RevisionID(wire.rev) } catch { throw Failure(reason: "bad revision ID \(wire.rev): \(error)") }
        guard let body = try? JSON.parse(wire.content), case .object(var fields) = body else {
            throw Failure(reason: "the stored body of \(wire.id) \(wire.rev) is not a JSON object")
        }
        fields.removeValue(forKey: StoredAttachment.bodyKey)
        fields["_id"] = .string(wire.id)
        fields["_rev"] = .string(wire.rev)
        if wire.deleted { fields["_deleted"] = true }

        // `_revisions`: the hashes from this revision back, while generations run without a gap.
        var path = [rev]
        for text in wire.history {
            guard let r = try? RevisionID(text), r.generation == path[path.count - 1].generation - 1 else { break }
            path.append(r)
        }
        fields["_revisions"] = ["start": .int(Int64(rev.generation)), "ids": .array(path.map { .string($0.hashText) })]

        // The newest revision on this path the target holds: attachments at or before it are there.
        let onPath = Set(path.dropFirst())
        let heldGeneration = stubs ? (targetHolds.filter(onPath.contains).map(\.generation).max() ?? 0) : 0

        let set = AttachmentSet(body: body, generation: rev.generation, blobs: blobs)
        var inline: [String] = []
        var stubbed: [String] = []
        var following: [(name: String, attachment: StoredAttachment)] = []
        if !set.isEmpty {
            var out: [String: JSON] = [:]
            for (name, found) in set.entries.sorted(by: { $0.key < $1.key }) {
                var attachment = found
                if set.blobStubNames.contains(name) {
                    attachment.revpos = Self.firstReference(of: attachment.blob, from: rev, in: tree)
                }
                let asStub = heldGeneration > 0 && attachment.revpos <= heldGeneration
                // A large attachment streams from its blob file, when its MD5 is that of the
                // bytes stored (content a CouchDB server kept gzip-encoded goes inline, re-encoded).
                if !asStub, let streamAbove, attachment.length > streamAbove,
                    blobs.has(attachment.blob), StoredAttachment.md5Digest(of: attachment.blob, in: blobs) == attachment.md5
                {
                    out[name] = [
                        "content_type": .string(attachment.contentType), "digest": .string(attachment.md5),
                        "length": .int(attachment.length), "revpos": .int(Int64(attachment.revpos)), "follows": true,
                    ]
                    following.append((name, attachment))
                    inline.append(name)
                    continue
                }
                do {
                    out[name] = try attachment.couchJSON(asStub ? .stub : .inline, blobs: blobs)
                } catch {
                    throw Failure(reason: "attachment \(name) of \(wire.id) \(wire.rev): its content is not in this node's blob store")
                }
                if asStub { stubbed.append(name) } else { inline.append(name) }
            }
            fields["_attachments"] = .object(out)
        }
        id = wire.id
        self.rev = wire.rev
        json = .object(fields)
        bytes = json.canonicalBytes
        inlineAttachments = inline
        stubAttachments = stubbed
        // Canonical JSON orders members by their UTF-8 bytes: the parts follow that order.
        follows = following.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        self.streamAbove = streamAbove
        self.wire = wire
        self.tree = tree
    }

    /// The same revision with every attachment's content inline (itself when it has no stubs).
    func withoutStubs(blobs: BlobStore) throws(Failure) -> CouchOutgoingDocument {
        stubAttachments.isEmpty
            ? self : try CouchOutgoingDocument(wire, targetHolds: [], tree: tree, blobs: blobs, stubs: false, streamAbove: streamAbove)
    }

    /// The generation from which `rev`'s path refers to `blob` without a break: the `revpos`
    /// of a blob-reference attachment, the same each time the blob is sent (a CouchDB target
    /// matches a later stub against the attachment stored first). Only revisions whose body
    /// is still held count; without the tree, `rev`'s own generation.
    static func firstReference(of blob: BlobDigest, from rev: RevisionID, in tree: RevisionTree?) -> Int {
        guard let tree else { return rev.generation }
        var first = rev.generation
        for ancestor in tree.history(of: rev).dropFirst() {
            guard ancestor.generation == first - 1, let bytes = tree.revision(ancestor)?.body,
                DocumentStore.mayReferenceBlobs(bytes), let body = try? JSON.parse(bytes), case .object(var f) = body
            else { break }
            f.removeValue(forKey: StoredAttachment.bodyKey)
            guard ((try? JSON.object(f).blobReferences()) ?? []).contains(where: { $0.digest == blob }) else { break }
            first = ancestor.generation
        }
        return first
    }
}
