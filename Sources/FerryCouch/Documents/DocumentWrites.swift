import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import HTTPTypes
import Metrics

/// A per-document failure as CouchDB reports it inside `_bulk_docs` answers (and as the
/// status of a single-document write).
struct DocumentFailure: Error {
    let id: String
    let rev: String?
    let error: CouchError
    /// The trust-boundary stage that refused a `new_edits=false` revision.
    var stage = "structure"

    var json: JSON {
        var f: [String: JSON] = ["id": .string(id), "error": .string(error.error), "reason": .string(error.reason)]
        if let rev { f["rev"] = .string(rev) }
        return .object(f)
    }
}

/// An ordinary edit (`new_edits` true), checked and ready for the store.
struct PreparedEdit {
    let id: DocumentID
    let parent: RevisionID?
    let deleted: Bool
    let body: JSON
}

extension CouchDatabase {
    /// A document ID from a CouchDB client. `_design/…` IDs are ordinary documents here;
    /// Ferry's own `_ferry/…` documents arrive only by replication (`new_edits=false`).
    func couchDocumentID(_ raw: String, replicated: Bool = false) throws(CouchError) -> DocumentID {
        if raw.hasPrefix("_design/") && raw.count > 8 {
            do { _ = try DocumentID("d" + raw.dropFirst()) } catch {
                throw CouchError(.badRequest, "illegal_docid", error.description)
            }
            return DocumentID(unchecked: raw)
        }
        do { return try DocumentID(raw, allowReserved: replicated) } catch {
            if case .reservedPrefix = error {
                throw CouchError(.badRequest, "illegal_docid", "Only reserved document ids may start with underscore.")
            }
            throw CouchError(.badRequest, "illegal_docid", error.description)
        }
    }

    func parseRevision(_ text: String) throws(CouchError) -> RevisionID {
        do { return try RevisionID(text) } catch { throw .badRequest("Invalid rev format") }
    }

    /// CouchDB's answer for a store error: the status of its `FailureKind`, as every API
    /// answers it, with CouchDB's error names. One exception is CouchDB's own contract: an
    /// attachment stub with no content is `412 missing_stub`.
    func couchError(_ e: StoreError) -> CouchError {
        switch e {
        case .conflict: return .conflict()
        case .notFound, .revisionNotFound, .bodyNotRetained: return .notFound("missing")
        case .invalidDocumentID(let why): return CouchError(.badRequest, "illegal_docid", why.description)
        case .invalidBody(let why): return CouchError(.badRequest, "doc_validation", why)
        case .tooLarge: return CouchError(.contentTooLarge, "too_large", "Document too large")
        case .rejected(_, let reason): return .forbidden(reason)
        case .missingBlob: return CouchError(.preconditionFailed, "missing_stub", e.description)
        default:
            let status = HTTPResponse.Status(code: e.failure.httpStatus)
            let name =
                switch e.failure {
                case .invalidRequest: "bad_request"
                case .conflict: "conflict"
                case .unavailable, .rateLimited: "unavailable"
                case .forbidden: "forbidden"
                case .notFound: "not_found"
                case .tooLarge: "too_large"
                case .peerFailed, .internalFailure: "internal_server_error"
                }
            return CouchError(status, name, e.description)
        }
    }

