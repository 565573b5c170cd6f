import FerryCore
import FerryCouchDocuments
import FerryStore

/// How a document is rendered for a CouchDB client (the options of `GET /{db}/{id}` that
/// `_changes?include_docs`, `_all_docs?include_docs` and `_bulk_get` share).
public struct CouchRenderOptions: Sendable, Equatable {
    public var conflicts = false
    public var deletedConflicts = false
    public var revs = false
    public var revsInfo = false
    /// Attachment bodies inline (base64) instead of stubs.
    public var attachments = false
    /// Send bodies only of attachments newer than these revisions.
    public var attsSince: [RevisionID] = []
    public init() {}
}

/// One stored revision with what rendering it may need.
struct RevisionView {
    let id: DocumentID
    let revision: RevisionID
    let deleted: Bool
    /// The stored (internal) body.
    let body: JSON
    /// The document's tree, for `_revisions`, `_revs_info`, conflicts and `atts_since`.
    let tree: RevisionTree?
    /// The document's latest sequence, for `_local_seq`.
    var sequence: UInt64?
}

extension CouchDatabase {
    /// The CouchDB JSON of one stored revision: `_id`, `_rev`, the body with Ferry's
    /// internal attachment form turned into CouchDB's `_attachments`, and the options' fields.
    public func renderDocument(_ document: Document, options: CouchRenderOptions) throws -> JSON {
        var tree: RevisionTree?
        if options.revs || options.revsInfo || options.deletedConflicts || !options.attsSince.isEmpty {
            tree = try store.revisionTree(document.id)
        }
        let view = RevisionView(
            id: document.id, revision: document.revision, deleted: document.deleted, body: document.body, tree: tree,
            sequence: nil)
        var json = try render(view, options: options, multipart: false).json
        if options.conflicts && !document.conflicts.isEmpty && tree == nil, var f = json.objectValue {
            f["_conflicts"] = .array(document.conflicts.filter { $0 != document.revision }.map { .string($0.description) })
            json = .object(f)
        }
        return json
    }

    /// Renders one revision. With `multipart`, attachments whose content goes out are marked
    /// `follows` and returned in the order their MIME parts must follow.
    func render(_ view: RevisionView, options: CouchRenderOptions, multipart: Bool, localSeq: Bool = false) throws
        -> (json: JSON, follows: [(name: String, attachment: StoredAttachment)])
    {
        var fields = view.body.objectValue ?? [:]
        fields.removeValue(forKey: StoredAttachment.bodyKey)
        fields["_id"] = .string(view.id.rawValue)
        fields["_rev"] = .string(view.revision.description)
        if view.deleted { fields["_deleted"] = true }
        var follows: [(String, StoredAttachment)] = []
        let set = AttachmentSet(body: view.body, generation: view.revision.generation, blobs: store.blobs)
        if !set.isEmpty {
            let withContent = options.attachments || !options.attsSince.isEmpty
            // Without `atts_since` every body goes out, whatever its `revpos` (CouchDB stores 0
            // for an attachment replicated without one); with it, only those newer than the
            // latest named revision the document has (0 when it has none).
            var since = -1
            if !options.attsSince.isEmpty {
                since = view.tree.flatMap { tree in options.attsSince.filter { tree.contains($0) }.map(\.generation).max() } ?? 0
            }
            var out: [String: JSON] = [:]
            // In canonical JSON key order (UTF-8 bytes): MIME parts follow the order of `follows` entries.
            for (name, att) in set.entries.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) {
                var delivery = AttachmentDelivery.stub
                if withContent && att.revpos > since { delivery = multipart ? .follows : .inline }
                out[name] = try att.couchJSON(delivery, blobs: store.blobs)
                if delivery == .follows { follows.append((name, att)) }
            }
            fields["_attachments"] = .object(out)
        }
        if let tree = view.tree {
            if options.conflicts {
                let c = tree.conflicts.filter { $0 != view.revision }
                if !c.isEmpty { fields["_conflicts"] = .array(c.map { .string($0.description) }) }
            }
            if options.deletedConflicts {
                let winner = tree.winner?.id
                let d = tree.leaves.filter { $0.deleted && $0.id != winner && $0.id != view.revision }
                    .sorted(by: RevisionTree.beats).map(\.id)
                if !d.isEmpty { fields["_deleted_conflicts"] = .array(d.map { .string($0.description) }) }
            }
            let history = tree.history(of: view.revision)
            if options.revs && !history.isEmpty {
                fields["_revisions"] = [
                    "start": .int(Int64(view.revision.generation)),
                    "ids": .array(history.map { .string($0.hashText) }),
                ]
            }
            if options.revsInfo {
                fields["_revs_info"] = .array(
                    history.map { rev in
                        let r = tree.revision(rev)
                        let status = r?.deleted == true ? "deleted" : (rev == view.revision || r?.body != nil ? "available" : "missing")
                        return ["rev": .string(rev.description), "status": .string(status)]
                    })
            }
        }
        if localSeq, let seq = view.sequence { fields["_local_seq"] = .int(Int64(seq)) }
        return (.object(fields), follows)
    }

    /// A revision of a document from its tree, if its body is kept.
    func view(of id: DocumentID, revision: RevisionID, in tree: RevisionTree) throws -> RevisionView? {
        guard let r = tree.revision(revision), let bytes = r.body else { return nil }
        let body: JSON
        do { body = try JSON.parse(bytes) } catch {
            throw CouchError(.internalServerError, "corrupt", "Stored body of \(id) \(revision) is not JSON.")
        }
        return RevisionView(id: id, revision: revision, deleted: r.deleted, body: body, tree: tree)
    }
}
