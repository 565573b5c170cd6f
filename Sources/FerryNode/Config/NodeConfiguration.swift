import Crypto
import FerryCore
import FerryCouch
import FerryCouchClient
import FerryStore
import FerrySync
import Foundation
import Logging

/// Everything a node can be configured with, read from a JSON config file and then
/// overridden by command-line flags; every field has a documented default
/// (docs/operations.md is the reference).
public struct NodeConfiguration: Sendable {
    /// A static peer: where it listens and the node ID pinned for it.
    public struct StaticPeer: Sendable, Equatable {
        public var url: String
        public var nodeID: String
        public var name: String?
        public init(url: String, nodeID: String, name: String? = nil) {
            self.url = url
            self.nodeID = nodeID
            self.name = name
        }
    }

    /// A trusted node and what it may do here.
    public struct TrustEntry: Sendable, Equatable {
        public var nodeID: String
        public var name: String?
        public var policy: PeerPolicy
        public init(nodeID: String, name: String? = nil, policy: PeerPolicy = .trusted) {
            self.nodeID = nodeID
            self.name = name
            self.policy = policy
        }
    }

    /// How discovered peers become trusted.
    public enum TrustMode: String, Sendable {
        /// Only node IDs in the trust store (default).
        case pinned
        /// Trust on first use: the first node ID seen in this group is pinned.
        case tofu
    }

    /// Resource limits.
    public struct Limits: Sendable, Equatable {
        public var maxConnections = 64
        public var maxMessageBytes = SyncProtocol.defaultMaxMessageBytes
        public var maxDocumentBytes = 8 << 20
        /// Seconds without traffic before an idle listener connection is closed.
        public var idleTimeoutSeconds = 120
        /// Replication listener connections open at once, counted from accept. Default 128.
        public var maxOpenConnections = 128
        /// Replication listener connections from one address, counted from accept. Default 16.
        public var maxConnectionsPerAddress = 16
        /// Seconds a connection has to finish TLS and the WebSocket upgrade. Default 10.
        public var handshakeTimeoutSeconds = 10
        public init() {}
    }

    /// How the running node deletes blobs that no stored revision refers to.
    public struct BlobCollection: Sendable, Equatable {
        /// Seconds between two collections, the first one interval after start; 0 turns it off. Default 3600.
        public var intervalSeconds = 3600
        /// An unreferenced blob is kept this long after it was last stored or used: a blob
        /// arrives before the revision that refers to it. Default 3600.
        public var graceSeconds = 3600
        /// A partly received blob (kept so a cut transfer resumes) not written for this long
        /// is removed at start and by each collection. Default 86400.
        public var partialMaxAgeSeconds = 86400
        public init() {}
    }

    /// The CouchDB HTTP API: its loopback listener, users, web origins and the opt-in LAN listener.
    public struct Couch: Sendable, Equatable {
        /// The opt-in LAN listener: HTTPS with the node's certificate, configured users only.
        public struct LAN: Sendable, Equatable {
            public var interface = "0.0.0.0"
            public var port = 6984
            public init() {}
        }

        /// Port on 127.0.0.1; 0 picks a free one. Default 4987.
        public var port = 4987
        /// Largest request body; nil: the larger of 64 MiB and limits.maxDocumentBytes + 1 MiB
        /// (`_bulk_docs` batches and base64 attachments are larger than one document).
        public var maxRequestBytes: Int?
        public var users: [CouchUser] = []
        /// Web origins whose pages may call the API (`*`: any, without credentials). Default none.
        public var corsOrigins: [String] = []
        /// Seconds an `AuthSession` cookie lasts. Default 600.
        public var sessionSeconds = 600
        /// nil: no LAN listener (the default).
        public var lan: LAN?
        /// Connections open at once on each CouchDB listener, counted from accept. Default 256.
        public var maxConnections = 256
        /// Connections from one address on each CouchDB listener. Default 64.
        public var maxConnectionsPerAddress = 64
        /// Seconds a connection may go without a complete request before it is closed. Default 30.
        public var idleTimeoutSeconds = 30
        /// Seconds one `_find` may work before it is stopped (500 `timeout`). Default 30.
        public var queryTimeoutSeconds = 30
        public init() {}

        /// The body limit in force with `limits`.
        public func effectiveMaxRequestBytes(_ limits: Limits) -> Int {
            maxRequestBytes ?? max(64 << 20, limits.maxDocumentBytes + (1 << 20))
        }
    }

