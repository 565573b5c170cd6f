import Crypto
import FerryCore
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
        public var maxMessageBytes = 16 << 20
        public var maxDocumentBytes = 8 << 20
        /// Seconds without traffic before an idle listener connection is closed.
        public var idleTimeoutSeconds = 120
        public init() {}
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
    public var readOnly = false
    /// Replications declared in the file (resumed on every start).
    public var replications: [ReplicationSpec] = []

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

/// A replication to run: to a URL with a pinned node ID, in a direction.
public struct ReplicationSpec: Sendable, Equatable {
    public var id: String
    public var url: String
    public var peerID: String
    public var direction: ReplicatorConfiguration.Direction = .pushAndPull
    public var continuous = true
    public var documentIDs: [String]?
    public init(id: String, url: String, peerID: String) {
        self.id = id
        self.url = url
        self.peerID = peerID
    }

    public var json: JSON {
        var o: [String: JSON] = [
            "id": .string(id), "url": .string(url), "peer": .string(peerID), "direction": .string(direction.rawValue),
            "continuous": .bool(continuous),
        ]
        if let documentIDs { o["documentIDs"] = .array(documentIDs.map { .string($0) }) }
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

/// Walks a config JSON value, keeping the key path for errors.
struct ConfigReader {
    let file: String

    func fail(_ key: String, _ reason: String) -> ConfigError { ConfigError(file: file, key: key, reason: reason) }

    func object(_ value: JSON, _ key: String, allowed: Set<String>) throws(ConfigError) -> [String: JSON] {
        guard let o = value.objectValue else { throw fail(key, "must be an object, not \(value.typeName)") }
        for k in o.keys.sorted() where !allowed.contains(k) {
            throw fail(key.isEmpty ? k : "\(key).\(k)", "unknown key (allowed: \(allowed.sorted().joined(separator: ", ")))")
        }
        return o
    }

    func string(_ value: JSON, _ key: String) throws(ConfigError) -> String {
        guard let s = value.stringValue else { throw fail(key, "must be a string, not \(value.typeName)") }
        return s
    }

    func strings(_ value: JSON, _ key: String) throws(ConfigError) -> [String] {
        guard case .array(let items) = value else { throw fail(key, "must be an array of strings") }
        var out: [String] = []
        for (i, item) in items.enumerated() { out.append(try string(item, "\(key)[\(i)]")) }
        return out
    }

    /// A node's or trust entry's name: a string without control characters (`NodeName`).
    func name(_ value: JSON, _ key: String) throws(ConfigError) -> String {
        let s = try string(value, key)
        do { try NodeName.validate(s) } catch { throw fail(key, error.reason) }
        return s
    }

    func int(_ value: JSON, _ key: String, _ range: ClosedRange<Int>) throws(ConfigError) -> Int {
        guard let i = value.intValue, range.contains(Int(i)) else {
            throw fail(key, "must be an integer in \(range.lowerBound)...\(range.upperBound)")
        }
        return Int(i)
    }

    func bool(_ value: JSON, _ key: String) throws(ConfigError) -> Bool {
        guard let b = value.boolValue else { throw fail(key, "must be true or false") }
        return b
    }

    func nodeID(_ value: JSON, _ key: String) throws(ConfigError) -> String {
        guard let id = NodeIDFormat.normalized(try string(value, key)) else { throw fail(key, NodeIDFormat.requirement) }
        return id
    }

    func url(_ value: JSON, _ key: String) throws(ConfigError) -> String {
        let s = try string(value, key)
        guard s.hasPrefix("wss://") || s.hasPrefix("ws://"), URL(string: s)?.host != nil else {
            throw fail(key, "must be a wss://HOST:PORT/GROUP/sync URL")
        }
        return s
    }

    mutating func read(_ json: JSON) throws(ConfigError) -> NodeConfiguration {
        var c = NodeConfiguration()
        let top = try object(json, "", allowed: [
            "name", "group", "data", "listen", "admin", "discovery", "peers", "trust", "conflicts", "pullFilter",
            "validation", "logLevel", "limits", "readOnly", "replications",
        ])
        if let v = top["name"] { c.name = try name(v, "name") }
        if let v = top["group"] {
            c.group = try string(v, "group")
            guard !c.group.isEmpty, c.group.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }) else {
                throw fail("group", "use letters, digits, - and _ only (it is a URL path segment)")
            }
        }
        if let v = top["data"] { c.dataDirectory = try string(v, "data") }
        if let v = top["listen"] {
            let o = try object(v, "listen", allowed: ["interface", "port"])
            if let i = o["interface"] { c.interface = try string(i, "listen.interface") }
            if let p = o["port"] { c.port = try int(p, "listen.port", 0...65535) }
        }
        if let v = top["admin"] {
            let o = try object(v, "admin", allowed: ["interface", "port", "allowedOrigins", "publicMetrics"])
            if let i = o["interface"] {
                c.adminInterface = try string(i, "admin.interface")
                guard NodeConfiguration.isLoopback(c.adminInterface) else {
                    throw fail("admin.interface", "the admin API serves on loopback only (127.0.0.1 or ::1), not \(c.adminInterface)")
                }
            }
            if let p = o["port"] { c.adminPort = try int(p, "admin.port", 0...65535) }
            if let x = o["allowedOrigins"] {
                c.adminAllowedOrigins = try strings(x, "admin.allowedOrigins")
                for (i, origin) in c.adminAllowedOrigins.enumerated() {
                    guard let u = URL(string: origin), u.scheme != nil, u.host != nil, u.path.isEmpty else {
                        throw fail("admin.allowedOrigins[\(i)]", "must be an origin such as http://localhost:8080 (scheme, host, optional port)")
                    }
                }
            }
            if let x = o["publicMetrics"] { c.adminPublicMetrics = try bool(x, "admin.publicMetrics") }
        }
        if let v = top["discovery"] {
            let o = try object(v, "discovery", allowed: ["enabled", "trust", "retrySeconds"])
            if let e = o["enabled"] { c.discovery = try bool(e, "discovery.enabled") }
            if let r = o["retrySeconds"] { c.discoveryRetrySeconds = try int(r, "discovery.retrySeconds", 1...3600) }
            if let t = o["trust"] {
                guard let mode = NodeConfiguration.TrustMode(rawValue: try string(t, "discovery.trust")) else {
                    throw fail("discovery.trust", "must be \"pinned\" or \"tofu\"")
                }
                c.trustMode = mode
            }
        }
        if let v = top["peers"] {
            guard case .array(let items) = v else { throw fail("peers", "must be an array") }
            for (i, item) in items.enumerated() {
                let key = "peers[\(i)]"
                let o = try object(item, key, allowed: ["url", "id", "name"])
                guard let u = o["url"] else { throw fail("\(key).url", "is required") }
                guard let id = o["id"] else { throw fail("\(key).id", "is required: the peer's pinned node ID") }
                c.peers.append(.init(url: try url(u, "\(key).url"), nodeID: try nodeID(id, "\(key).id"), name: try o["name"].map { v throws(ConfigError) in try name(v, "\(key).name") }))
            }
        }
        if let v = top["trust"] {
            guard case .array(let items) = v else { throw fail("trust", "must be an array") }
            for (i, item) in items.enumerated() {
                c.trust.append(try trustEntry(item, "trust[\(i)]"))
            }
        }
        if let v = top["conflicts"] {
            let o = try object(v, "conflicts", allowed: ["default", "types"])
            if let d = o["default"] { c.conflictDefault = try resolverName(d, "conflicts.default") }
            if let t = o["types"] {
                guard let types = t.objectValue else { throw fail("conflicts.types", "must be an object of type → policy") }
                for (type, name) in types { c.conflictsByType[type] = try resolverName(name, "conflicts.types.\(type)") }
            }
        }
        if let v = top["pullFilter"] { c.pullFilter = try rule(v, "pullFilter") }
        if let v = top["validation"] { c.validation = try rule(v, "validation") }
        if let v = top["logLevel"] {
            guard let level = Logger.Level(rawValue: try string(v, "logLevel")) else {
                throw fail("logLevel", "must be one of trace, debug, info, notice, warning, error, critical")
            }
            c.logLevel = level
        }
        if let v = top["limits"] {
            let o = try object(v, "limits", allowed: ["maxConnections", "maxMessageBytes", "maxDocumentBytes", "idleTimeoutSeconds"])
            if let x = o["maxConnections"] { c.limits.maxConnections = try int(x, "limits.maxConnections", 1...100_000) }
            if let x = o["maxMessageBytes"] { c.limits.maxMessageBytes = try int(x, "limits.maxMessageBytes", 1024...(1 << 30)) }
            if let x = o["maxDocumentBytes"] { c.limits.maxDocumentBytes = try int(x, "limits.maxDocumentBytes", 64...(1 << 30)) }
            if let x = o["idleTimeoutSeconds"] { c.limits.idleTimeoutSeconds = try int(x, "limits.idleTimeoutSeconds", 5...86_400) }
        }
        if let v = top["readOnly"] { c.readOnly = try bool(v, "readOnly") }
        if let v = top["replications"] {
            guard case .array(let items) = v else { throw fail("replications", "must be an array") }
            for (i, item) in items.enumerated() {
                let spec = try replication(item, "replications[\(i)]", defaultID: "config-\(i)")
                if c.replications.contains(where: { $0.id == spec.id }) { throw fail("replications[\(i)].id", "duplicate id \(spec.id)") }
                c.replications.append(spec)
            }
        }
        return c
    }

