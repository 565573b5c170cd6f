import FerryCore
import FerryStore
import FerrySync
import Foundation

/// The push side's state between verbs of one connection.
struct CouchPushState {}

extension CouchRemote {
    /// `POST /{db}/_revs_diff`.
    func revsDiff(_ docs: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] {
        throw CouchClientError(code: "not_implemented", message: "revsDiff", isTransient: false)
    }

    /// `POST /{db}/_bulk_docs` with `new_edits: false`, attachments inline unless the target
    /// holds them already; `_ensure_full_commit` when the target asks for it.
    func storeRevisions(_ revisions: [WireRevision]) async throws -> [PutResult] {
        throw CouchClientError(code: "not_implemented", message: "storeRevisions", isTransient: false)
    }

    func missingBlobs(_ digests: [BlobDigest]) async throws -> [BlobDigest] {
        throw CouchClientError(code: "not_implemented", message: "missingBlobs", isTransient: false)
    }

    func putBlob(_ digest: BlobDigest, content: [UInt8]) async throws {
        throw CouchClientError(code: "not_implemented", message: "putBlob", isTransient: false)
    }
}
