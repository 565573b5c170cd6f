import FerryCore
import Foundation
import GRDB
import Logging

/// A durable JSON document database with revision trees, a changes feed, local
/// documents and content-addressed blobs, on SQLite through GRDB.
///
/// One writer, concurrent readers (WAL). Every operation is one transaction, so an
/// error leaves the database as it was.
public final class DocumentStore: Sendable {
    let writer: any DatabaseWriter
    /// Whether `writer` is a pool (a file opened for writing), whose readers are separate connections.
    let pooled: Bool
    public let options: StoreOptions
    public let uuid: String
    /// Where the database lives, or nil in memory.
    public let path: String?
    public let blobs: BlobStore
    let clock: Locked<HybridLogicalClock>
    let notifier = ChangeNotifier()
    /// Committed transactions of this process that purged a document: a purge takes no
    /// sequence, so what caches the store's content by sequence also keys on this.
    private let purgeCommits = Locked<UInt64>(0)
    let poller = ForeignCommitPoller()
    /// Parsed Mango index definitions, shared by transactions and scans.
    let mangoDefinitions = MangoDefinitionCache()
    /// The index list `_find` plans with, kept between queries (MangoIndexListCache).
    let mangoIndexList = MangoIndexListCache()
    /// Revisions purged for access, refused if they come back.
    let accessRemovedRevisions = AccessRemovedRevisions()

    /// The database file name inside a data directory.
    public static let databaseFileName = "ferry.sqlite"

