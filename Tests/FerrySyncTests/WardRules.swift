import FerryCore
import FerryStore
import Foundation

@testable import FerrySync

/// The clinic's rules as the access simulations apply them: a supervisor that reads, writes
/// and deletes everything, and stations that read and write the patients of their wards by a
/// selector on `ward`.
enum WardRules {
    /// What every node lets a node with these wards do: nil for the supervisor, [] for a
    /// station without a role (nothing).
    static func policy(wards: [String]?, version: String, unnarrowed: Bool = true) -> PeerPolicy {
        let grant = wards.map { w in
            w.isEmpty ? AccessGrant.nothing : AccessGrant(clauses: [try! AccessClause(selector: ["ward": ["$in": .array(w.map(JSON.string))]])])
        }
        return PeerPolicy(
            read: AccessRule.all.restricted(by: grant), write: AccessRule.all.restricted(by: grant), mayDelete: wards == nil,
            groupRules: GroupRulesApplied(version: version, unnarrowed: unnarrowed))
    }

    /// As a node's validator does: hold only what its roles (`policy()`, as they stand at each
    /// insert) let it read; write locally only what they let it write.
    static func storeOptions(_ policy: @escaping @Sendable () -> PeerPolicy) -> StoreOptions {
        var options = StoreOptions()
        options.validator = Validator { proposed in
            let policy = policy()
            let bare = proposed.deleted && (proposed.body.objectValue?.isEmpty ?? true)
            if proposed.origin == .local && proposed.deleted && !policy.mayDelete { return "may not delete" }
            if !bare && proposed.origin == .local && !policy.write.admits(id: proposed.id, body: proposed.body) { return "may not write" }
            if !bare && !policy.read.admits(id: proposed.id, body: proposed.body) { return "may not hold" }
            return nil
        }
        return options
    }

    /// The live documents a store holds, by ID, at their current revisions.
    static func live(_ store: DocumentStore) throws -> [String: String] {
        Dictionary(uniqueKeysWithValues: try store.allDocuments().map { ($0.id.rawValue, $0.revision.description) })
    }

    /// What `station` should hold: the supervisor's live documents its policy may read, at the
    /// supervisor's revisions.
    static func expected(of policy: PeerPolicy, from supervisor: DocumentStore) throws -> [String: String] {
        let access = DocumentAccess(policy)
        var expected: [String: String] = [:]
        for doc in try supervisor.allDocuments() {
            guard let tree = try supervisor.revisionTree(doc.id), access.mayRead(doc.id, tree: tree) else { continue }
            expected[doc.id.rawValue] = doc.revision.description
        }
        return expected
    }

    /// How `held` differs from `expected`, with the first two documents' trees on both sides
    /// (`revision* leaf x deleted ward`) and what the station purged of them; nil when equal.
    static func difference(held: [String: String], expected: [String: String], station: DocumentStore, supervisor: DocumentStore) throws
        -> String?
    {
        guard held != expected else { return nil }
        let more = held.keys.filter { expected[$0] == nil }.sorted()
        let fewer = expected.keys.filter { held[$0] == nil }.sorted()
        let stale = held.keys.filter { expected[$0] != nil && expected[$0] != held[$0] }.sorted()
        var detail = ""
        for id in (more + fewer + stale).prefix(2) {
            let purged = try station.accessRemovals().removals.filter { $0.id == id }.map { "\($0.revisions.map { $0.prefix(6) })" }
            detail += "; \(id): station [\(try shape(station, id))] purged \(purged), supervisor [\(try shape(supervisor, id))]"
        }
        return "holds more \(more), fewer \(fewer), other revisions of \(stale)\(detail)"
    }

    static func shape(_ store: DocumentStore, _ id: String) throws -> String {
        guard let tree = try store.revisionTree(docID(id)) else { return "none" }
        return tree.revisions.map { r in
            let ward = r.body.flatMap { try? JSON.parse($0) }?["ward"]?.stringValue ?? "-"
            return "\(r.id.description.prefix(6))\(r.isLeaf ? "*" : "")\(r.deleted ? "x" : "")\(ward)"
        }.joined(separator: " ")
    }
}
