import FerryCore
import FerryStore
import FerrySync
import Foundation

/// The pull side's state between verbs of one connection.
struct CouchPullState {}

extension CouchRemote {
    /// `GET /{db}/_changes?style=all_docs&since=…` (normal pages; longpoll when live), with
    /// `filter=_doc_ids` or `_selector` when asked.
    func changes(_ request: RemoteChangesRequest) async throws -> RemoteChanges {
        throw CouchClientError(code: "not_implemented", message: "changes", isTransient: false)
    }

    /// `POST /{db}/_bulk_get?revs=true&latest=true&attachments=true` with `atts_since`
    /// (or `GET /{db}/{id}?open_revs=…` without `_bulk_get`); attachments go into the blob store.
    func fetchRevisions(_ requests: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        throw CouchClientError(code: "not_implemented", message: "fetchRevisions", isTransient: false)
    }

    func blob(_ digest: BlobDigest) async throws -> [UInt8] {
        throw CouchClientError(code: "not_implemented", message: "blob", isTransient: false)
    }
}
