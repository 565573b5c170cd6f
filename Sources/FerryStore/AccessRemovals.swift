import FerryCore
import Foundation
import GRDB

/// One document this node purged because it may no longer read it.
public struct AccessRemoval: Sendable, Equatable {
    /// Rises by one with each removal this store records.
    public let number: Int64
    public let id: String
    public let reason: String
    /// Seconds since 1970.
    public let time: Double
    /// The revisions held when it was purged, when they are refused if they come back.
    public let revisions: [String]

    var json: JSON { .array([.int(number), .string(id), .string(reason), .double(time), .array(revisions.map(JSON.string))]) }

    init(number: Int64, id: String, reason: String, time: Double, revisions: [String]) {
        (self.number, self.id, self.reason, self.time, self.revisions) = (number, id, reason, time, revisions)
    }

    init?(_ v: JSON) {
        guard case .array(let a) = v, a.count == 5, let n = a[0].intValue, let id = a[1].stringValue, let r = a[2].stringValue,
            case .array(let revs) = a[4]
        else { return nil }
        self.init(number: n, id: id, reason: r, time: a[3].doubleValue ?? 0, revisions: revs.compactMap(\.stringValue))
    }
}

/// The revisions of documents purged for access, by document ID (from the journal): a
/// replicated copy of one is refused, and a local write of a purged document too, so what
/// a node may no longer read does not come back through a peer that still holds it.
final class AccessRemovedRevisions: Sendable {
    private let byID = Locked<[String: Set<String>]?>(nil)

    func revisions(of id: String, loading: () throws(StoreError) -> [AccessRemoval]) throws(StoreError) -> Set<String>? {
        if let loaded = byID.withLock({ $0 }) { return loaded[id] }
        var map: [String: Set<String>] = [:]
        for r in try loading() where !r.revisions.isEmpty { map[r.id, default: []].formUnion(r.revisions) }
        byID.withLock { $0 = $0 ?? map }
        return map[id]
    }

    /// Whether any document's revisions are refused.
    func isEmpty(loading: () throws(StoreError) -> [AccessRemoval]) throws(StoreError) -> Bool {
        if let loaded = byID.withLock({ $0 }) { return loaded.isEmpty }
        _ = try revisions(of: "", loading: loading)
        return byID.withLock { $0?.isEmpty ?? true }
    }

    /// Forgets the loaded map: the next question reloads it from the journal.
    func invalidate() { byID.withLock { $0 = nil } }

    func add(_ removals: [AccessRemoval]) {
        byID.withLock { m in
            guard m != nil else { return }  // loaded from the journal on first use
            for r in removals where !r.revisions.isEmpty { m![r.id, default: []].formUnion(r.revisions) }
        }
    }
}

/// Access removal: a document this node may no longer read is purged (locally; a purge never
/// replicates) and recorded in a bounded journal, in one transaction, so `ferry watch`,
/// status and logs can say what went and why.
extension DocumentStore {
    /// The local document holding the journal: the total and the newest removals.
    public static let accessRemovalJournal = "ferry/access-removed"
    /// Removals the journal keeps (the total counts them all).
    public static let accessRemovalJournalLimit = 1000
    /// The local documents recording how far this store holds other databases' feeds
    /// (FerrySync's `Coverage`): an access purge drops them all.
    public static let coveragePrefix = "coverage/"
    /// The first ID past every `coveragePrefix` one ("/" + 1 is "0").
    static let coveragePrefixEnd = "coverage0"

    /// Purges each of `ids` for which `shouldRemove`, judged on the document's tree as stored
    /// inside the transaction, holds; returns those purged, journaled with `reason`, and drops
    /// the store's coverage records (`coveragePrefix`) when it purged any. With
    /// `refusingReturn`, the purged revisions are refused if they come back (a document whose
    /// newer revision this node may not read: the ones it held are still readable by its rules).
    public func purgeForAccess(
        _ ids: [DocumentID], reason: String, refusingReturn: Bool, shouldRemove: (DocumentID, RevisionTree) -> Bool
    ) throws(StoreError) -> [AccessRemoval] {
        guard !ids.isEmpty else { return [] }
        let removals = try write { txn -> [AccessRemoval] in
            var removed: [AccessRemoval] = []
            let data = try Data.fetchOne(
                txn.db.cachedStatement(sql: "SELECT body FROM local_documents WHERE id = ?"), arguments: [Self.accessRemovalJournal])
            let journal = try data.map { try StoredDocument.decodeBody(Array($0)) } ?? [:]
            var total = journal["total"]?.intValue ?? 0
            var recent: [JSON] = { if case .array(let a)? = journal["recent"] { return a } else { return [] } }()
            let now = Date().timeIntervalSince1970
            for id in ids {
                guard let stored = try txn.fetch(id), shouldRemove(id, stored.tree), try txn.purge(id) else { continue }
                total += 1
                let r = AccessRemoval(
                    number: total, id: id.rawValue, reason: reason, time: now,
                    revisions: refusingReturn ? stored.tree.revisions.map(\.id.description) : [])
                removed.append(r)
                recent.append(r.json)
            }
            guard !removed.isEmpty else { return [] }
            // This store no longer holds every document of the feeds it claimed to cover: a
            // pull would start past the purged ones, and a pusher would skip them, so they could
            // never come back once the node may read them again. Coverage is recorded anew by
            // the next complete intake.
            try txn.db.cachedStatement(sql: "DELETE FROM local_documents WHERE id >= ? AND id < ?")
                .execute(arguments: [Self.coveragePrefix, Self.coveragePrefixEnd])
            if recent.count > Self.accessRemovalJournalLimit { recent.removeFirst(recent.count - Self.accessRemovalJournalLimit) }
            let body: JSON = ["total": .int(total), "recent": .array(recent)]
            try txn.db.cachedStatement(sql: "INSERT OR REPLACE INTO local_documents (id, body) VALUES (?, ?)")
                .execute(arguments: [Self.accessRemovalJournal, Data(body.canonicalBytes)])
            return removed
        }
        accessRemovedRevisions.add(removals)
        return removals
    }

