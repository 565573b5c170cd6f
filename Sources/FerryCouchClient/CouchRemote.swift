import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import Logging

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
    let pullState = Locked(CouchPullState())
    /// The attachment downloads' shared state (CouchRemote+Attachments.swift).
    let downloadState = Locked(CouchDownloadState())
    /// The push side's state between verbs (CouchRemote+Push.swift).
    let pushState = Locked(CouchPushState())
    /// Where attachment bytes are counted as they move (the replication's progress).
    let blobCounter = Locked<BlobCounter?>(nil)

    func countBlobs(with counter: @escaping BlobCounter) { blobCounter.withLock { $0 = counter } }

    /// Adds to the replication's blob totals, once a replicator has asked for them.
    func countBlob(_ change: (inout ReplicationSummary) -> Void) { blobCounter.withLock { $0 }?(change) }
    /// What this run's checkpoint documents record (CouchRemote+Checkpoint.swift).
    let checkpointState = Locked(CouchCheckpointState())
    /// The HTTP client's byte counts (one client serves every attempt of a replication;
    /// the replicator counts from when each attempt opens).
    var traffic: Locked<Connection.Counters>? { http.traffic }
    /// Wall-clock time for the checkpoint history's `start_time`/`end_time` (labels only:
    /// nothing waits on it).
    let wallClock: @Sendable () -> Date = { Date() }

    init(
        http: CouchHTTP, store: DocumentStore, identity: RemoteIdentity, capabilities: CouchServerCapabilities, logger: Logger
    ) {
        self.http = http
        self.store = store
        self.identity = identity
        self.capabilities = capabilities
        self.logger = logger
        sessionID = UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        pullState.withLock { $0.bulkGet = capabilities.bulkGet }
    }

    /// Verifies the server (`GET /`) and the database (`GET /{db}`; created first when
    /// `endpoint.createTarget` and missing), and returns the remote. 401/403/404 are permanent.
    static func open(http: CouchHTTP, store: DocumentStore, logger: Logger) async throws -> CouchRemote {
        let endpoint = http.endpoint
        let root = try await http.send(.GET, "/")
        guard (200..<300).contains(root.status) else { throw CouchClientError.http(root, method: .GET, path: "/", endpoint: endpoint) }
        guard let welcome = root.json?.objectValue, welcome["couchdb"] != nil else {
            throw CouchClientError(
                .notCouchDB,
                message: "\(endpoint.serverURL) answered GET / without a CouchDB welcome: is this a CouchDB-protocol server?",
                isTransient: false, status: root.status)
        }
        var capabilities = CouchServerCapabilities()
        capabilities.serverUUID = welcome["uuid"]?.stringValue
        capabilities.vendor = welcome["vendor"]?["name"]?.stringValue ?? ""
        capabilities.version = welcome["version"]?.stringValue ?? ""

        let dbPath = http.databasePath()
        var info = try await http.send(.GET, dbPath)
        if info.status == 404 && endpoint.createTarget {
            let made = try await http.send(.PUT, dbPath)
            // 412: made meanwhile by someone else, which is as good.
            guard (200..<300).contains(made.status) || made.status == 412 else {
                throw CouchClientError.http(made, method: .PUT, path: dbPath, endpoint: endpoint)
            }
            logger.notice("created the CouchDB database", metadata: ["database": "\(endpoint.redacted)"])
            info = try await http.send(.GET, dbPath)
        }
        if info.status == 404 {
            throw CouchClientError(
                .databaseMissing,
                message: "the database \(endpoint.redacted) does not exist: create it on the server "
                    + "(PUT \(endpoint.redacted)) or replicate with --create-target",
                isTransient: false, status: 404)
        }
        guard (200..<300).contains(info.status) else { throw CouchClientError.http(info, method: .GET, path: dbPath, endpoint: endpoint) }

        let identity = RemoteIdentity(
            databaseID: databaseID(endpoint: endpoint, serverUUID: capabilities.serverUUID), peerID: endpoint.redacted,
            allowsPull: true, allowsPush: true, inline: false, heartbeat: false)
        logger.debug(
            "opened a CouchDB-protocol database",
            metadata: [
                "database": "\(endpoint.redacted)", "vendor": "\(capabilities.vendor)", "version": "\(capabilities.version)",
            ])
        return CouchRemote(http: http, store: store, identity: identity, capabilities: capabilities, logger: logger)
    }

    /// The remote database's ID in checkpoint keys: the server's UUID and the database name
    /// when the server states a UUID (so a server that moves keeps its checkpoints), else
    /// the URL without credentials.
    static func databaseID(endpoint: CouchEndpoint, serverUUID: String?) -> String {
        if let uuid = serverUUID, !uuid.isEmpty { return "couch:\(uuid)/\(endpoint.database)" }
        return "couch:\(endpoint.redacted)"
    }

    /// The escaped path suffix of a document: `_design/` and `_local/` keep their slash.
    static func documentSuffix(_ id: String) -> String {
        for prefix in ["_design/", "_local/"] where id.hasPrefix(prefix) && id.count > prefix.count {
            return prefix + CouchEndpoint.escapeDatabase(String(id.dropFirst(prefix.count)))
        }
        return CouchEndpoint.escapeDatabase(id)
    }

    func close(error: SyncError?) async {
        // Live changes are read as longpoll requests: no feed stays open between verbs.
    }
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
