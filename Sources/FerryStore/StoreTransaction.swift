import FerryCore
import Foundation
import GRDB

/// The operations available inside one write transaction of a `DocumentStore`;
/// everything done through one transaction commits or rolls back together.
public final class StoreTransaction {
    let db: Database
    unowned let store: DocumentStore
    private(set) var lastSequence: UInt64
    /// Whether this transaction made a revision here (put, delete, merge) rather than only
    /// storing replicated ones: change waiters may treat the two differently.
    private(set) var madeLocalRevision = false
    /// Whether this transaction purged a document (`DocumentStore.contentVersion`).
    private(set) var purged = false
    private let startSequence: UInt64
    /// The Mango index definitions this transaction maintains (MangoIndexMaintenance.swift).
    var mango = MangoTransactionState()
    /// Documents whose purged revisions this transaction stopped refusing.
    var liftedRefusals = Set<DocumentID>()
    private var latestHLC: HLCTimestamp
    /// Documents read or changed by replicated inserts in this transaction, with their trees:
    /// a batch then decodes a document's tree once and writes its row (re-encoding the whole
    /// tree) once, however many of its revisions it brings. Written out by `flushPending`,
    /// before any other operation of the transaction and before commit.
    private var pending: [DocumentID: PendingRow] = [:]
    /// Hot-path statements, fetched once per transaction rather than looked up by SQL text per row.
    private lazy var selectStatement = Result { try db.cachedStatement(sql: StoredDocument.selectSQL) }
    private lazy var insertStatement = Result {
        try db.cachedStatement(
            sql: """
                INSERT INTO documents (rev, deleted, conflicted, sequence, body, tree, id)
                VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                """)
    }
    private lazy var updateStatement = Result {
        try db.cachedStatement(
            sql: """
                UPDATE documents SET rev = ?1, deleted = ?2, conflicted = ?3, sequence = ?4, body = ?5,
                tree = ?6 WHERE doc_key = ?7
                """)
    }

    init(db: Database, store: DocumentStore) throws {
        self.db = db
        self.store = store
        let stmt = try db.cachedStatement(sql: "SELECT last_sequence, last_hlc FROM store_state WHERE singleton = 1")
        guard let row = try Row.fetchOne(stmt) else { throw StoreError.corrupt("store_state row is missing") }
        lastSequence = UInt64(row["last_sequence"] as Int64)
        startSequence = lastSequence
        latestHLC = HLCTimestamp(rawValue: UInt64(bitPattern: row["last_hlc"]))
        let floor = latestHLC
        store.clock.withLock { $0.raise(to: floor) }
    }

    /// Persists the sequence counter and clock; called once before commit. Throws (so the
    /// transaction rolls back) when an index could not be kept exact, even if the caller went on.
    func finish() throws {
        try flushPending()
        if let failure = mango.failure { throw failure }
        guard lastSequence != startSequence || store.currentClock > latestHLC else { return }
        let stmt = try db.cachedStatement(
            sql: "UPDATE store_state SET last_sequence = ?, last_hlc = ? WHERE singleton = 1")
        try stmt.execute(arguments: [
            Int64(bitPattern: lastSequence), Int64(bitPattern: store.currentClock.rawValue),
        ])
    }

    // MARK: Local edits

    /// Saves a new document (`parent` nil) or a new revision on the current leaf `parent`.
    @discardableResult
    public func put(_ id: DocumentID, body: JSON, parent: RevisionID? = nil) throws(StoreError) -> RevisionID {
        try flushPending()
        try checkBody(body)
        return try edit(id, parent: parent, deleted: false, body: body)
    }

    /// Writes a tombstone on the live leaf `revision`; a document that does not exist is
    /// `notFound` (not a conflict).
    @discardableResult
    public func delete(_ id: DocumentID, revision: RevisionID, keepProperties: Bool = false) throws(StoreError)
        -> RevisionID
    {
        try flushPending()
        var body: JSON = .object([:])
        guard let stored = try fetch(id) else { throw .notFound(id) }
        if keepProperties {
            guard let idx = stored.tree.index(of: revision), let b = stored.tree.revisions[idx].body else {
                throw .conflict(id: id, given: revision, current: stored.winner)
            }
            body = try wrap { try StoredDocument.decodeBody(b) }
        }
        return try edit(id, parent: revision, deleted: true, body: body)
    }

    /// Writes a tombstone on the live leaf `revision` with the given body (e.g. a marker
    /// that conflict resolution wrote it).
    @discardableResult
    public func delete(_ id: DocumentID, revision: RevisionID, tombstoneBody: JSON) throws(StoreError) -> RevisionID {
        guard tombstoneBody.objectValue != nil else { throw .invalidBody("a tombstone body must be a JSON object") }
        try flushPending()
        return try edit(id, parent: revision, deleted: true, body: tombstoneBody)
    }