    func resolverName(_ v: JSON, _ key: String) throws(ConfigError) -> String {
        let name = try string(v, key)
        guard NodeConfiguration.resolver(named: name) != nil else {
            throw fail(key, "unknown conflict policy \"\(name)\" (use \(NodeConfiguration.resolverNames.joined(separator: ", ")))")
        }
        return name
    }

    func trustEntry(_ item: JSON, _ key: String) throws(ConfigError) -> NodeConfiguration.TrustEntry {
        let o = try object(item, key, allowed: ["id", "name", "policy"])
        guard let id = o["id"] else { throw fail("\(key).id", "is required") }
        var entry = NodeConfiguration.TrustEntry(nodeID: try nodeID(id, "\(key).id"))
        if let n = o["name"] { entry.name = try name(n, "\(key).name") }
        if let p = o["policy"] { entry.policy = try policy(p, "\(key).policy") }
        return entry
    }

    /// A change to an existing trust entry, `{"id"?, "name"?, "policy"?: {"read"?, "write"?,
    /// "mayDelete"?}}`: only the keys given change (`"name": null` removes the name).
    func trustChange(_ item: JSON, _ key: String, id: String) throws(ConfigError) -> TrustStore.Change {
        let o = try object(item, key, allowed: ["id", "name", "policy"])
        if let given = o["id"], try nodeID(given, "\(key).id") != id {
            throw fail("\(key).id", "does not match the node ID in the URL")
        }
        var change = TrustStore.Change()
        if let n = o["name"] { change.name = n == .null ? .some(nil) : .some(try name(n, "\(key).name")) }
        if let p = o["policy"] {
            let po = try object(p, "\(key).policy", allowed: ["read", "write", "mayDelete"])
            if let r = po["read"] { change.read = try access(r, "\(key).policy.read") }
            if let w = po["write"] { change.write = try access(w, "\(key).policy.write") }
            if let d = po["mayDelete"] { change.mayDelete = try bool(d, "\(key).policy.mayDelete") }
        }
        return change
    }

