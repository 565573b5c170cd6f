import Crypto
import FerryCore
import FerryCouch
import FerryCouchClient
import FerryStore
import FerrySync
import Foundation
import Logging

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
            "validation", "logLevel", "limits", "readOnly", "replications", "couch",
            "blobCollection", "blobs",
        ])
        if let v = top["name"] { c.name = try name(v, "name") }
        if let v = top["group"] {
            c.group = try string(v, "group")
            guard !c.group.isEmpty, c.group.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }) else {
                throw fail("group", "use letters, digits, - and _ only (it is a URL path segment)")
            }
        }
        if let v = top["data"] { c.dataDirectory = try string(v, "data") }
        if let v = top["listen"] { try readListen(v, into: &c) }
        if let v = top["admin"] { try readAdmin(v, into: &c) }
        if let v = top["discovery"] { try readDiscovery(v, into: &c) }
        if let v = top["peers"] { try readPeers(v, into: &c) }
        if let v = top["trust"] { try readTrust(v, into: &c) }
        if let v = top["conflicts"] { try readConflicts(v, into: &c) }
        if let v = top["pullFilter"] { c.pullFilter = try rule(v, "pullFilter") }
        if let v = top["validation"] { c.validation = try rule(v, "validation") }
        if let v = top["logLevel"] {
            guard let level = Logger.Level(rawValue: try string(v, "logLevel")) else {
                throw fail("logLevel", "must be one of trace, debug, info, notice, warning, error, critical")
            }
            c.logLevel = level
        }
        if let v = top["limits"] { try readLimits(v, into: &c) }
        if let v = top["blobCollection"] { try readBlobCollection(v, into: &c) }
        if let v = top["readOnly"] { c.readOnly = try bool(v, "readOnly") }
        if let v = top["blobs"] { try readBlobs(v, into: &c) }
        if let v = top["replications"] { try readReplications(v, into: &c) }
        if let v = top["couch"] { c.couch = try couch(v, "couch") }
        return c
    }

    /// `listen`: the replication listener's interface and port.
    func readListen(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        let o = try object(v, "listen", allowed: ["interface", "port"])
        if let i = o["interface"] { c.interface = try string(i, "listen.interface") }
        if let p = o["port"] { c.port = try int(p, "listen.port", 0...65535) }
    }

    /// `admin`: the admin API: loopback interface, port, allowed origins, public metrics.
    func readAdmin(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
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

    /// `discovery`: DNS-SD: on or off, its retry, and whether the first peer seen is trusted.
    func readDiscovery(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
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

    /// `peers`: static peers, each a pinned URL.
    func readPeers(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        guard case .array(let items) = v else { throw fail("peers", "must be an array") }
        for (i, item) in items.enumerated() {
            let key = "peers[\(i)]"
            let o = try object(item, key, allowed: ["url", "id", "name"])
            guard let u = o["url"] else { throw fail("\(key).url", "is required") }
            guard let id = o["id"] else { throw fail("\(key).id", "is required: the peer's pinned node ID") }
            c.peers.append(.init(url: try url(u, "\(key).url"), nodeID: try nodeID(id, "\(key).id"), name: try o["name"].map { v throws(ConfigError) in try name(v, "\(key).name") }))
        }
    }

    /// `trust`: trusted peers and their policies.
    func readTrust(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        guard case .array(let items) = v else { throw fail("trust", "must be an array") }
        for (i, item) in items.enumerated() {
            c.trust.append(try trustEntry(item, "trust[\(i)]"))
        }
    }

    /// `conflicts`: the conflict policy, by default and per document type.
    func readConflicts(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        let o = try object(v, "conflicts", allowed: ["default", "types"])
        if let d = o["default"] { c.conflictDefault = try resolverName(d, "conflicts.default") }
        if let t = o["types"] {
            guard let types = t.objectValue else { throw fail("conflicts.types", "must be an object of type → policy") }
            for (type, name) in types { c.conflictsByType[type] = try resolverName(name, "conflicts.types.\(type)") }
        }
    }

    /// `limits`: connection and size limits of the replication listener.
    func readLimits(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        let o = try object(v, "limits", allowed: [
            "maxConnections", "maxMessageBytes", "maxDocumentBytes", "idleTimeoutSeconds", "maxOpenConnections",
            "maxConnectionsPerAddress", "handshakeTimeoutSeconds",
        ])
        if let x = o["maxConnections"] { c.limits.maxConnections = try int(x, "limits.maxConnections", 1...100_000) }
        if let x = o["maxMessageBytes"] { c.limits.maxMessageBytes = try int(x, "limits.maxMessageBytes", 1024...(1 << 30)) }
        if let x = o["maxDocumentBytes"] { c.limits.maxDocumentBytes = try int(x, "limits.maxDocumentBytes", 64...(1 << 30)) }
        if let x = o["idleTimeoutSeconds"] { c.limits.idleTimeoutSeconds = try int(x, "limits.idleTimeoutSeconds", 5...86_400) }
        if let x = o["maxOpenConnections"] { c.limits.maxOpenConnections = try int(x, "limits.maxOpenConnections", 1...1_000_000) }
        if let x = o["maxConnectionsPerAddress"] {
            c.limits.maxConnectionsPerAddress = try int(x, "limits.maxConnectionsPerAddress", 1...1_000_000)
        }
        if let x = o["handshakeTimeoutSeconds"] { c.limits.handshakeTimeoutSeconds = try int(x, "limits.handshakeTimeoutSeconds", 1...300) }
        if c.limits.maxOpenConnections < c.limits.maxConnectionsPerAddress {
            throw fail("limits.maxOpenConnections", "must be at least limits.maxConnectionsPerAddress (\(c.limits.maxConnectionsPerAddress))")
        }
    }

    /// `blobCollection`: when unreferenced and partial blobs are collected.
    func readBlobCollection(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        let o = try object(v, "blobCollection", allowed: ["intervalSeconds", "graceSeconds", "partialMaxAgeSeconds"])
        if let x = o["intervalSeconds"] { c.blobCollection.intervalSeconds = try int(x, "blobCollection.intervalSeconds", 0...31_536_000) }
        if let x = o["graceSeconds"] { c.blobCollection.graceSeconds = try int(x, "blobCollection.graceSeconds", 0...31_536_000) }
        if let x = o["partialMaxAgeSeconds"] {
            c.blobCollection.partialMaxAgeSeconds = try int(x, "blobCollection.partialMaxAgeSeconds", 0...31_536_000)
        }
    }

    /// `blobs`: when blobs are fetched, by default and per peer.
    func readBlobs(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        let o = try object(v, "blobs", allowed: ["fetch", "peers"])
        if let x = o["fetch"] { c.blobPolicy = try blobPolicy(x, "blobs.fetch") }
        if let p = o["peers"] {
            guard case .object(let byPeer) = p else { throw fail("blobs.peers", "must map node IDs to policies") }
            for (peer, policy) in byPeer {
                c.blobPolicyByPeer[try nodeID(.string(peer), "blobs.peers")] = try blobPolicy(policy, "blobs.peers.\(peer)")
            }
        }
    }

    /// `replications`: persistent replications (peers and CouchDB servers).
    func readReplications(_ v: JSON, into c: inout NodeConfiguration) throws(ConfigError) {
        guard case .array(let items) = v else { throw fail("replications", "must be an array") }
        for (i, item) in items.enumerated() {
            let spec = try replication(item, "replications[\(i)]", defaultID: "config-\(i)")
            if c.replications.contains(where: { $0.id == spec.id }) { throw fail("replications[\(i)].id", "duplicate id \(spec.id)") }
            c.replications.append(spec)
        }
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

    /// A blob policy: `eager`, `lazy`, or a size (a number of bytes, or text such as `5MB`).
    func blobPolicy(_ value: JSON, _ key: String) throws(ConfigError) -> BlobFetchPolicy {
        let text: String
        if let n = value.intValue { text = String(n) } else { text = try string(value, key) }
        do { return try BlobFetchPolicy(parsing: text) } catch { throw fail(key, error.message) }
    }

    /// One replication entry: with a Ferry peer (`wss://` URL and `peer`) or with a
    /// CouchDB-protocol database (`http(s)://` URL and the CouchDB options).
    func replication(_ item: JSON, _ key: String, defaultID: String) throws(ConfigError) -> ReplicationSpec {
        let k = { (name: String) in key.isEmpty ? name : "\(key).\(name)" }
        let o = try object(
            item, key, allowed: Set(["id", "url", "peer", "direction", "continuous", "documentIDs", "blobs"]).union(CouchReplicationOptions.keys))
        guard let u = o["url"] else { throw fail(k("url"), "is required") }
        let id = try o["id"].map { v throws(ConfigError) in try string(v, k("id")) } ?? defaultID
        guard !id.isEmpty, id.utf8.count <= 100, !id.contains("/") else { throw fail(k("id"), "must be 1–100 characters without /") }
        let urlText = try string(u, k("url"))
        var spec: ReplicationSpec
        if CouchEndpoint.isCouchURL(urlText) {
            if o["peer"] != nil {
                throw fail(k("peer"), "a CouchDB (http/https) replication has no peer node ID; drop it (use pin to pin an https certificate)")
            }
            spec = ReplicationSpec(id: id, couchURL: urlText, options: try couchOptions(o, k))
        } else {
            for name in CouchReplicationOptions.keys.sorted() where o[name] != nil {
                throw fail(k(name), "only a CouchDB replication (an http:// or https:// URL) takes \(name)")
            }
            guard urlText.hasPrefix("wss://") || urlText.hasPrefix("ws://"), URL(string: urlText)?.host != nil else {
                throw fail(k("url"), "must be a wss://HOST:PORT/GROUP/sync URL (a Ferry peer) or an http(s)://HOST:PORT/DATABASE URL (a CouchDB database)")
            }
            guard let p = o["peer"] else { throw fail(k("peer"), "is required: the pinned node ID of the URL's node") }
            spec = ReplicationSpec(id: id, url: urlText, peerID: try nodeID(p, k("peer")))
        }
        if let d = o["direction"] {
            guard let dir = ReplicatorConfiguration.Direction(rawValue: try string(d, k("direction"))) else {
                throw fail(k("direction"), "must be push, pull or pushAndPull")
            }
            spec.direction = dir
        }
        if let c = o["continuous"] { spec.continuous = try bool(c, k("continuous")) }
        if let b = o["blobs"] {
            if spec.isCouch { throw fail(k("blobs"), "a CouchDB replication fetches attachments with their documents; drop blobs") }
            spec.blobPolicy = try blobPolicy(b, k("blobs"))
        }
        if let d = o["documentIDs"] {
            let ids = try strings(d, k("documentIDs"))
            for (i, s) in ids.enumerated() where (try? DocumentID(s)) == nil {
                throw fail(k("documentIDs[\(i)]"), "\"\(s)\" is not a valid document ID")
            }
            spec.documentIDs = ids
        }
        if let couch = spec.couch, let problem = couch.problem(url: spec.url, direction: spec.direction) {
            throw fail(k(problem.key), problem.reason)
        }
        return spec
    }

    /// The CouchDB-only keys of a replication entry (checked against the URL by the caller).
    func couchOptions(_ o: [String: JSON], _ k: (String) -> String) throws(ConfigError) -> CouchReplicationOptions {
        var c = CouchReplicationOptions()
        if let v = o["credentialsFile"] { c.credentialsFile = try string(v, k("credentialsFile")) }
        if let v = o["credentialsEnv"] { c.credentialsEnv = try string(v, k("credentialsEnv")) }
        if let v = o["pin"] { c.pin = try string(v, k("pin")).lowercased() }
        if let v = o["createTarget"] { c.createTarget = try bool(v, k("createTarget")) }
        if let v = o["selector"] {
            guard v.objectValue != nil else { throw fail(k("selector"), "must be a Mango selector object, not \(v.typeName)") }
            c.selector = v
        }
        if let v = o["policy"] { c.policy = try policy(v, k("policy")) }
        return c
    }
}

extension ConfigReader {
    /// `{"port", "maxRequestBytes", "sessionSeconds", "users": [...], "cors": {"origins"}, "lan": {"interface", "port"}}`.
    func couch(_ v: JSON, _ key: String) throws(ConfigError) -> NodeConfiguration.Couch {
        let o = try object(v, key, allowed: [
            "port", "maxRequestBytes", "sessionSeconds", "users", "cors", "lan", "maxConnections", "maxConnectionsPerAddress", "idleTimeoutSeconds",
            "queryTimeoutSeconds",
        ])
        var c = NodeConfiguration.Couch()
        if let x = o["port"] { c.port = try int(x, "\(key).port", 0...65535) }
        if let x = o["maxRequestBytes"] { c.maxRequestBytes = try int(x, "\(key).maxRequestBytes", 1024...(1 << 32)) }
        if let x = o["sessionSeconds"] { c.sessionSeconds = try int(x, "\(key).sessionSeconds", 60...(30 * 86_400)) }
        if let x = o["maxConnections"] { c.maxConnections = try int(x, "\(key).maxConnections", 1...1_000_000) }
        if let x = o["maxConnectionsPerAddress"] { c.maxConnectionsPerAddress = try int(x, "\(key).maxConnectionsPerAddress", 1...1_000_000) }
        if let x = o["idleTimeoutSeconds"] { c.idleTimeoutSeconds = try int(x, "\(key).idleTimeoutSeconds", 1...86_400) }
        if let x = o["queryTimeoutSeconds"] { c.queryTimeoutSeconds = try int(x, "\(key).queryTimeoutSeconds", 1...3600) }
        if c.maxConnections < c.maxConnectionsPerAddress {
            throw fail("\(key).maxConnections", "must be at least \(key).maxConnectionsPerAddress (\(c.maxConnectionsPerAddress))")
        }
        if let x = o["users"] {
            guard case .array(let items) = x else { throw fail("\(key).users", "must be an array") }
            for (i, item) in items.enumerated() {
                let user = try couchUser(item, "\(key).users[\(i)]")
                if c.users.contains(where: { $0.name == user.name }) {
                    throw fail("\(key).users[\(i)].name", "duplicate user \(LogText.escape(user.name))")
                }
                c.users.append(user)
            }
        }
        if let x = o["cors"] {
            let co = try object(x, "\(key).cors", allowed: ["origins"])
            if let list = co["origins"] {
                c.corsOrigins = try strings(list, "\(key).cors.origins")
                for (i, origin) in c.corsOrigins.enumerated() where origin != "*" {
                    guard let u = URL(string: origin), u.scheme != nil, u.host != nil, u.path.isEmpty else {
                        throw fail("\(key).cors.origins[\(i)]", "must be an origin such as https://app.example:8443 (scheme, host, optional port) or *")
                    }
                }
            }
        }
        if let x = o["lan"] {
            let lo = try object(x, "\(key).lan", allowed: ["interface", "port"])
            var lan = NodeConfiguration.Couch.LAN()
            if let i = lo["interface"] { lan.interface = try string(i, "\(key).lan.interface") }
            if let p = lo["port"] { lan.port = try int(p, "\(key).lan.port", 0...65535) }
            c.lan = lan
        }
        return c
    }

    /// `{"name", "password": "pbkdf2-sha256$…", "policy"?}` (the policy as a trust entry's).
    func couchUser(_ item: JSON, _ key: String) throws(ConfigError) -> CouchUser {
        let o = try object(item, key, allowed: ["name", "password", "policy"])
        guard let n = o["name"] else { throw fail("\(key).name", "is required") }
        let name = try string(n, "\(key).name")
        if let problem = CouchUser.nameProblem(name) { throw fail("\(key).name", problem) }
        guard let p = o["password"] else { throw fail("\(key).password", "is required: a hash from `ferry couch-user NAME`") }
        let text = try string(p, "\(key).password")
        let hash: CouchPasswordHash
        do { hash = try CouchPasswordHash(parsing: text) } catch { throw fail("\(key).password", error.description) }
        var user = CouchUser(name: name, password: hash)
        if let pol = o["policy"] { user.policy = try policy(pol, "\(key).policy") }
        return user
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
