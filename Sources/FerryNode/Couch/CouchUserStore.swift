import FerryCore
import FerryCouch
import FerrySync
import Foundation

/// The CouchDB API's users: the config file's `couch.users` (read-only here) and users added
/// at run time (persisted in DATA/couch-users.json, mode 0600), kept in step with the
/// `CouchUserTable` the listeners authenticate against, so a change applies to the next request.
public final class CouchUserStore: Sendable {
    /// A user as the API and the CLI show it: never the password hash.
    public struct Entry: Sendable, Equatable {
        public var name: String
        public var policy: PeerPolicy
        /// `config` or `api`.
        public var source: PeerSource
        public init(name: String, policy: PeerPolicy, source: PeerSource) {
            self.name = name
            self.policy = policy
            self.source = source
        }
    }

    /// An explicit change: only what is given changes, so nothing is widened by omission.
    public struct Change: Sendable, Equatable {
        public var password: CouchPasswordHash?
        public var read: AccessRule?
        public var write: AccessRule?
        public var mayDelete: Bool?
        public init(password: CouchPasswordHash? = nil, read: AccessRule? = nil, write: AccessRule? = nil, mayDelete: Bool? = nil) {
            self.password = password
            self.read = read
            self.write = write
            self.mayDelete = mayDelete
        }

        public var isEmpty: Bool { password == nil && read == nil && write == nil && mayDelete == nil }

        func applied(to user: CouchUser) -> CouchUser {
            var u = user
            if let password { u.password = password }
            if let read { u.policy.read = read }
            if let write { u.policy.write = write }
            if let mayDelete { u.policy.mayDelete = mayDelete }
            return u
        }
    }

    let fixed: [String: CouchUser]
    /// Run-time users, in DATA/couch-users.json.
    let added: RuntimeEntries<CouchUser>
    /// What the CouchDB listeners check credentials against.
    public let table: CouchUserTable

    public static func path(dataDirectory: String) -> String { "\(dataDirectory)/couch-users.json" }

