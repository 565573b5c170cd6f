import FerryCore
import FerryStore

/// A node's record of how far it holds other databases' feeds: per remote database UUID,
/// the sequence of that database's changes feed through which this store holds everything
/// the database would send an unrestricted peer. Only complete coverage is recorded (the
/// intake was unrestricted both ways), so an entry is always safe to start a pull from.
///
/// Entries are local documents `coverage/<uuid>` (`{"seq": n}`), one small document per
/// database this node has replicated with: nothing per document, so memory and storage stay
/// flat however large the databases are. An entry only ever rises, except that a purge for
/// access drops every entry (the store then lacks documents it claimed to hold, which must be
/// able to come back); a purge by hand takes nothing back, as a purge never replicates either.
enum Coverage {
    static let prefix = DocumentStore.coveragePrefix

    static func localID(_ database: String) -> String { prefix + database }

    /// This store's coverage of `database`'s feed; nil when none is recorded.
    static func of(_ database: String, in store: DocumentStore) throws -> UInt64? {
        guard let n = try store.localDocument(localID(database))?["seq"]?.intValue else { return nil }
        return UInt64(max(0, n))
    }

    /// Records that this store holds `database`'s feed through `sequence` (never lowers an entry).
    static func raise(_ database: String, to sequence: UInt64, in store: DocumentStore) throws {
        guard !database.isEmpty, database != store.uuid, sequence > 0 else { return }
        // Relaxed like the batches it follows: a power loss takes it back with them.
        try store.raiseLocalSequence(localID(database), to: sequence, durability: .normal)
    }

    /// Every recorded entry, by database UUID.
    static func all(in store: DocumentStore) throws -> [String: UInt64] {
        var out: [String: UInt64] = [:]
        for (id, body) in try store.localDocuments(prefix: prefix) {
            guard let n = body["seq"]?.intValue, n > 0 else { continue }
            out[String(id.dropFirst(prefix.count))] = UInt64(n)
        }
        return out
    }

    /// What this store tells a peer in hello: the end of its own feed now, and its coverage
    /// of every other database but the peer's own (`peerDatabase`, when known).
    static func snapshot(of store: DocumentStore, leavingOut peerDatabase: String?) throws -> CoverageSnapshot {
        var dbs = try all(in: store)
        if let peerDatabase { dbs[peerDatabase] = nil }
        return CoverageSnapshot(sequence: try store.lastChangeSequence, databases: dbs)
    }

    /// Takes over a peer's snapshot once this store holds the peer's feed through the
    /// snapshot's `sequence`: everything the peer covered then was in that part of its feed.
    /// Returns how many entries rose.
    @discardableResult
    static func adopt(_ snapshot: CoverageSnapshot, in store: DocumentStore) throws -> Int {
        let mine = try all(in: store)
        var raised = 0
        for (database, sequence) in snapshot.databases where database != store.uuid && sequence > (mine[database] ?? 0) {
            try raise(database, to: sequence, in: store)
            raised += 1
        }
        return raised
    }
}

/// A node's coverage as it states it in hello (docs/protocol.md, "Join catch-up"): its
/// feed's end when it said hello, and the sequence through which it held each other
/// database's feed. Sent only to a peer this node serves without restriction.
package struct CoverageSnapshot: Sendable, Equatable {
    /// The sequence of the newest entry in the sender's own feed when it said hello.
    package var sequence: UInt64
    /// Complete coverage entries by database UUID.
    package var databases: [String: UInt64]

    /// At most this many entries are read from a peer's hello (one per database of a group).
    package static let maxDatabases = 10_000

    package var json: JSON {
        [
            "seq": .int(Int64(clamping: sequence)),
            "dbs": .object(databases.mapValues { .int(Int64(clamping: $0)) }),
        ]
    }

    package init(sequence: UInt64, databases: [String: UInt64]) {
        self.sequence = sequence
        self.databases = databases
    }

    /// Reads the `coverage` property of a hello; nil (no snapshot: today's behaviour) when it
    /// is absent or malformed, so an odd peer can only lose itself the shortcut.
    init?(_ value: JSON?) {
        guard let value, let seq = value["seq"]?.intValue, seq >= 0, let dbs = value["dbs"]?.objectValue,
            dbs.count <= Self.maxDatabases
        else { return nil }
        var databases: [String: UInt64] = [:]
        for (db, n) in dbs {
            guard !db.isEmpty, db.utf8.count <= 200, let n = n.intValue, n >= 0 else { return nil }
            databases[db] = UInt64(n)
        }
        self.init(sequence: UInt64(seq), databases: databases)
    }
}

extension ReplicatorConfiguration {
    /// This node's coverage for the hello request: only when it pushes to the peer
    /// unfiltered (what it covers is then what the peer may receive from it; a peer whose
    /// read policy here holds documents back must not take over coverage of them).
    func coverageForHello(_ store: DocumentStore) -> CoverageSnapshot? {
        guard direction.pushes, pushFilter == nil, documentIDs == nil, remotePolicy.read.admitsEverything else { return nil }
        return try? Coverage.snapshot(of: store, leavingOut: nil)
    }

    /// Whether what a pull from `remote` brings reaches the store unrestricted: the remote
    /// serves it everything (it stated its coverage), and neither its policy here nor a pull
    /// filter or document list holds anything back.
    func pullIntakeIsComplete(from remote: RemoteIdentity) -> Bool {
        // A remote that does not list the relays it skips could make coverage claim them.
        remote.coverage != nil && remote.reportsSkips && pullFilter == nil && documentIDs == nil && remotePolicy.write.admitsEverything
            && remotePolicy.mayDelete
    }
}