    /// Opens (creating if needed) the store in `directory`: `ferry.sqlite` and `blobs/`.
    public static func open(directory: String, options: StoreOptions = StoreOptions()) throws(StoreError)
        -> DocumentStore
    {
        do {
            // Owner-only: what a node stores is its user's alone. An existing directory keeps its mode.
            try FileManager.default.createDirectory(
                atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create data directory \(directory): \(StoreError.describe(error)) (pass a --data directory this user may write)")
        }
        // Said up front: otherwise the first file this user may not create names the fault.
        if access(directory, R_OK | W_OK | X_OK) != 0 {
            throw .io(StoreError.notOurs(directory))
        }
        let dbPath = (directory as NSString).appendingPathComponent(databaseFileName)
        // A new database starts owner-only; SQLite gives its -wal and -shm files the same mode.
        let fd = Foundation.open(dbPath, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        if fd >= 0 { close(fd) }
        let blobs = try BlobStore(directory: (directory as NSString).appendingPathComponent("blobs"))
        return try DocumentStore(path: dbPath, blobs: blobs, options: options)
    }

    /// Opens the store `directory` already holds, creating nothing: throws `noDatabase` when
    /// it holds none. A database this process may not write (a read-only directory or file)
    /// is opened read-only and immutable, so reading it needs no WAL or lock files.
    public static func openExisting(directory: String, options: StoreOptions = StoreOptions()) throws(StoreError)
        -> DocumentStore
    {
        let dbPath = (directory as NSString).appendingPathComponent(databaseFileName)
        // A directory this user may not even look into would otherwise read as holding no data.
        if FileManager.default.fileExists(atPath: directory), access(directory, R_OK | X_OK) != 0 {
            throw .io(StoreError.notOurs(directory))
        }
        guard FileManager.default.fileExists(atPath: dbPath) else { throw .noDatabase(directory: directory) }
        let blobDirectory = (directory as NSString).appendingPathComponent("blobs")
        if access(directory, W_OK) == 0 && access(dbPath, W_OK) == 0 {
            return try DocumentStore(path: dbPath, blobs: BlobStore(directory: blobDirectory), options: options)
        }
        return try DocumentStore(path: dbPath, blobs: BlobStore(existingDirectory: blobDirectory), options: options, readOnly: true)
    }

    /// Opens an in-memory store with in-memory blobs, for tests and simulations.
    public static func inMemory(options: StoreOptions = StoreOptions()) throws(StoreError) -> DocumentStore {
        try DocumentStore(path: nil, blobs: BlobStore(), options: options)
    }

    init(path: String?, blobs: BlobStore, options: StoreOptions, readOnly: Bool = false) throws(StoreError) {
        var config = Configuration()
        config.busyMode = .timeout(10)
        config.label = "ferry.store"
        let durability = options.durability
        // SQLite's default page cache (about 2 MiB per connection) keeps memory flat on
        // small machines; a larger cache did not measurably speed up saves here.
        do {
            let writer: any DatabaseWriter
            if let path, readOnly {
                // immutable=1: SQLite neither creates nor locks the WAL and shared-memory
                // files a read-only directory cannot hold (URI file names: SQLITE_USE_URI).
                config.readonly = true
                let uri = "file:" + (path.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? path) + "?immutable=1"
                writer = try DatabaseQueue(path: uri, configuration: config)
                guard try writer.read({ db in try Schema.migrator().hasCompletedMigrations(db) }) else {
                    throw StoreError.database("\(path) needs an upgrade that a read-only open cannot make: open it once where it is writable")
                }
            } else if let path {
                writer = try DatabasePool(path: path, configuration: config)
                // Set on the writer after opening: GRDB's pool switches to WAL after
                // `prepareDatabase` and sets synchronous=NORMAL as it does, which would
                // silently drop the fsync of every commit.
                try writer.writeWithoutTransaction { db in
                    try db.execute(sql: "PRAGMA synchronous = \(durability == .full ? "FULL" : "NORMAL")")
                }
            } else {
                writer = try DatabaseQueue(configuration: config)
            }
            if !readOnly { try Schema.migrator().migrate(writer) }
            let state = try writer.read { db in
                try Row.fetchOne(db, sql: "SELECT uuid, last_hlc FROM store_state WHERE singleton = 1")
            }
            guard let state else { throw StoreError.corrupt("store_state row is missing") }
            self.writer = writer
            self.pooled = writer is DatabasePool
            self.uuid = state["uuid"]
            self.clock = Locked(HybridLogicalClock(last: HLCTimestamp(rawValue: UInt64(bitPattern: state["last_hlc"]))))
        } catch {
            let wrapped = StoreError.wrap(error)
            if case .database(let msg) = wrapped, let path {
                throw .database("cannot open \(path): \(msg)")
            }
            throw wrapped
        }
        self.path = path
        self.blobs = blobs
        self.options = options
    }

    /// The writer connection's `PRAGMA synchronous` level (2 FULL, 1 NORMAL), for tests.
    func writerSynchronousLevel() throws -> Int {
        try writer.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 }
    }

    // MARK: Writing

    /// Runs `body` as one write transaction. If it throws, nothing it did is kept.
    /// Changes are announced to live change streams after the commit.
    ///
    /// `durability: .normal` relaxes this one commit to `synchronous=NORMAL` (no fsync; WAL
    /// order still holds, so a power loss can only drop it together with every later
    /// commit). Replication uses it for revisions that exist on the peer and for its
    /// checkpoints, which roll back with them: a lost batch is pulled again. Local edits
    /// keep the store's durability.
    public func write<T>(durability: StoreOptions.Durability? = nil, _ body: (StoreTransaction) throws -> T) throws(StoreError) -> T {
        let result: (T, UInt64, Bool, Bool)
        do {
            result = try writer.writeWithoutTransaction { db in try transact(db, durability: durability, body) }
        } catch {
            throw StoreError.explainingWrite(StoreError.wrap(error), path: writer.path)
        }
        if result.3 { purgeCommits.withLock { $0 += 1 } }
        notifier.advance(to: result.1, local: result.2)
        return result.0
    }

    /// `write`, run on the database's own thread while the caller suspends: a long batch
    /// then never holds one of the few threads of Swift's cooperative pool.
    public func writeSuspending<T: Sendable>(
        durability: StoreOptions.Durability? = nil, _ body: @escaping @Sendable (StoreTransaction) throws -> T
    ) async throws(StoreError) -> T {
        let result: (T, UInt64, Bool, Bool)
        do {
            result = try await writer.writeWithoutTransaction { db in try self.transact(db, durability: durability, body) }
        } catch {
            throw StoreError.explainingWrite(StoreError.wrap(error), path: writer.path)
        }
        if result.3 { purgeCommits.withLock { $0 += 1 } }
        notifier.advance(to: result.1, local: result.2)
        return result.0
    }

    /// One transaction on `db`: the body, then the store's bookkeeping, committed together.
    private func transact<T>(_ db: Database, durability: StoreOptions.Durability?, _ body: (StoreTransaction) throws -> T) throws -> (
        T, UInt64, Bool, Bool
    ) {
        let relaxed = durability == .normal && options.durability == .full && path != nil
        // Cached statements: preparing one (GRDB's authorizer included) costs more
        // than running it, on paths taken per replicated batch or change.
        if relaxed { try db.cachedStatement(sql: "PRAGMA synchronous = NORMAL").execute() }
        defer { if relaxed { try? db.cachedStatement(sql: "PRAGMA synchronous = FULL").execute() } }
        var out: (T, UInt64, Bool, Bool)?
        var indexListChanged = false
        // After the commit (or the rollback): a list read from a snapshot before it is then stale.
        defer { if indexListChanged { mangoIndexList.invalidate() } }
        try db.inTransaction {
            let txn = try StoreTransaction(db: db, store: self)
            defer { indexListChanged = txn.mango.indexListChanged }
            let value = try body(txn)
            try txn.finish()
            out = (value, txn.lastSequence, txn.madeLocalRevision, txn.purged)
            return .commit
        }
        return out!
    }

    /// What this process has changed in the store, from memory: the latest announced commit's
    /// sequence and the number of committed purges (which take no sequence). Equal values
    /// mean the same content, for what caches it (digests); a commit by another process
    /// counts once a poll announced it.
    public var contentVersion: ContentVersion { ContentVersion(sequence: notifier.current, purges: purgeCommits.withLock { $0 }) }

    /// Saves a new document (`parent` nil) or a new revision of a current leaf. Returns the new revision.
    @discardableResult
    public func put(_ id: DocumentID, body: JSON, parent: RevisionID? = nil) throws(StoreError) -> RevisionID {
        try write { try $0.put(id, body: body, parent: parent) }
    }

    /// Writes a tombstone on leaf `revision`. With `keepProperties`, the tombstone keeps
    /// the deleted revision's body (so filters can still route it); otherwise it is `{}`.
    @discardableResult
    public func delete(_ id: DocumentID, revision: RevisionID, keepProperties: Bool = false) throws(StoreError)
        -> RevisionID
    {
        try write { try $0.delete(id, revision: revision, keepProperties: keepProperties) }
    }

    /// Removes a document and all its history, locally only. Returns false if it did not exist.
    @discardableResult
    public func purge(_ id: DocumentID) throws(StoreError) -> Bool {
        try write { try $0.purge(id) }
    }

    /// Inserts existing revisions with their history in one transaction. Each revision
    /// is checked (size, digest, history, blobs, validation); a bad one is reported as
    /// rejected and the rest still go in. Idempotent.
    public func insertRevisions(_ revisions: [IncomingRevision], durability: StoreOptions.Durability? = nil) throws(StoreError)
        -> [InsertOutcome]
    {
        try write(durability: durability) { txn in txn.insertAll(revisions) }
    }

    /// `insertRevisions`, suspending the caller instead of blocking its thread.
    public func insertRevisionsSuspending(_ revisions: [IncomingRevision], durability: StoreOptions.Durability? = nil)
        async throws(StoreError) -> [InsertOutcome]
    {
        try await writeSuspending(durability: durability) { txn in txn.insertAll(revisions) }
    }

    // MARK: Reading

    func read<T>(_ body: (Database) throws -> T) throws(StoreError) -> T {
        do {
            // A pool's readers are read-only connections; their read transaction begins and
            // commits through statements prepared once per connection. GRDB's `read` parses
            // both anew each time, which was a tenth of an indexed 20-document `_find`.
            guard pooled else { return try writer.read(body) }
            return try writer.unsafeRead { db in
                try db.cachedStatement(sql: "BEGIN DEFERRED TRANSACTION").execute()
                let value: T
                do { value = try body(db) } catch {
                    try? db.cachedStatement(sql: "ROLLBACK").execute()
                    throw error
                }
                try db.cachedStatement(sql: "COMMIT").execute()
                return value
            }
        } catch {
            throw StoreError.wrap(error)
        }
    }

    /// The current revision (possibly a tombstone), or a named revision while its body is retained.
    public func document(_ id: DocumentID, revision: RevisionID? = nil) throws(StoreError) -> Document? {
        try read { db -> Document? in
            guard let stored = try StoredDocument.fetch(db, id: id) else { return nil }
            guard let revision, revision != stored.winner else { return try stored.currentDocument() }
            guard let idx = stored.tree.index(of: revision) else {
                throw StoreError.revisionNotFound(id, revision)
            }
            let r = stored.tree.revisions[idx]
            guard let body = r.body else { throw StoreError.bodyNotRetained(id, revision) }
            return Document(
                id: id, revision: revision, deleted: r.deleted, body: try StoredDocument.decodeBody(body),
                sequence: stored.sequence, conflicts: stored.tree.conflicts)
        }
    }

    /// The full revision tree of a document, with the winner's body restored.
    public func revisionTree(_ id: DocumentID) throws(StoreError) -> RevisionTree? {
        try read { db in try StoredDocument.fetch(db, id: id)?.tree }
    }

    /// Revision trees of many documents in one read transaction; absent documents are omitted.
    /// An ID given many times (a batch of one document's revisions) is read once.
    public func revisionTrees(_ ids: some Sequence<DocumentID>) throws(StoreError) -> [DocumentID: RevisionTree] {
        try read { db in
            let stmt = try FastStatement(db, sql: StoredDocument.selectSQL)
            var out: [DocumentID: RevisionTree] = [:]
            var seen = Set<DocumentID>()
            for id in ids where seen.insert(id).inserted {
                if let stored = try StoredDocument.fetch(stmt, id: id) { out[id] = stored.tree }
            }
            return out
        }
    }

    /// Like `changes`, with every leaf revision of each document (conflicts and tombstoned
    /// branches included), as replication needs them.
    public func changesWithLeaves(since: UInt64 = 0, limit: Int = 1000) throws(StoreError) -> [(Change, [RevisionID])] {
        try changesWithTrees(since: since, limit: limit, winnerBodiesUpTo: nil).map { ($0.0, $0.1.leaves.map(\.id)) }
    }

    /// Like `changesWithLeaves`, with each document's whole revision tree (the winner's
    /// body restored) from the same read: a caught-up push builds its revisions from it.
    public func changesWithTrees(since: UInt64 = 0, limit: Int = 1000) throws(StoreError) -> [(Change, RevisionTree)] {
        try changesWithTrees(since: since, limit: limit, winnerBodiesUpTo: .max)
    }

    /// Like `changesWithTrees`, with the winner's body restored only where it is at most
    /// `winnerBodiesUpTo` bytes (nil: never), so that a page of large documents is not read
    /// whole. A responder reads its changes this way and sends the revisions a peer then asks
    /// for from the same read.
    public func changesWithTrees(since: UInt64, limit: Int, winnerBodiesUpTo bodyLimit: Int?) throws(StoreError) -> [(Change, RevisionTree)] {
        try read { db in
            // A prepared statement read by column index: GRDB's rows cost a third of this
            // read on a bulk pull's serving side.
            let stmt = try FastStatement(
                db,
                sql: """
                    SELECT sequence, id, rev, deleted, length(body), tree, CASE WHEN length(body) <= ? THEN body END FROM documents
                    WHERE sequence > ? ORDER BY sequence LIMIT ?
                    """)
            defer { stmt.done() }
            stmt.bind(1, Int64(bodyLimit ?? -1))
            stmt.bind(2, Int64(bitPattern: since))
            stmt.bind(3, Int64(limit))
            var out: [(Change, RevisionTree)] = []
            out.reserveCapacity(min(limit, 5000))
            while try stmt.step() {
                let change = Change(
                    sequence: UInt64(bitPattern: stmt.int64(0)), id: DocumentID(unchecked: stmt.text(1)),
                    revision: try Self.parseStoredRev(stmt.text(2)), deleted: stmt.int64(3) != 0, bodySize: Int(stmt.int64(4)))
                var tree: RevisionTree
                do { tree = try RevisionTree(encoded: stmt.bytes(5)) } catch {
                    throw StoreError.corrupt("revision tree of \"\(change.id)\": \(error)")
                }
                if !stmt.isNull(6) {
                    guard let w = tree.winnerIndex, tree.revisions[w].id == change.revision else {
                        throw StoreError.corrupt("document \"\(change.id)\": stored winner \(change.revision) disagrees with its tree")
                    }
                    tree.restoreBody(stmt.bytes(6), at: w)
                }
                out.append((change, tree))
            }
            return out
        }
    }

    /// Conflicting live leaves of a document (excluding the winner).
    public func conflicts(of id: DocumentID) throws(StoreError) -> [RevisionID] {
        try revisionTree(id)?.conflicts ?? []
    }

    /// IDs of all documents that currently have conflicts, in ID order.
    public func conflictedDocumentIDs(limit: Int = .max) throws(StoreError) -> [DocumentID] {
        try read { db in
            try String.fetchAll(
                db, sql: "SELECT id FROM documents WHERE conflicted = 1 ORDER BY id LIMIT ?", arguments: [limit]
            ).map(DocumentID.init(unchecked:))
        }
    }

    /// Which of `ids` currently have conflicting live leaves (an index lookup; no trees read).
    public func conflicted(among ids: some Collection<DocumentID>) throws(StoreError) -> Set<DocumentID> {
        guard !ids.isEmpty else { return [] }
        return try read { db in
            let stmt = try FastStatement(db, sql: "SELECT conflicted FROM documents WHERE id = ?")
            var out = Set<DocumentID>()
            for id in ids {
                stmt.bind(1, id.rawValue)
                if try stmt.step(), stmt.int64(0) == 1 { out.insert(id) }
                stmt.done()
            }
            return out
        }
    }

    /// Current revisions in ID order, after `startAfter`, live ones only unless asked.
    public func allDocuments(after startAfter: DocumentID? = nil, limit: Int = .max, includeDeleted: Bool = false)
        throws(StoreError) -> [(id: DocumentID, revision: RevisionID, deleted: Bool)]
    {
        try read { db in
            let rows = try Row.fetchAll(
                db,
                sql: """
                    SELECT id, rev, deleted FROM documents
                    WHERE id > ? AND (? OR deleted = 0) ORDER BY id LIMIT ?
                    """,
                arguments: [startAfter?.rawValue ?? "", includeDeleted, limit])
            return try rows.map { row in
                (DocumentID(unchecked: row["id"]), try Self.parseStoredRev(row["rev"]), row["deleted"] as Bool)
            }
        }
    }

    /// One entry per document changed after `since`, in sequence order, at most `limit`.
    public func changes(since: UInt64 = 0, limit: Int = 1000) throws(StoreError) -> [Change] {
        try read { db in
            let rows = try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT sequence, id, rev, deleted, length(body) AS size FROM documents
                        WHERE sequence > ? ORDER BY sequence LIMIT ?
                        """),
                arguments: [Int64(bitPattern: since), limit])
            // By position: a lookup by name lowercases the name for every row.
            return try rows.map { row in
                Change(
                    sequence: UInt64(row[0] as Int64), id: DocumentID(unchecked: row[1]),
                    revision: try Self.parseStoredRev(row[2]), deleted: row[3], bodySize: row[4])
            }
        }
    }

    /// The changes after `since` to documents whose IDs begin with one of `idPrefixes`, in
    /// sequence order: read through the ID index, so a follower of a few documents (the
    /// group's entries) pays for those alone, not for every document written.
    public func changes(since: UInt64, limit: Int, idPrefixes: [String]) throws(StoreError) -> [Change] {
        guard !idPrefixes.isEmpty else { return [] }
        var ranges: [String] = []
        var arguments: [any DatabaseValueConvertible] = []
        for prefix in idPrefixes {
            guard let upper = Self.prefixUpperBound(prefix) else { return try changes(since: since, limit: limit) }
            ranges.append("(id >= ? AND id < ?)")
            arguments += [prefix, upper]
        }
        arguments += [Int64(bitPattern: since), limit]
        return try read { db in
            // `+sequence`: the sequence index stays unused, so the ID ranges drive the scan.
            let rows = try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT sequence, id, rev, deleted, length(body) AS size FROM documents
                        WHERE (\(ranges.joined(separator: " OR "))) AND +sequence > ? ORDER BY sequence LIMIT ?
                        """),
                arguments: StatementArguments(arguments))
            return try rows.map { row in
                Change(
                    sequence: UInt64(row[0] as Int64), id: DocumentID(unchecked: row[1]),
                    revision: try Self.parseStoredRev(row[2]), deleted: row[3], bodySize: row[4])
            }
        }
    }

    /// The least string above every string beginning with `prefix` (its last scalar plus
    /// one); nil when there is none to make.
    static func prefixUpperBound(_ prefix: String) -> String? {
        var scalars = Array(prefix.unicodeScalars)
        while let last = scalars.popLast() {
            if let next = Unicode.Scalar(last.value + 1) {
                scalars.append(next)
                var out = String.UnicodeScalarView()
                out.append(contentsOf: scalars)
                return String(out)
            }
        }
        return nil
    }

    /// A live, gap-free stream of changes after `since`: first the stored backlog, page
    /// by page, then each new change as it is committed through this store. Memory stays
    /// flat however long the backlog. Ends when the consuming task is cancelled. With
    /// `idPrefixes`, only the changes to documents whose IDs begin with one of them.
    public func liveChanges(
        since: UInt64 = 0, pageSize: Int = 500, poll: LiveChanges.Poll? = nil, idPrefixes: [String]? = nil
    ) -> LiveChanges {
        LiveChanges(store: self, since: since, pageSize: pageSize, poll: poll, idPrefixes: idPrefixes)
    }

    public var lastSequence: UInt64 {
        get throws(StoreError) {
            try read { db in UInt64(try Int64.fetchOne(db.cachedStatement(sql: "SELECT last_sequence FROM store_state"))!) }
        }
    }

    /// Number of live (not deleted) documents, the node's own (`_ferry/`) left out: what a
    /// user's lists show, as CouchDB's `doc_count` counts what `_all_docs` lists.
    public var documentCount: Int {
        get throws(StoreError) {
            try read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM documents WHERE deleted = 0 AND \(Self.userDocumentSQL)")! }
        }
    }

    /// A condition on `id` that leaves out the node's own documents (`_ferry/…`); a range,
    /// so that it reads the ID index rather than every ID.
    static let userDocumentSQL = "NOT (id >= '\(DocumentID.nodeInternalPrefix)' AND id < '_ferry0')"

    public func info() throws(StoreError) -> StoreInfo {
        let counts = try read { db in
            try Row.fetchOne(
                db,
                sql: """
                    SELECT (SELECT count(*) FROM documents WHERE deleted = 0 AND \(Self.userDocumentSQL)) AS live,
                           (SELECT count(*) FROM documents WHERE deleted = 1 AND \(Self.userDocumentSQL)) AS dead,
                           (SELECT count(*) FROM documents WHERE conflicted = 1 AND \(Self.userDocumentSQL)) AS conflicted,
                           (SELECT last_sequence FROM store_state) AS seq
                    """)!
        }
        return StoreInfo(
            uuid: uuid, documentCount: counts["live"], deletedCount: counts["dead"],
            conflictedCount: counts["conflicted"], lastSequence: UInt64(counts["seq"] as Int64),
            sizeOnDisk: sizeOnDisk())
    }

    /// Bytes used by the database files and blobs.
    public func sizeOnDisk() -> Int64 {
        var total: Int64 = 0
        if let path {
            for suffix in ["", "-wal", "-shm"] {
                if let attrs = try? FileManager.default.attributesOfItem(atPath: path + suffix),
                    let size = attrs[.size] as? NSNumber
                {
                    total += size.int64Value
                }
            }
        }
        return total + blobs.totalSize()
    }

    /// For each document, which of the given revisions are missing, and which held
    /// revisions (with bodies) are older than them and so may serve as delta bases.
    ///
    /// `mayLearn`, when given, is asked about each held document with its tree (the winner's
    /// body restored); a document it refuses is answered as if it did not exist (every
    /// revision missing, no bases), so the asker learns nothing of its revisions.
    public func revsDiff(
        _ request: [DocumentID: [RevisionID]], mayLearn: ((DocumentID, RevisionTree) -> Bool)? = nil
    ) throws(StoreError) -> [DocumentID: RevsDiffEntry] {
        try read { db in
            var answer: [DocumentID: RevsDiffEntry] = [:]
            let stmt = try FastStatement(db, sql: mayLearn == nil ? StoredDocument.selectSQLNoBody : StoredDocument.selectSQL)
            for (id, revs) in request {
                guard let stored = try StoredDocument.fetch(stmt, id: id, withWinnerBody: mayLearn != nil),
                    mayLearn?(id, stored.tree) ?? true
                else {
                    if !revs.isEmpty { answer[id] = RevsDiffEntry(missing: revs, possibleAncestors: []) }
                    continue
                }
                let missing = revs.filter { !stored.tree.contains($0) }
                guard !missing.isEmpty else { continue }
                let maxGeneration = missing.map(\.generation).max()!
                answer[id] = RevsDiffEntry(missing: missing, possibleAncestors: stored.tree.deltaBases(below: maxGeneration))
            }
            return answer
        }
    }

    static func parseStoredRev(_ text: String) throws -> RevisionID {
        do { return try RevisionID(text) } catch { throw StoreError.corrupt("bad stored revision \(text)") }
    }

    func nextTimestamp() -> HLCTimestamp {
        let wall = options.wallClock()
        return clock.withLock { $0.now(wallMillis: wall) }
    }

    func observe(_ remote: HLCTimestamp) {
        let wall = options.wallClock()
        clock.withLock { $0.observe(remote, wallMillis: wall) }
    }

    var currentClock: HLCTimestamp { clock.withLock { $0.last } }
}

/// A point in a store's history as this process has seen it (`DocumentStore.contentVersion`).
public struct ContentVersion: Sendable, Hashable {
    public var sequence: UInt64
    public var purges: UInt64
}