    /// Checks one ordinary edit against the document's current tree and the principal's
    /// policy, and stores its new attachment contents as blobs.
    func prepareEdit(
        id: DocumentID, input: CouchDocumentInput, parentText: String?, tree: RevisionTree?, principal: CouchPrincipal
    ) throws(CouchError) -> PreparedEdit {
        var parent: RevisionID?
        if let parentText { parent = try parseRevision(parentText) }
        var generation = 1
        var lookupBody: JSON?
        if let parent {
            generation = parent.generation + 1
            if let tree, let r = tree.revision(parent), let b = r.body { lookupBody = try? JSON.parse(b) }
        } else if let w = tree?.winner, w.deleted {
            generation = w.id.generation + 1
        }
        let parentAttachments = lookupBody.map { AttachmentSet(body: $0, generation: parent!.generation, blobs: store.blobs) }
        let resolver = AttachmentResolver(
            docID: id.rawValue,
            lookup: { name, _ in parentAttachments?.entries[name] },
            generation: generation, keepGivenRevpos: false)
        let (body, contents) = try resolver.storedBody(input)
        let access = DocumentAccess(principal.policy)
        if input.deleted && !access.policy.mayDelete { throw .forbidden("You may not delete documents.") }
        if let refusal = access.writeRefusal(
            id: id, body: .object(input.fields), deleted: input.deleted, ancestors: parent.map { [$0] } ?? [], existing: tree)
        {
            throw .forbidden("You may not write document \(id): \(refusal).")
        }
        try checkBlobPossession(body, supplied: contents, id: id, tree: tree, access: access)
        try storeContents(contents)
        return PreparedEdit(id: id, parent: parent, deleted: input.deleted, body: body)
    }

    /// Applies one prepared edit inside a transaction; returns the new revision.
    func apply(_ edit: PreparedEdit, in txn: StoreTransaction) throws(StoreError) -> RevisionID {
        if edit.deleted {
            guard let parent = edit.parent else { throw .conflict(id: edit.id, given: nil, current: nil) }
            return try txn.delete(edit.id, revision: parent, tombstoneBody: edit.body)
        }
        return try txn.put(edit.id, body: edit.body, parent: edit.parent)
    }

    /// Checks one existing revision (`new_edits=false`) at the trust boundary, in order:
    /// structure, digest (Ferry-form IDs only), the principal's write policy, the node's
    /// pull filter. Validation runs in the store as it inserts.
    func prepareReplicated(
        input: CouchDocumentInput, pathID: String?, trees: [DocumentID: RevisionTree], principal: CouchPrincipal
    ) throws(DocumentFailure) -> IncomingRevision {
        let rawID = pathID ?? input.id ?? ""
        var stage = "structure"
        func fail(_ e: CouchError) -> DocumentFailure { DocumentFailure(id: rawID, rev: input.rev, error: e, stage: stage) }
        do {
            // 1. Structure.
            guard !rawID.isEmpty else { throw CouchError.badRequest("Document id is missing") }
            let id = try couchDocumentID(rawID, replicated: true)
            // Ferry's own namespace is written by Ferry alone: group entries arrive over
            // Ferry's protocol, signed; nothing comes in under `_ferry/` through this door.
            if CouchDatabase.isNodeInternal(id) {
                throw CouchError(.forbidden, "forbidden", "Document IDs starting with _ferry/ are reserved to the node.")
            }
            guard let revText = input.rev else { throw CouchError.badRequest("Invalid rev format") }
            let rev = try parseRevision(revText)
            var history: [RevisionID] = []
            for h in try input.history(for: revText) ?? [] { history.append(try parseRevision(h)) }
            if rev.generation > 1 && history.isEmpty {
                throw CouchError.badRequest("Revision \(revText) needs its _revisions history")
            }
            let tree = trees[id]
            let resolver = AttachmentResolver(
                docID: rawID,
                lookup: { name, digest in StoredAttachment.held(named: name, digest: digest, in: tree, blobs: self.store.blobs) },
                generation: rev.generation, keepGivenRevpos: true)
            var (body, contents) = try resolver.storedBody(input)
            // 2. Digest: a Ferry-form ID must match its body; other forms cannot be checked.
            stage = "digest"
            let incoming: IncomingRevision
            if rev.isFerryDigest {
                if let original = FerryFormBody.matching(
                    rev, parent: history.first, deleted: input.deleted, body: body, contents: contents, blobs: store.blobs)
                {
                    body = original
                }
                guard
                    let verified = IncomingRevision.verified(
                        id: id, revision: rev, history: history, deleted: input.deleted, body: body, hlc: .zero,
                        canonicalBody: body.canonicalBytes)
                else { throw CouchError.badRequest("Revision \(revText) does not match its body") }
                incoming = verified
            } else {
                incoming = IncomingRevision(id: id, revision: rev, history: history, deleted: input.deleted, body: body)
            }
            // 3. The principal's policy.
            stage = "policy"
            let access = DocumentAccess(principal.policy)
            if input.deleted && !access.policy.mayDelete { throw CouchError.forbidden("You may not delete documents.") }
            if let refusal = access.writeRefusal(
                id: id, body: .object(input.fields), deleted: input.deleted, ancestors: history, existing: tree)
            {
                throw CouchError.forbidden("You may not write document \(id): \(refusal).")
            }
            try checkBlobPossession(body, supplied: contents, id: id, tree: tree, access: access)
            // 4. The node's pull filter.
            stage = "filter"
            if let pullFilter,
                !pullFilter.admits(FilterInput(id: id, revision: rev, deleted: input.deleted, body: body))
            {
                throw CouchError.forbidden("The node's pull filter \(pullFilter.name) does not admit this revision.")
            }
            stage = "structure"
            try storeContents(contents)
            return incoming
        } catch let e as CouchError {
            throw fail(e)
        } catch {
            throw fail(CouchError(.internalServerError, "internal_server_error", "\(error)"))
        }
    }

