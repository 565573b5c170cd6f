import FerryCore
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

extension CouchDatabase {
    /// The CouchDB JSON of one stored revision: `_id`, `_rev`, the body with Ferry's
    /// internal attachment form turned into CouchDB's `_attachments`, and the options' fields.
    public func renderDocument(_ document: Document, options: CouchRenderOptions) throws -> JSON {
        document.json(includeConflicts: options.conflicts && !document.conflicts.isEmpty)
    }
}