    /// Removes a document and its whole history. Local only: a purge never replicates.
    @discardableResult
    public func purge(_ id: DocumentID) throws(StoreError) -> Bool {
        try flushPending()
        let docKey = try wrap {
            try Int64.fetchOne(db.cachedStatement(sql: "DELETE FROM documents WHERE id = ? RETURNING doc_key"), arguments: [id.rawValue])
        }
        guard let docKey else { return false }
        try documentPurged(id: id, docKey: docKey)
        purged = true
        return true
    }

    private func edit(_ id: DocumentID, parent: RevisionID?, deleted: Bool, body: JSON) throws(StoreError)
        -> RevisionID
    {
        madeLocalRevision = true
        let canonical = body.canonicalBytes
        if canonical.count > store.options.maxBodyBytes {
            throw .tooLarge(bytes: canonical.count, limit: store.options.maxBodyBytes)
        }
        var stored = try fetch(id)
        var tree = stored?.tree ?? RevisionTree()
        var effectiveParent = parent
        if let stored {
            let winner = tree.revisions[tree.winnerIndex!]
            if let parent {
                // Any leaf may be extended: this is how a losing conflict branch is tombstoned.
                guard let p = tree.index(of: parent), tree.revisions[p].isLeaf, !tree.revisions[p].deleted else {
                    throw .conflict(id: id, given: parent, current: stored.winner)
                }
            } else if winner.deleted && !deleted {
                effectiveParent = winner.id  // re-creating a deleted document continues its history
            } else {
                throw .conflict(id: id, given: nil, current: stored.winner)
            }
        } else if let parent {
            throw .conflict(id: id, given: parent, current: nil)
        }
        let rev = RevisionID.compute(parent: effectiveParent, deleted: deleted, canonicalBody: canonical)
        try checkBlobs(body, canonical: canonical)
        try validate(ProposedRevision(id: id, revision: rev, deleted: deleted, body: body, origin: .local))
        let hlc = store.nextTimestamp()
        do {
            try tree.addChild(rev, of: effectiveParent, deleted: deleted, body: canonical, hlc: hlc)
        } catch {
            // The same edit was already made: identical content yields the identical revision.
            throw .conflict(id: id, given: parent, current: stored?.winner)
        }
        try writeRow(id: id, key: stored?.key, previousWinner: stored?.winner, tree: &tree)
        stored = nil
        return rev
    }

    // MARK: Replicated revisions

    /// Inserts one existing revision with history; returns what happened instead of throwing
    /// for problems with the revision itself, so a batch can go on past a bad one.
    public func insertExisting(_ incoming: IncomingRevision) -> InsertOutcome {
        do {
            return try insertExistingOrThrow(incoming)
        } catch {
            return .rejected(error)
        }
    }

    private func insertExistingOrThrow(_ incoming: IncomingRevision) throws(StoreError) -> InsertOutcome {
        let id = incoming.id
        if incoming.revision.generation == 1 && !incoming.history.isEmpty {
            throw .invalidHistory(id, "revision \(incoming.revision) is generation 1 but has ancestors")
        }
        if incoming.revision.generation > 1 && incoming.history.isEmpty {
            throw .invalidHistory(id, "revision \(incoming.revision) has no parent in its history")
        }
        for (i, a) in incoming.history.enumerated() where a.generation != incoming.revision.generation - 1 - i {
            throw .invalidHistory(id, "generations are not consecutive at \(a)")
        }
        if !incoming.deleted { try checkBody(incoming.body) } else if incoming.body.objectValue == nil {
            throw .invalidBody("a document body must be a JSON object")
        }
        // Bytes given with an ID in another form are not trusted: nothing checks them against it.
        let canonical =
            (incoming.revision.isFerryDigest || incoming.canonicalChecked ? incoming.canonicalBody : nil)
            ?? incoming.body.canonicalBytes
        if canonical.count > store.options.maxBodyBytes {
            throw .tooLarge(bytes: canonical.count, limit: store.options.maxBodyBytes)
        }
        // A Ferry-form ID is always verified, whoever made the revision; another form cannot be.
        if incoming.revision.isFerryDigest && !incoming.canonicalChecked {
            let expected = RevisionID.compute(
                parent: incoming.history.first, deleted: incoming.deleted, canonicalBody: canonical)
            guard expected == incoming.revision else { throw .digestMismatch(id, incoming.revision) }
        }
        // Taken out of `pending` while it changes, so the tree is edited in place, not copied.
        var row: PendingRow
        if let cached = pending.removeValue(forKey: id) {
            row = cached
        } else {
            let stored = try fetch(id)
            row = PendingRow(key: stored?.key, previousWinner: stored?.winner, tree: stored?.tree ?? RevisionTree())
        }
        defer { pending[id] = row }
        if row.tree.contains(incoming.revision) { return .alreadyPresent }
        try checkBlobs(incoming.body, canonical: canonical)
        try validate(
            ProposedRevision(
                id: id, revision: incoming.revision, deleted: incoming.deleted, body: incoming.body,
                origin: .replicated))
        let limit = store.options.maxLeavesPerDocument
        if row.tree.leafCount >= limit && row.tree.addsLeaf(history: incoming.history) {
            throw .tooManyLeaves(id, limit: limit)
        }
        store.observe(incoming.hlc)
        do {
            try row.tree.insert(
                incoming.revision, history: incoming.history, deleted: incoming.deleted, body: canonical,
                hlc: incoming.hlc)
        } catch {
            throw .invalidHistory(id, error.description)
        }
        lastSequence += 1
        row.sequence = lastSequence
        try liftAccessRefusals(of: id)
        return .inserted(sequence: lastSequence, branched: row.tree.leafCount > 1)
    }

