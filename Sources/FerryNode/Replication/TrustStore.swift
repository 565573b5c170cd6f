import FerryCore
import FerrySync
import FerryTransport
import Foundation

/// The node's trusted peers and their policies: the config file's entries and static
/// peers (read-only), entries added at run time (persisted in DATA/trust.json), and the
/// active members of the node's group (full policy, unless a manual entry says otherwise).
/// Keeps the listener's pinned-ID set in step, so a change applies to the next handshake.
public final class TrustStore: Sendable {
    /// A trusted node as the API shows it.
    public struct Entry: Sendable, Equatable {
        public var nodeID: String
        public var name: String?
        public var policy: PeerPolicy
        /// "config", "peer" (a static peer), "api" (added at run time) or "tofu".
        public var source: PeerSource
        public init(nodeID: String, name: String?, policy: PeerPolicy, source: PeerSource) {
            self.nodeID = nodeID
            self.name = name
            self.policy = policy
            self.source = source
        }
    }

    /// An explicit change to an entry: only what is given changes, so nothing is widened by omission.
    public struct Change: Sendable, Equatable {
        /// `.some(nil)` removes the name.
        public var name: String??
        public var read: AccessRule?
        public var write: AccessRule?
        public var mayDelete: Bool?
        public init(name: String?? = nil, read: AccessRule? = nil, write: AccessRule? = nil, mayDelete: Bool? = nil) {
            self.name = name
            self.read = read
            self.write = write
            self.mayDelete = mayDelete
        }

        func applied(to entry: Entry) -> Entry {
            var e = entry
            if let name { e.name = name }
            if let read { e.policy.read = read }
            if let write { e.policy.write = write }
            if let mayDelete { e.policy.mayDelete = mayDelete }
            return e
        }
    }

    let fixed: [String: Entry]
    /// Run-time entries, in DATA/trust.json.
    let added: RuntimeEntries<Entry>
    /// Active members of this node's group (this node excluded), by ID, with their names.
    let groupMembers = Locked<[String: String?]>([:])
    /// The IDs the TLS listener admits.
    public let ids = TrustedIDs()
    /// The group's access rules, which narrow every entry's policy (nil: none apply).
    let access: GroupAccess?

    /// Loads DATA/trust.json (absent means empty) beside the config's entries.
    public init(dataDirectory: String, configuration: NodeConfiguration, access: GroupAccess? = nil) throws(ConfigError) {
        self.access = access
        let file = "\(dataDirectory)/trust.json"
        var fixed: [String: Entry] = [:]
        for p in configuration.peers { fixed[p.nodeID] = Entry(nodeID: p.nodeID, name: p.name, policy: .trusted, source: .peer) }
        for t in configuration.trust { fixed[t.nodeID] = Entry(nodeID: t.nodeID, name: t.name, policy: t.policy, source: .config) }
        self.fixed = fixed
        var added: [String: Entry] = [:]
        if let data = FileManager.default.contents(atPath: file) {
            let json: JSON
            do { json = try JSON.parse(Array(data)) } catch { throw ConfigError(file: file, key: "", reason: "not valid JSON: \(error)") }
            let reader = ConfigReader(file: file)
            let top = try reader.object(json, "", allowed: ["peers"])
            if case .array(let items)? = top["peers"] {
                for (i, item) in items.enumerated() {
                    let key = "peers[\(i)]"
                    let source = item["source"]?.stringValue.flatMap(PeerSource.init(rawValue:)) ?? .api
                    var clean = item.objectValue ?? [:]
                    clean["source"] = nil
                    let t = try reader.trustEntry(.object(clean), key)
                    added[t.nodeID] = Entry(nodeID: t.nodeID, name: t.name, policy: t.policy, source: source)
                }
            }
        }
        self.added = RuntimeEntries(added) { entries throws(NodeError) in try Self.save(entries, to: file) }
        refreshIDs()
    }

    /// Every trusted entry, fixed ones first winning over added ones, sorted by ID.
    /// Group members without a manual entry come last, with source `group`.
    public var entries: [Entry] {
        var all = self.added.all.merging(fixed) { _, f in f }
        for (id, name) in groupMembers.withLock({ $0 }) where all[id] == nil {
            all[id] = Entry(nodeID: id, name: name, policy: .trusted, source: .group)
        }
        return all.values.sorted { $0.nodeID < $1.nodeID }
    }

    public func entry(_ id: String) -> Entry? {
        if let e = fixed[id] ?? added[id] { return e }
        return groupMembers.withLock { $0[id] }.map { Entry(nodeID: id, name: $0, policy: .trusted, source: .group) }
    }