    func policy(_ v: JSON, _ key: String) throws(ConfigError) -> PeerPolicy {
        let o = try object(v, key, allowed: ["read", "write", "mayDelete"])
        var p = PeerPolicy()
        if let r = o["read"] { p.read = try access(r, "\(key).read") }
        if let w = o["write"] { p.write = try access(w, "\(key).write") }
        if let d = o["mayDelete"] { p.mayDelete = try bool(d, "\(key).mayDelete") }
        return p
    }

    /// `{"ids": [globs], "prefixes": [...], "types": [...]}`, or `"all"` / `"none"`.
    func access(_ v: JSON, _ key: String) throws(ConfigError) -> AccessRule {
        if let s = v.stringValue {
            switch s {
            case "all": return .all
            case "none": return .none
            default: throw fail(key, "must be \"all\", \"none\" or an object with ids, prefixes, types")
            }
        }
        let o = try object(v, key, allowed: ["ids", "prefixes", "types"])
        let rule = AccessRule(
            idPrefixes: try o["prefixes"].map { v throws(ConfigError) in try strings(v, "\(key).prefixes") } ?? [],
            idPatterns: try o["ids"].map { v throws(ConfigError) in try strings(v, "\(key).ids") } ?? [],
            types: try o["types"].map { v throws(ConfigError) in try strings(v, "\(key).types") } ?? [])
        // An empty object would admit everything, which is never what a restriction means.
        return rule.admitsEverything ? .none : rule
    }