    /// Inserts each revision in order. One refused as purged for access before a later one of
    /// its document lifted that refusal, in the same batch, is tried again.
    func insertAll(_ revisions: [IncomingRevision]) -> [InsertOutcome] {
        var outcomes = revisions.map { insertExisting($0) }
        guard !liftedRefusals.isEmpty else { return outcomes }
        for i in outcomes.indices where liftedRefusals.contains(revisions[i].id) {
            if case .rejected = outcomes[i] { outcomes[i] = insertExisting(revisions[i]) }
        }
        return outcomes
    }

    /// A new revision of a document purged here for access was stored: a peer that may send
    /// this node the document sent what the node lacked, and its body passed validation. The
    /// document is readable again, so the revisions purged with it are no longer refused (a
    /// conflicting branch that made it unreadable may be gone: its leaves are legitimate again).
    func liftAccessRefusals(of id: DocumentID) throws(StoreError) {
        guard !liftedRefusals.contains(id), try store.refusedRevisions(of: id, journal: accessRemovalJournal) != nil else { return }
        liftedRefusals.insert(id)
        guard let journal = try accessRemovalJournal() else { return }
        let lifted = DocumentStore.journal(journal, liftingRefusalsOf: id)
        try wrap {
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO local_documents (id, body) VALUES (?, ?)")
                .execute(arguments: [DocumentStore.accessRemovalJournal, Data(lifted.canonicalBytes)])
        }
        // Reloaded from the journal as this transaction left it (or, rolled back, as it was).
        store.accessRemovedRevisions.invalidate()
    }

    /// Whether `id`'s purged revisions are refused and `leaves` names one neither held nor among them.
    func offersUnknownLeaf(_ id: DocumentID, _ leaves: [RevisionID]) throws(StoreError) -> Bool {
        guard let refused = try store.refusedRevisions(of: id, journal: accessRemovalJournal) else { return false }
        let tree = try fetch(id)?.tree
        return leaves.contains { !refused.contains($0.description) && !(tree?.contains($0) ?? false) }
    }

    /// The access-removal journal as this transaction sees it.
    private func accessRemovalJournal() throws(StoreError) -> JSON? {
        let data = try wrap {
            try Data.fetchOne(db.cachedStatement(sql: "SELECT body FROM local_documents WHERE id = ?"), arguments: [DocumentStore.accessRemovalJournal])
        }
        return try wrap { try data.map { try StoredDocument.decodeBody(Array($0)) } }
    }

    /// A document as replicated inserts of this transaction left it, not yet written.
    struct PendingRow {
        var key: Int64?
        /// The winner stored before this transaction (nil: a new document).
        var previousWinner: RevisionID?
        var tree: RevisionTree
        /// The sequence of its last insert; nil while nothing changed it.
        var sequence: UInt64?
    }

    /// Writes the rows of documents that replicated inserts changed, in sequence order.
    func flushPending() throws(StoreError) {
        guard !pending.isEmpty else { return }
        let rows = pending.filter { $0.value.sequence != nil }.sorted { $0.value.sequence! < $1.value.sequence! }
        pending = [:]
        for (id, row) in rows {
            var tree = row.tree
            try writeRow(id: id, key: row.key, previousWinner: row.previousWinner, tree: &tree, sequence: row.sequence)
        }
    }

    // MARK: Maintenance

