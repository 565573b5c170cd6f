import FerryCore

/// One revision of a document as read from the store.
public struct Document: Sendable, Equatable {
    public let id: DocumentID
    public let revision: RevisionID
    public let deleted: Bool
    public let body: JSON
    /// The sequence of the document's latest change.
    public let sequence: UInt64
    /// Other live leaves, best first; empty unless the document is in conflict.
    public let conflicts: [RevisionID]

    /// The body with `_id`, `_rev`, `_deleted` (when deleted) and, if asked, `_conflicts`.
    public func json(includeConflicts: Bool = false) -> JSON {
        var fields = body.objectValue ?? [:]
        fields["_id"] = .string(id.rawValue)
        fields["_rev"] = .string(revision.description)
        if deleted { fields["_deleted"] = .bool(true) }
        if includeConflicts { fields["_conflicts"] = .array(conflicts.map { .string($0.description) }) }
        return .object(fields)
    }
}

/// One entry of the changes feed: a document's latest change.
public struct Change: Sendable, Equatable {
    public let sequence: UInt64
    public let id: DocumentID
    public let revision: RevisionID
    public let deleted: Bool
    /// Canonical size of the winning body in bytes.
    public let bodySize: Int
}

/// An existing revision arriving from elsewhere, inserted as-is (CouchDB's `new_edits=false`).
///
/// A revision whose ID is Ferry's form (`RevisionID.isFerryDigest`) is always checked against
/// its digest before it is stored, however it was made; a revision in another form (made by
/// CouchDB or elsewhere) cannot be checked and is stored on the sender's word, after the same
/// structure, policy, filter and validation checks.
public struct IncomingRevision: Sendable {
    public let id: DocumentID
    public let revision: RevisionID
    /// Ancestors, newest first, starting with the parent; empty for generation 1.
    public let history: [RevisionID]
    public let deleted: Bool
    public let body: JSON
    public let hlc: HLCTimestamp
    /// The canonical encoding of `body`, when the caller already has it (replication
    /// receives it on the wire); the store still checks it against the revision digest, and
    /// encodes the body itself for an ID in another form.
    public let canonicalBody: [UInt8]?
    /// Set only by this module's constructors: by `verified(…)`, which checked that
    /// `canonicalBody` hashes to `revision`, and by `unverifiable(…)`, which encoded
    /// `canonicalBody` itself; an insert then does neither a second time.
    let canonicalChecked: Bool

    /// True when the revision's ID is not Ferry's form, so its body cannot be checked against it.
    public var isUnverifiable: Bool { !revision.isFerryDigest }

    public init(
        id: DocumentID, revision: RevisionID, history: [RevisionID], deleted: Bool, body: JSON,
        hlc: HLCTimestamp = .zero, canonicalBody: [UInt8]? = nil
    ) {
        self.init(
            id: id, revision: revision, history: history, deleted: deleted, body: body, hlc: hlc,
            canonicalBody: canonicalBody, canonicalChecked: false)
    }

    private init(
        id: DocumentID, revision: RevisionID, history: [RevisionID], deleted: Bool, body: JSON,
        hlc: HLCTimestamp, canonicalBody: [UInt8]?, canonicalChecked: Bool
    ) {
        self.id = id
        self.revision = revision
        self.history = history
        self.deleted = deleted
        self.body = body
        self.hlc = hlc
        self.canonicalBody = canonicalBody
        self.canonicalChecked = canonicalChecked
    }

    /// The revision if its ID is Ferry's form and `canonicalBody` hashes (with the parent and
    /// the deleted flag) to it, else nil. The trust boundary checks each digest here, once.
    public static func verified(
        id: DocumentID, revision: RevisionID, history: [RevisionID], deleted: Bool, body: JSON,
        hlc: HLCTimestamp, canonicalBody: [UInt8]
    ) -> IncomingRevision? {
        guard revision.isFerryDigest,
            RevisionID.compute(parent: history.first, deleted: deleted, canonicalBody: canonicalBody) == revision
        else { return nil }
        return IncomingRevision(
            id: id, revision: revision, history: history, deleted: deleted, body: body, hlc: hlc,
            canonicalBody: canonicalBody, canonicalChecked: true)
    }

    /// A revision whose ID is not Ferry's form, with its body's canonical encoding made here;
    /// nil for a Ferry-form ID, which must be verified instead (`verified(…)`).
    public static func unverifiable(
        id: DocumentID, revision: RevisionID, history: [RevisionID], deleted: Bool, body: JSON, hlc: HLCTimestamp
    ) -> IncomingRevision? {
        guard !revision.isFerryDigest else { return nil }
        return IncomingRevision(
            id: id, revision: revision, history: history, deleted: deleted, body: body, hlc: hlc,
            canonicalBody: body.canonicalBytes, canonicalChecked: true)
    }
}

/// What happened to one incoming revision.
public enum InsertOutcome: Sendable, Equatable {
    /// Stored at `sequence`. `branched`: the document now has more than one leaf (live or
    /// deleted), so a conflict resolver may have work; a single-leaf document never does.
    case inserted(sequence: UInt64, branched: Bool)
    case alreadyPresent
    case rejected(StoreError)
}

/// The answer of `revsDiff` for one document.
public struct RevsDiffEntry: Sendable, Equatable {
    /// Revisions asked about that the store does not hold.
    public var missing: [RevisionID]
    /// Held revisions (with bodies) older than the missing ones: candidates for delta bases.
    public var possibleAncestors: [RevisionID]
}

/// Database-wide figures.
public struct StoreInfo: Sendable, Equatable {
    public let uuid: String
    public let documentCount: Int
    public let deletedCount: Int
    public let conflictedCount: Int
    public let lastSequence: UInt64
    public let sizeOnDisk: Int64
}

/// A document body as a client sends it: the JSON object with the metadata fields
/// (`_id`, `_rev`, `_deleted`, `_conflicts`) taken out and checked.
public struct DocumentInput: Sendable, Equatable {
    public var body: JSON
    public var id: String?
    public var rev: String?
    public var deleted: Bool

    public init(parsing value: JSON) throws(StoreError) {
        guard var fields = value.objectValue else {
            throw .invalidBody("a document body must be a JSON object, not \(value.typeName)")
        }
        id = nil
        rev = nil
        deleted = false
        if let v = fields.removeValue(forKey: "_id") {
            guard let s = v.stringValue else { throw .invalidBody("_id must be a string") }
            id = s
        }
        if let v = fields.removeValue(forKey: "_rev") {
            guard let s = v.stringValue else { throw .invalidBody("_rev must be a string") }
            rev = s
        }
        if let v = fields.removeValue(forKey: "_deleted") {
            guard let b = v.boolValue else { throw .invalidBody("_deleted must be a boolean") }
            deleted = b
        }
        fields.removeValue(forKey: "_conflicts")
        body = .object(fields)
    }
}