    public var name = ProcessInfo.processInfo.hostName
    /// The group: the database name in the URL path and in the DNS-SD TXT record.
    public var group = "ferry"
    public var dataDirectory: String?
    public var interface = "0.0.0.0"
    public var port = 4985
    /// Admin API port on 127.0.0.1; 0 picks a free one. Default 4986.
    public var adminPort = 4986
    public var adminInterface = "127.0.0.1"
    /// Web origins (`scheme://host[:port]`) whose requests the admin API accepts; a request
    /// with any other `Origin` header is refused. Default none.
    public var adminAllowedOrigins: [String] = []
    /// Whether `GET /metrics` answers without the admin key. Default false.
    public var adminPublicMetrics = false
    public var discovery = true
    /// Seconds between attempts to reach avahi-daemon while it is away. Default 5.
    public var discoveryRetrySeconds = 5
    public var trustMode = TrustMode.pinned
    public var peers: [StaticPeer] = []
    public var trust: [TrustEntry] = []
    /// Resolver names by document `type`, and the default: keepConflicts, deletesWin,
    /// lastWriteWins, merge.
    public var conflictDefault = "keepConflicts"
    public var conflictsByType: [String: String] = [:]
    /// Applied to every incoming revision (pulled or pushed here).
    public var pullFilter: DocumentRule?
    /// Applied to every write, local or incoming.
    public var validation: DocumentRule?
    public var logLevel: Logger.Level = .info
    public var limits = Limits()
    public var blobCollection = BlobCollection()
    /// When the blobs of incoming revisions are fetched: `eager` (before the revision is
    /// stored; the default), `lazy` (on first read), or eager up to a size.
    public var blobPolicy = BlobFetchPolicy.eager
    /// Per peer node ID, a blob policy that replaces `blobPolicy` for that peer (both for
    /// what this node pulls from it and for what it pushes here).
    public var blobPolicyByPeer: [String: BlobFetchPolicy] = [:]
    public var readOnly = false
    /// Replications declared in the file (resumed on every start).
    public var replications: [ReplicationSpec] = []
    public var couch = Couch()

    // Command-line only (never in the file): development switches and alternatives.
    /// Plaintext ws:// (development only; logged).
    public var insecure = false
    /// Accept any client certificate (development only; logged).
    public var acceptAnyPeer = false
    /// HTTP Basic credentials instead of client certificates.
    public var password: (user: String, password: String)?
    /// Also serve replication on this Unix domain socket.
    public var unixSocket: String?

    public init() {}

    /// The conflict resolvers the configuration names.
    public var resolvers: ResolverSet {
        ResolverSet(
            fallback: Self.resolver(named: conflictDefault) ?? .keepConflicts,
            byType: conflictsByType.compactMapValues(Self.resolver(named:)))
    }

    /// Every name a conflict policy goes by, in the config file and in `ferry sync --resolve`
    /// alike (docs/operations.md lists them): `default` and `lww` are aliases.
    public static let resolverNames = ["keepConflicts", "default", "deletesWin", "lastWriteWins", "lww", "merge"]

    /// The resolver a policy name stands for; nil for a name not in `resolverNames`.
    public static func resolver(named name: String) -> ConflictResolver? {
        switch name {
        case "keepConflicts", "default": return .keepConflicts
        case "deletesWin": return .deletesWin
        case "lastWriteWins", "lww": return .lastWriteWins
        case "merge": return .merge
        default: return nil
        }
    }

    /// Whether an address is a loopback address the admin API may bind to.
    public static func isLoopback(_ host: String) -> Bool {
        host == "127.0.0.1" || host == "::1" || host == "localhost" || host.hasPrefix("127.")
    }
}

/// A declarative rule over documents, used for pull filters and validation: document-ID
/// globs, allowed `type` values, a maximum body size and required fields with their JSON types.
public struct DocumentRule: Sendable, Equatable {
    public var idPatterns: [String] = []
    public var types: [String] = []
    public var maxBytes: Int?
    /// Field name → JSON type (string, number, boolean, object, array, null, any).
    public var required: [String: String] = [:]
    public init() {}

    static let typeNames: Set<String> = ["string", "number", "boolean", "object", "array", "null", "any"]

    /// Why a revision breaks the rule, or nil when it passes. Tombstones only face the ID rule.
    public func violation(id: DocumentID, deleted: Bool, body: JSON, size: Int?) -> String? {
        if !idPatterns.isEmpty, !idPatterns.contains(where: { Glob.matches($0, id.rawValue) }) {
            return "document ID \(id.rawValue) matches none of \(idPatterns)"
        }
        if deleted { return nil }
        if let maxBytes, let size, size > maxBytes { return "body is \(size) bytes, more than \(maxBytes)" }
        if !types.isEmpty {
            guard let type = body["type"]?.stringValue, types.contains(type) else {
                return "type \(body["type"].map { "\($0)" } ?? "missing") is not one of \(types)"
            }
        }
        for (field, type) in required.sorted(by: { $0.key < $1.key }) {
            guard let value = body[field] else { return "required field \"\(field)\" is missing" }
            if type != "any", value.typeName != type {
                return "field \"\(field)\" must be \(type), not \(value.typeName)"
            }
        }
        return nil
    }

