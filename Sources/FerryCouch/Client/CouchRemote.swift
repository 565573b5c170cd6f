import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging
import Synchronization

/// A `RemoteDatabase` reached over the CouchDB replication protocol (HTTP/1.1 to Apache
/// CouchDB, Cloudant, PouchDB Server or a Ferry node's CouchDB API): each verb becomes the
/// protocol's requests, and attachments move between CouchDB documents and this node's
/// blob store.
final class CouchRemote: RemoteDatabase {
    let http: CouchHTTP
    /// This node's store: attachments pulled go into its blob store, attachments pushed come from it.
    let store: DocumentStore
    let identity: RemoteIdentity
    let logger: Logger
    /// This run's `session_id` in the checkpoint documents' history.
    let sessionID: String
    /// What the server offers, learnt when opened.
    let capabilities: CouchServerCapabilities
    /// The pull side's state between verbs (CouchRemote+Pull.swift).
    let pullState = Mutex(CouchPullState())
    /// The push side's state between verbs (CouchRemote+Push.swift).
    let pushState = Mutex(CouchPushState())

    init(
        http: CouchHTTP, store: DocumentStore, identity: RemoteIdentity, capabilities: CouchServerCapabilities, logger: Logger
    ) {
        self.http = http
        self.store = store
        self.identity = identity
        self.capabilities = capabilities
        self.logger = logger
        sessionID = UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
    }

    /// Verifies the server (`GET /`) and the database (`GET /{db}`; created first when
    /// `endpoint.createTarget` and missing), and returns the remote. 401/403/404 are permanent.
    static func open(http: CouchHTTP, store: DocumentStore, logger: Logger) async throws -> CouchRemote {
        throw CouchClientError(code: "not_implemented", message: "CouchRemote.open", isTransient: false)
    }

    // MARK: Local documents and checkpoints

    func localDocument(_ id: String) async throws -> JSON? {
        throw CouchClientError(code: "not_implemented", message: "localDocument", isTransient: false)
    }

    func putLocalDocument(_ id: String, value: JSON) async throws {
        throw CouchClientError(code: "not_implemented", message: "putLocalDocument", isTransient: false)
    }

    func checkpoint(_ id: String, direction: CheckpointDirection) async throws -> RemoteCheckpoint {
        throw CouchClientError(code: "not_implemented", message: "checkpoint", isTransient: false)
    }

    func putCheckpoint(_ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool) async throws {
        throw CouchClientError(code: "not_implemented", message: "putCheckpoint", isTransient: false)
    }

    func close(error: SyncError?) async {}
}

/// What a CouchDB-protocol server offers, learnt from `GET /` and tried requests.
struct CouchServerCapabilities: Sendable, Equatable {
    /// The server's `uuid` from `GET /` (nil when it gives none).
    var serverUUID: String?
    /// `vendor.name` / `version` from `GET /`, for logs.
    var vendor: String = ""
    var version: String = ""
    /// Whether `POST /{db}/_bulk_get` works (else `GET /{db}/{id}?open_revs=…`).
    var bulkGet = true
}
