import FerryCore
import Foundation

/// Replications added through the admin API, persisted in DATA/replications.json so they
/// resume after a restart (CouchDB's `_replicator` database, as a file).
final class ReplicationRegistry: Sendable {
    let file: String
    private let state: Locked<[ReplicationSpec]>

    init(dataDirectory: String) throws(ConfigError) {
        file = "\(dataDirectory)/replications.json"
        var specs: [ReplicationSpec] = []
        if let data = FileManager.default.contents(atPath: file) {
            let json: JSON
            do { json = try JSON.parse(Array(data)) } catch { throw ConfigError(file: file, key: "", reason: "not valid JSON: \(error)") }
            let reader = ConfigReader(file: file)
            let top = try reader.object(json, "", allowed: ["replications"])
            if case .array(let items)? = top["replications"] {
                for (i, item) in items.enumerated() {
                    specs.append(try reader.replication(item, "replications[\(i)]", defaultID: "r\(i)"))
                }
            }
        }
        state = Locked(specs)
    }

    var specs: [ReplicationSpec] { state.withLock { $0 } }

    /// Adds a replication and saves; false (and nothing changed) when one by that ID exists.
    func add(_ spec: ReplicationSpec) throws(NodeError) -> Bool {
        try change { s in
            guard !s.contains(where: { $0.id == spec.id }) else { return false }
            s.append(spec)
            return true
        }
    }

    /// Removes a replication; false if it was not stored here.
    func remove(_ id: String) throws(NodeError) -> Bool {
        try change { s in
            guard s.contains(where: { $0.id == id }) else { return false }
            s.removeAll { $0.id == id }
            return true
        }
    }

    /// Applies `edit`; when it changed something, saves, and puts the list back if saving fails.
    private func change(_ edit: (inout [ReplicationSpec]) -> Bool) throws(NodeError) -> Bool {
        let old = state.withLock { s -> [ReplicationSpec]? in
            let old = s
            return edit(&s) ? old : nil
        }
        guard let old else { return false }
        do { try save() } catch {
            state.withLock { $0 = old }
            throw error
        }
        return true
    }

    private func save() throws(NodeError) {
        try writeAtomically(["replications": .array(specs.map(\.json))], to: file)
    }
}