    /// The rule as a pull filter; its name (part of checkpoint keys) changes with its content.
    public func filter(name: String) -> RevisionFilter {
        let rule = self
        let digest = Hex.encode(SHA256.hash(data: Array("\(rule)".utf8))).prefix(12)
        return RevisionFilter(name: "\(name)-\(digest)") { input in
            rule.violation(id: input.id, deleted: input.deleted, body: input.body, size: input.body.canonicalBytes.count) == nil
        }
    }
}

/// A replication to run, in a direction: with a Ferry peer (a `wss://` URL and its pinned
/// node ID) or with a CouchDB-protocol database (an `http(s)://` URL and `couch` options).
public struct ReplicationSpec: Sendable, Equatable {
    public var id: String
    /// As given: for a CouchDB URL it may hold `user:password@`, so show `displayURL` instead.
    public var url: String
    /// The Ferry peer's pinned node ID; nil for a CouchDB replication.
    public var peerID: String?
    public var direction: ReplicatorConfiguration.Direction = .pushAndPull
    public var continuous = true
    public var documentIDs: [String]?
    /// When the blobs this replication pulls are fetched; nil: the peer's or the node's policy.
    public var blobPolicy: BlobFetchPolicy?
    /// The CouchDB-only options; nil for a Ferry peer.
    public var couch: CouchReplicationOptions?

    /// A replication with a Ferry peer.
    public init(id: String, url: String, peerID: String) {
        self.id = id
        self.url = url
        self.peerID = peerID
    }

    /// A replication with a CouchDB-protocol database at `couchURL` (`http(s)://…/db`).
    public init(id: String, couchURL: String, options: CouchReplicationOptions = .init()) {
        self.id = id
        url = couchURL
        couch = options
    }

    /// Whether the other side is a CouchDB-protocol database.
    public var isCouch: Bool { couch != nil }

    /// The URL without any password: what status, logs and the admin API show.
    public var displayURL: String { isCouch ? CouchEndpoint.redact(url) : url }

    /// The stored form (the config file's keys), password included when the URL holds one.
    public var json: JSON {
        var o: [String: JSON] = [
            "id": .string(id), "url": .string(url), "direction": .string(direction.rawValue), "continuous": .bool(continuous),
        ]
        if let peerID { o["peer"] = .string(peerID) }
        if let documentIDs { o["documentIDs"] = .array(documentIDs.map { .string($0) }) }
        if let blobPolicy { o["blobs"] = .string(blobPolicy.description) }
        if let couch { o.merge(couch.json) { a, _ in a } }
        return .object(o)
    }

    /// What the admin API lists: the stored form with the URL's password left out.
    public var publicJSON: JSON {
        var o = json.objectValue ?? [:]
        o["url"] = .string(displayURL)
        return .object(o)
    }
}

/// A configuration error naming the file, the key and the reason.
public struct ConfigError: FerryError, Equatable {
    public let file: String
    public let key: String
    public let reason: String
    public var domain: String { "config" }
    public var code: String { "bad_config" }
    public var failure: FailureKind { .invalidRequest }
    public var isTransient: Bool { false }
    public var description: String { key.isEmpty ? "\(file): \(reason)" : "\(file): \(key): \(reason)" }
    public init(file: String, key: String, reason: String) {
        self.file = file
        self.key = key
        self.reason = reason
    }
}

extension NodeConfiguration {
    /// Reads a JSON config file. Unknown keys are errors, so a typo never passes silently.
    public static func load(file: String) throws(ConfigError) -> NodeConfiguration {
        guard let data = FileManager.default.contents(atPath: file) else {
            throw ConfigError(file: file, key: "", reason: "cannot read the file")
        }
        let json: JSON
        do { json = try JSON.parse(Array(data)) } catch {
            throw ConfigError(file: file, key: "", reason: "not valid JSON: \(error)")
        }
        return try parse(json, file: file)
    }

    /// Builds a configuration from parsed JSON; `file` names the source in errors.
    public static func parse(_ json: JSON, file: String) throws(ConfigError) -> NodeConfiguration {
        var reader = ConfigReader(file: file)
        return try reader.read(json)
    }
}