    /// Whether a manual (config or run-time) entry trusts `id`, whatever the group says.
    public func isManuallyTrusted(_ id: String) -> Bool { fixed[id] != nil || added[id] != nil }

    /// Replaces the group's active members; IDs that leave lose their connections unless a
    /// manual entry still trusts them.
    public func setGroupMembers(_ members: [String: String?]) {
        groupMembers.withLock { $0 = members }
        refreshIDs()
    }
    public func isTrusted(_ id: String) -> Bool { entry(id) != nil }
    /// The policy `id` is judged by: its entry's, narrowed by the group's rules for it.
    public func policy(for id: String) -> PeerPolicy? {
        guard let p = entry(id)?.policy else { return nil }
        return access?.restrict(p, principal: id) ?? p
    }
    /// Whether a TOFU entry exists already (TOFU pins only the first node seen).
    public var hasTOFUEntry: Bool { added.all.values.contains { $0.source == .tofu } }

    /// Adds a run-time entry and saves the file. An ID already trusted is a conflict:
    /// re-adding must never replace (and so widen) an entry's policy; `update` changes one.
    public func add(_ entry: Entry) throws(NodeError) {
        if fixed[entry.nodeID] != nil {
            throw .conflict("node \(entry.nodeID) is trusted by the config file; change it there")
        }
        guard try added.add(entry.nodeID, entry) else {
            throw .conflict("node \(entry.nodeID) is already trusted; change its entry with `ferry trust set` (PUT /trust/{id})")
        }
        refreshIDs()
    }

    /// Applies an explicit change to a run-time entry and saves; returns the new entry, or
    /// nil when the ID is not in the trust store.
    @discardableResult
    public func update(_ id: String, _ change: Change) throws(NodeError) -> Entry? {
        if fixed[id] != nil { throw .conflict("node \(id) is trusted by the config file; change it there") }
        return try added.update(id) { change.applied(to: $0) }
    }

    /// Removes a run-time entry; false if there was none.
    @discardableResult
    public func remove(_ id: String) throws(NodeError) -> Bool {
        if fixed[id] != nil { throw .conflict("node \(id) is trusted by the config file; remove it there") }
        guard try added.remove(id) else { return false }
        refreshIDs()
        return true
    }

    func refreshIDs() {
        ids.replace(with: Set(fixed.keys).union(added.all.keys).union(groupMembers.withLock { Set($0.keys) }))
    }

    static func save(_ entries: [String: Entry], to file: String) throws(NodeError) {
        let list = entries.values.sorted { $0.nodeID < $1.nodeID }.map { e -> JSON in
            var o = e.json.objectValue!
            o["source"] = .string(e.source.rawValue)
            return .object(o)
        }
        try writeAtomically(JSON.object(["peers": .array(list)]), to: file)
    }
}

extension TrustStore.Entry {
    public var json: JSON {
        var o: [String: JSON] = ["id": .string(nodeID), "policy": policy.json, "source": .string(source.rawValue)]
        if let name { o["name"] = .string(name) }
        return .object(o)
    }
}

extension PeerPolicy {
    /// The policy in the config file's form.
    public var json: JSON {
        ["read": read.json, "write": write.json, "mayDelete": .bool(mayDelete)]
    }
}

extension AccessRule {
    /// The rule in the config file's form, its empty lists left out: `"all"`, `"none"` or
    /// `{"ids"?, "prefixes"?, "types"?}`.
    public var json: JSON {
        if admitsEverything { return "all" }
        if self == .none { return "none" }
        var o: [String: JSON] = [:]
        if !idPatterns.isEmpty { o["ids"] = .array(idPatterns.map { .string($0) }) }
        if !idPrefixes.isEmpty { o["prefixes"] = .array(idPrefixes.map { .string($0) }) }
        if !types.isEmpty { o["types"] = .array(types.map { .string($0) }) }
        return .object(o)
    }
}

/// Writes JSON to an owner-only file through a temporary file and rename, so a crash never leaves half a file.
func writeAtomically(_ json: JSON, to path: String) throws(NodeError) {
    let temp = path + ".tmp"
    try? FileManager.default.createDirectory(
        atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    var bytes = json.canonicalBytes
    bytes.append(0x0A)
    guard FileManager.default.createFile(atPath: temp, contents: Data(bytes), attributes: [.posixPermissions: 0o600]) else {
        throw .badConfiguration("cannot write \(temp)")
    }
    let fd = open(temp, O_RDONLY)
    if fd >= 0 {
        fsync(fd)
        close(fd)
    }
    guard rename(temp, path) == 0 else { throw .badConfiguration("cannot replace \(path): errno \(errno)") }
}