    /// Loads DATA/couch-users.json (absent means none) beside the config's users.
    public init(dataDirectory: String, configuration: NodeConfiguration) throws(ConfigError) {
        let file = Self.path(dataDirectory: dataDirectory)
        fixed = Dictionary(configuration.couch.users.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        var added: [String: CouchUser] = [:]
        if let data = FileManager.default.contents(atPath: file) {
            let json: JSON
            do { json = try JSON.parse(Array(data)) } catch { throw ConfigError(file: file, key: "", reason: "not valid JSON: \(error)") }
            let reader = ConfigReader(file: file)
            let top = try reader.object(json, "", allowed: ["users"])
            if case .array(let items)? = top["users"] {
                for (i, item) in items.enumerated() {
                    let user = try reader.couchUser(item, "users[\(i)]")
                    added[user.name] = user
                }
            }
        }
        self.added = RuntimeEntries(added) { users throws(NodeError) in try Self.save(users, to: file) }
        table = CouchUserTable([])
        refreshTable()
    }

    /// Every user, config ones winning over run-time ones of the same name, sorted by name.
    public var entries: [Entry] {
        let config = fixed.values.map { Entry(name: $0.name, policy: $0.policy, source: .config) }
        let api = added.all.values.filter { fixed[$0.name] == nil }.map { Entry(name: $0.name, policy: $0.policy, source: .api) }
        return (config + api).sorted { $0.name < $1.name }
    }

    public func entry(_ name: String) -> Entry? { entries.first { $0.name == name } }

    /// Adds a run-time user and saves. A name already in use is a conflict: re-adding must never
    /// replace a password or widen a policy; `update` changes a user.
    public func add(_ user: CouchUser) throws(NodeError) {
        if let problem = CouchUser.nameProblem(user.name) { throw .badConfiguration("user name \(LogText.escape(user.name)) \(problem)") }
        if fixed[user.name] != nil {
            throw .conflict("user \(LogText.escape(user.name)) is in the config file's couch.users; change it there")
        }
        guard try added.add(user.name, user) else {
            throw .conflict("user \(LogText.escape(user.name)) exists; change it with `ferry couch-user set` (PUT /couch/users/{name})")
        }
        refreshTable()
    }

    /// Applies a change to a run-time user and saves; returns the new entry, or nil when no
    /// run-time user has that name.
    @discardableResult
    public func update(_ name: String, _ change: Change) throws(NodeError) -> Entry? {
        if fixed[name] != nil { throw .conflict("user \(LogText.escape(name)) is in the config file's couch.users; change it there") }
        guard let updated = try added.update(name, { change.applied(to: $0) }) else { return nil }
        refreshTable()
        return Entry(name: name, policy: updated.policy, source: .api)
    }

    /// Removes a run-time user; false when there was none. Its sessions end with it.
    @discardableResult
    public func remove(_ name: String) throws(NodeError) -> Bool {
        if fixed[name] != nil { throw .conflict("user \(LogText.escape(name)) is in the config file's couch.users; remove it there") }
        guard try added.remove(name) else { return false }
        refreshTable()
        return true
    }

    func refreshTable() {
        let all = added.all.merging(fixed) { _, config in config }
        table.replace(with: Array(all.values))
    }

    static func save(_ users: [String: CouchUser], to file: String) throws(NodeError) {
        let list = users.values.sorted { $0.name < $1.name }.map { u -> JSON in
            ["name": .string(u.name), "password": .string(u.password.description), "policy": u.policy.json]
        }
        try writeAtomically(JSON.object(["users": .array(list)]), to: file)
    }
}

extension CouchUserStore.Entry {
    public var json: JSON {
        ["name": .string(name), "policy": policy.json, "source": .string(source.rawValue)]
    }
}

extension CouchUserStore {
    /// A new user in the API's form: `{"name", "password" | "passwordHash", "policy"?}`.
    /// `password` is hashed here (PBKDF2-SHA256, 600,000 iterations); `passwordHash` is a
    /// hash from `ferry couch-user print`. `source` names the input in errors.
    public static func parseUser(_ json: JSON, source: String) throws(ConfigError) -> CouchUser {
        let reader = ConfigReader(file: source)
        let o = try reader.object(json, "", allowed: ["name", "password", "passwordHash", "policy"])
        guard let n = o["name"] else { throw ConfigError(file: source, key: "name", reason: "is required") }
        let name = try reader.string(n, "name")
        if let problem = CouchUser.nameProblem(name) { throw ConfigError(file: source, key: "name", reason: problem) }
        guard let hash = try parsePassword(o, reader: reader, source: source) else {
            throw ConfigError(file: source, key: "password", reason: "is required (or passwordHash)")
        }
        var user = CouchUser(name: name, password: hash)
        if let p = o["policy"] { user.policy = try reader.policy(p, "policy") }
        return user
    }

    /// A change in the API's form: `{"password"? | "passwordHash"?, "policy"?}`, the policy's
    /// keys each optional.
    public static func parseChange(_ json: JSON, source: String) throws(ConfigError) -> Change {
        let reader = ConfigReader(file: source)
        let o = try reader.object(json, "", allowed: ["password", "passwordHash", "policy"])
        var change = Change()
        change.password = try parsePassword(o, reader: reader, source: source)
        if let p = o["policy"] {
            let po = try reader.object(p, "policy", allowed: ["read", "write", "mayDelete"])
            if let r = po["read"] { change.read = try reader.access(r, "policy.read") }
            if let w = po["write"] { change.write = try reader.access(w, "policy.write") }
            if let d = po["mayDelete"] { change.mayDelete = try reader.bool(d, "policy.mayDelete") }
        }
        return change
    }

    static func parsePassword(_ o: [String: JSON], reader: ConfigReader, source: String) throws(ConfigError) -> CouchPasswordHash? {
        switch (o["password"], o["passwordHash"]) {
        case (.some, .some):
            throw ConfigError(file: source, key: "password", reason: "give password or passwordHash, not both")
        case (.some(let p), nil):
            let password = try reader.string(p, "password")
            guard !password.isEmpty else { throw ConfigError(file: source, key: "password", reason: "must not be empty") }
            do { return try CouchPasswordHash(password: password) } catch {
                throw ConfigError(file: source, key: "password", reason: error.description)
            }
        case (nil, .some(let h)):
            let text = try reader.string(h, "passwordHash")
            do { return try CouchPasswordHash(parsing: text) } catch {
                throw ConfigError(file: source, key: "passwordHash", reason: error.description)
            }
        case (nil, nil):
            return nil
        }
    }
}