    /// Re-applies pruning and body retention to one document; true if it changed.
    func compact(_ id: DocumentID) throws(StoreError) -> Bool {
        try flushPending()
        guard let stored = try fetch(id) else { return false }
        var tree = stored.tree
        applyRetention(&tree)
        guard tree != stored.tree else { return false }
        let w = tree.winnerIndex!
        let encoded = tree.encoded(omittingBodyAt: w)
        try wrap {
            let stmt = try db.cachedStatement(sql: "UPDATE documents SET tree = ? WHERE doc_key = ?")
            try stmt.execute(arguments: [Data(encoded), stored.key])
        }
        return true
    }

    // MARK: Helpers

    func fetch(_ id: DocumentID) throws(StoreError) -> StoredDocument? {
        try wrap { try StoredDocument.fetch(FastStatement(db, statement: selectStatement.get()), id: id) }
    }

    private func applyRetention(_ tree: inout RevisionTree) {
        let n = tree.revisions.count
        if n <= store.options.retainedAncestorBodies + 1 && n < store.options.maxRevisionDepth { return }
        tree.prune(maxDepth: store.options.maxRevisionDepth)
        tree.dropBodies(retainingAncestors: store.options.retainedAncestorBodies)
    }

    /// Writes the document row for `tree` with a new sequence, and, when its winner changed,
    /// the document's Mango index entries in the same transaction; returns the sequence.
    @discardableResult
    private func writeRow(
        id: DocumentID, key: Int64?, previousWinner: RevisionID?, tree: inout RevisionTree, sequence: UInt64? = nil
    ) throws(StoreError) -> UInt64 {
        applyRetention(&tree)
        let w = tree.winnerIndex!
        let winner = tree.revisions[w]
        let encoded = tree.encoded(omittingBodyAt: w)
        let assigned: UInt64
        if let sequence {
            assigned = sequence
        } else {
            lastSequence += 1
            assigned = lastSequence
        }
        let seq = Int64(bitPattern: assigned)
        let body = winner.body ?? Array("{}".utf8)
        try wrap {
            if let key {
                let stmt = FastStatement(db, statement: try updateStatement.get())
                stmt.bind(7, key)
                try bindRow(stmt)
            } else {
                let stmt = FastStatement(db, statement: try insertStatement.get())
                stmt.bind(7, id.rawValue)
                try bindRow(stmt)
            }
            func bindRow(_ stmt: FastStatement) throws {
                stmt.bind(1, winner.id.description)
                stmt.bind(2, winner.deleted)
                stmt.bind(3, tree.hasConflicts)
                stmt.bind(4, seq)
                stmt.bind(5, body)
                stmt.bind(6, encoded)
                try stmt.run()
            }
        }
        if winner.id != previousWinner {
            let docKey = key ?? db.lastInsertedRowID
            try documentWinnerChanged(
                id: id, docKey: docKey, isNew: key == nil, revision: winner.id, deleted: winner.deleted, body: body)
        }
        return assigned
    }

    /// Top-level bodies must be objects without reserved `_` properties.
    private func checkBody(_ body: JSON) throws(StoreError) {
        guard let fields = body.objectValue else {
            throw .invalidBody("a document body must be a JSON object, not \(body.typeName)")
        }
        if let reserved = fields.keys.first(where: { $0.hasPrefix("_") }) {
            throw .invalidBody("top-level property \"\(reserved)\" is reserved (names starting with '_')")
        }
    }

    private func checkBlobs(_ body: JSON, canonical: [UInt8]) throws(StoreError) {
        guard DocumentStore.mayContainBlob(canonical) else { return }
        let refs: [BlobReference]
        do { refs = try body.blobReferences() } catch { throw .invalidBody(error.description) }
        for ref in refs {
            // A deferred blob (lazy fetch) may be referred to before its content is here.
            guard let length = store.blobs.length(ref.digest) ?? store.blobs.deferredLength(ref.digest) else {
                throw .missingBlob(ref.digest)
            }
            guard length == ref.length else {
                throw .blobLengthMismatch(ref.digest, declared: ref.length, actual: length)
            }
        }
    }

    private func validate(_ proposed: ProposedRevision) throws(StoreError) {
        if let reason = try store.accessRemovalRefusal(
            proposed, journal: accessRemovalJournal, held: { [self] () throws(StoreError) in try fetch(proposed.id) != nil })
        {
            throw .rejected(proposed.id, reason: reason)
        }
        if let validator = store.options.validator, let reason = validator.check(proposed) {
            throw .rejected(proposed.id, reason: reason)
        }
    }

    private func wrap<T>(_ body: () throws -> T) throws(StoreError) -> T {
        do { return try body() } catch { throw StoreError.wrap(error) }
    }
}
