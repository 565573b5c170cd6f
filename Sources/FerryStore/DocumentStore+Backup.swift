import FerryCore
import Foundation
import GRDB

// Consistent copies of the database for backup and restore.
extension DocumentStore {
    /// Writes a consistent copy of the database to a new file `path` with SQLite's online
    /// backup, from one read snapshot: writers go on meanwhile and none of their later
    /// commits is half in the copy. The copy is fsynced before this returns.
    public func backupDatabase(to path: String) throws(StoreError) {
        guard !FileManager.default.fileExists(atPath: path) else { throw .io("\(path) exists; a backup never overwrites a file") }
        let fd = Foundation.open(path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else { throw .io("cannot create \(path): \(StoreError.describe(errno: errno))") }
        close(fd)
        do {
            let destination = try DatabaseQueue(path: path)
            try writer.backup(to: destination)
            try destination.close()
        } catch {
            throw .io("backup of the database to \(path) failed: \(StoreError.wrap(error).description)")
        }
        try Self.fsyncFile(path)
    }

    /// Every blob the stored revisions refer to (current bodies and bodies kept in trees).
    public func referencedBlobs() throws(StoreError) -> Set<BlobDigest> {
        try read { db in
            var found = Set<BlobDigest>()
            try Self.collectReferences(db, sql: "SELECT id, body, tree FROM documents", arguments: [], into: &found)
            return found
        }
    }

    /// Copies the database file `source` (a closed copy, such as a backup's) to the new file
    /// `destination` and gives the copy a new database UUID. Peers keep checkpoints and
    /// coverage by UUID and sequence: a restored database numbers its changes again from an
    /// older point, so under its old UUID peers would skip every change it makes whose
    /// sequence they believe they have seen.
    public static func restoreDatabase(from source: String, to destination: String) throws(StoreError) {
        guard !FileManager.default.fileExists(atPath: destination) else { throw .io("\(destination) exists") }
        let fd = Foundation.open(destination, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else { throw .io("cannot create \(destination): \(StoreError.describe(errno: errno))") }
        close(fd)
        do {
            var readOnly = Configuration()
            readOnly.readonly = true
            let from = try DatabaseQueue(path: source, configuration: readOnly)
            let to = try DatabaseQueue(path: destination)
            try from.backup(to: to)
            try to.write { db in
                try db.execute(sql: "UPDATE store_state SET uuid = ? WHERE singleton = 1", arguments: [UUID().uuidString.lowercased()])
            }
            try from.close()
            try to.close()
        } catch {
            throw .io("restore of the database \(source) to \(destination) failed: \(StoreError.wrap(error).description)")
        }
        try fsyncFile(destination)
    }

    static func fsyncFile(_ path: String) throws(StoreError) {
        let fd = Foundation.open(path, O_RDONLY)
        guard fd >= 0 else { throw .io("cannot open \(path): \(StoreError.describe(errno: errno))") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw .io("fsync of \(path): \(StoreError.describe(errno: errno))") }
    }
}
