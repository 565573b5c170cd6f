import FerryCore

/// Keyed entries a node adds, changes and removes at run time, persisted by `save` (which
/// writes them all, atomically): a change is kept only when its save succeeds, otherwise
/// memory goes back to what the file holds. The trust store and the CouchDB users use it.
final class RuntimeEntries<Value: Sendable>: Sendable {
    private let entries: Locked<[String: Value]>
    private let save: @Sendable ([String: Value]) throws(NodeError) -> Void

    init(_ initial: [String: Value], save: @escaping @Sendable ([String: Value]) throws(NodeError) -> Void) {
        entries = Locked(initial)
        self.save = save
    }

    var all: [String: Value] { entries.withLock { $0 } }

    subscript(key: String) -> Value? { entries.withLock { $0[key] } }

    /// Adds `value` under a new key and saves; false (nothing changed) when the key is in use.
    func add(_ key: String, _ value: Value) throws(NodeError) -> Bool {
        let inserted = entries.withLock { e -> Bool in
            guard e[key] == nil else { return false }
            e[key] = value
            return true
        }
        guard inserted else { return false }
        try persist { $0[key] = nil }
        return true
    }

    /// Replaces the entry under `key` by `change` of it and saves; nil when there is none.
    func update(_ key: String, _ change: (Value) -> Value) throws(NodeError) -> Value? {
        let result = entries.withLock { e -> (old: Value, new: Value)? in
            guard let old = e[key] else { return nil }
            let new = change(old)
            e[key] = new
            return (old, new)
        }
        guard let result else { return nil }
        try persist { $0[key] = result.old }
        return result.new
    }

    /// Removes the entry under `key` and saves; false when there was none.
    func remove(_ key: String) throws(NodeError) -> Bool {
        guard let old = entries.withLock({ $0.removeValue(forKey: key) }) else { return false }
        try persist { $0[key] = old }
        return true
    }

    /// Saves the entries; on failure applies `undo` and rethrows.
    private func persist(undo: (inout [String: Value]) -> Void) throws(NodeError) {
        do { try save(all) } catch {
            entries.withLock { undo(&$0) }
            throw error
        }
    }
}