    /// Logs and counts what became of revisions written with `new_edits=false`: refusals by
    /// stage (as replication's are), stored ones by ID form (CouchDB's cannot be digest-checked).
    func reportReplicated(stored: [IncomingRevision], refused: [DocumentFailure], principal: CouchPrincipal) {
        for failure in refused {
            metrics?.rejected(stage: failure.stage, direction: "couch")
            logger.notice(
                "revision refused",
                metadata: [
                    "doc": "\(failure.id)", "rev": "\(failure.rev ?? "")", "stage": "\(failure.stage)",
                    "reason": "\(failure.error.reason)", "principal": "\(principal.name)",
                ])
        }
        metrics?.received(stored.count)
        metrics?.unverifiable(stored.filter { !$0.revision.isFerryDigest }.count, source: .couch)
    }

    /// A principal that may not read everything may refer only to blobs whose content it
    /// supplies with the write, or that a revision of the same document it may read refers
    /// to: a digest is a hash of content, and knowing it must not open the content.
    func checkBlobPossession(
        _ body: JSON, supplied: [[UInt8]], id: DocumentID, tree: RevisionTree?, access: DocumentAccess
    ) throws(CouchError) {
        guard !access.readsEverything, let refs = try? body.blobReferences(), !refs.isEmpty else { return }
        var allowed = Set(supplied.map { BlobDigest.of($0) })
        var readableScanned = false
        for ref in refs where !allowed.contains(ref.digest) {
            if !readableScanned, let tree {
                readableScanned = true
                for r in tree.revisions where access.mayRead(id, revision: r.id, in: tree) {
                    guard let bytes = r.body, DocumentStore.mayReferenceBlobs(bytes), let old = try? JSON.parse(bytes) else { continue }
                    for known in (try? old.blobReferences()) ?? [] { allowed.insert(known.digest) }
                }
            }
            if !allowed.contains(ref.digest) {
                throw .forbidden("You may not refer to blob \(ref.digest) without sending its content.")
            }
        }
    }

    func storeContents(_ contents: [[UInt8]]) throws(CouchError) {
        for bytes in contents {
            do { try store.blobs.put(bytes) } catch { throw couchError(error) }
        }
    }

    /// The revision an edit names: `?rev=`, `If-Match` or the body's `_rev`, which must agree.
    func editRevision(query: String?, ifMatch: String?, body: String?) throws(CouchError) -> String? {
        let header = ifMatch.map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "\" ")) }
        var found: String?
        for candidate in [query, header, body] {
            guard let candidate else { continue }
            if let f = found, f != candidate {
                throw .badRequest("Document rev from request body and query string have different values")
            }
            found = candidate
        }
        return found
    }
}