    func rule(_ v: JSON, _ key: String) throws(ConfigError) -> DocumentRule {
        let o = try object(v, key, allowed: ["ids", "types", "maxBytes", "required"])
        var r = DocumentRule()
        if let x = o["ids"] { r.idPatterns = try strings(x, "\(key).ids") }
        if let x = o["types"] { r.types = try strings(x, "\(key).types") }
        if let x = o["maxBytes"] { r.maxBytes = try int(x, "\(key).maxBytes", 1...(1 << 30)) }
        if let x = o["required"] {
            guard let fields = x.objectValue else { throw fail("\(key).required", "must be an object of field → type") }
            for (field, type) in fields {
                let t = try string(type, "\(key).required.\(field)")
                guard DocumentRule.typeNames.contains(t) else {
                    throw fail("\(key).required.\(field)", "unknown type \"\(t)\" (use \(DocumentRule.typeNames.sorted().joined(separator: ", ")))")
                }
                r.required[field] = t
            }
        }
        return r
    }

    func replication(_ item: JSON, _ key: String, defaultID: String) throws(ConfigError) -> ReplicationSpec {
        let o = try object(item, key, allowed: ["id", "url", "peer", "direction", "continuous", "documentIDs"])
        guard let u = o["url"] else { throw fail("\(key).url", "is required") }
        guard let p = o["peer"] else { throw fail("\(key).peer", "is required: the pinned node ID of the URL's node") }
        let id = try o["id"].map { v throws(ConfigError) in try string(v, "\(key).id") } ?? defaultID
        guard !id.isEmpty, id.utf8.count <= 100, !id.contains("/") else { throw fail("\(key).id", "must be 1–100 characters without /") }
        var spec = ReplicationSpec(id: id, url: try url(u, "\(key).url"), peerID: try nodeID(p, "\(key).peer"))
        if let d = o["direction"] {
            guard let dir = ReplicatorConfiguration.Direction(rawValue: try string(d, "\(key).direction")) else {
                throw fail("\(key).direction", "must be push, pull or pushAndPull")
            }
            spec.direction = dir
        }
        if let c = o["continuous"] { spec.continuous = try bool(c, "\(key).continuous") }
        if let d = o["documentIDs"] {
            let ids = try strings(d, "\(key).documentIDs")
            for (i, s) in ids.enumerated() where (try? DocumentID(s)) == nil {
                throw fail("\(key).documentIDs[\(i)]", "\"\(s)\" is not a valid document ID")
            }
            spec.documentIDs = ids
        }
        return spec
    }
}

extension TrustStore.Change {
    /// Parses a change in the API's form (`{"name"?, "policy"?}`) for entry `id`; `source` names it in errors.
    public init(parsing json: JSON, id: String, source: String) throws(ConfigError) {
        self = try ConfigReader(file: source).trustChange(json, "", id: id)
    }
}

extension NodeConfiguration.TrustEntry {
    /// Parses an entry in the config file's form (`{"id","name","policy"}`); `source` names it in errors.
    public init(parsing json: JSON, source: String) throws(ConfigError) {
        self = try ConfigReader(file: source).trustEntry(json, "")
    }
}