    /// Stops refusing the purged revisions of each document in `offers` (its leaves as a peer
    /// that may send it here holds them) when one of those leaves is neither held here nor
    /// among its purged revisions: the peer knows of a newer revision, so whatever made the
    /// document unreadable here may be gone, and the revisions it lists are legitimate again
    /// (a conflicting branch that was deleted, say). A peer that knows no more than this node
    /// did when it purged (one that had not seen the change) lifts nothing. Returns how many
    /// documents it lifted.
    /// `offers` is built only when some document is refused.
    @discardableResult
    public func liftAccessRefusals(offered offers: @autoclosure () -> [DocumentID: [RevisionID]]) throws(StoreError) -> Int {
        // Most nodes never purge: no offer is built and no write transaction made for them.
        let loading = { [self] () throws(StoreError) -> [AccessRemoval] in Self.removals(inJournal: try localDocument(Self.accessRemovalJournal)) }
        if try accessRemovedRevisions.isEmpty(loading: loading) { return 0 }
        let offers = offers()
        guard !offers.isEmpty else { return 0 }
        return try write { txn -> Int in
            var lifted = 0
            for (id, leaves) in offers where try txn.offersUnknownLeaf(id, leaves) {
                try txn.liftAccessRefusals(of: id)
                lifted += 1
            }
            return lifted
        }
    }

    /// The revisions of `id` refused as purged for access (nil: none), the journal read
    /// through `journal` when not loaded yet.
    func refusedRevisions(of id: DocumentID, journal: () throws(StoreError) -> JSON?) throws(StoreError) -> Set<String>? {
        try accessRemovedRevisions.revisions(of: id.rawValue, loading: { () throws(StoreError) in Self.removals(inJournal: try journal()) })
    }

    /// Why a revision of a document purged here for access may not be stored, or nil.
    func accessRemovalRefusal(
        _ proposed: ProposedRevision, journal: () throws(StoreError) -> JSON?, held: () throws(StoreError) -> Bool
    ) throws(StoreError) -> String? {
        guard let revs = try refusedRevisions(of: proposed.id, journal: journal) else { return nil }
        switch proposed.origin {
        case .replicated:
            if revs.contains(proposed.revision.description) {
                return "revision \(proposed.revision) was purged here when this node lost access to the document"
            }
        case .local:
            if try !held() { return "this node lost access to \"\(proposed.id)\" (it was purged here): its edits are refused" }
        }
        return nil
    }

    /// How many documents were ever removed for access, and the journal's removals numbered
    /// after `after`, oldest first.
    public func accessRemovals(after: Int64 = 0) throws(StoreError) -> (total: Int64, removals: [AccessRemoval]) {
        guard let journal = try localDocument(Self.accessRemovalJournal) else { return (0, []) }
        return (journal["total"]?.intValue ?? 0, Self.removals(inJournal: journal).filter { $0.number > after })
    }

    /// The journal with the purged revisions of `id` no longer refused (each entry stays).
    static func journal(_ journal: JSON, liftingRefusalsOf id: DocumentID) -> JSON {
        guard case .array(let recent)? = journal["recent"], var out = journal.objectValue else { return journal }
        out["recent"] = .array(
            recent.map { entry in
                guard let r = AccessRemoval(entry), r.id == id.rawValue, !r.revisions.isEmpty else { return entry }
                return AccessRemoval(number: r.number, id: r.id, reason: r.reason, time: r.time, revisions: []).json
            })
        return .object(out)
    }

    static func removals(inJournal journal: JSON?) -> [AccessRemoval] {
        guard case .array(let recent)? = journal?["recent"] else { return [] }
        return recent.compactMap(AccessRemoval.init)
    }
}
