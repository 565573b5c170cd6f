import FerryCore
import FerryStore
import FerryTransport
import Foundation
import Testing

@testable import FerryNode

/// Backup and restore of a data directory, in process: what is kept, what is renewed, and
/// what is refused without changing anything.
@Suite struct DataDirectoryBackupTests {
    func docID(_ s: String) -> DocumentID { try! DocumentID(s) }

    func tempDir() -> String {
        let d = NSTemporaryDirectory() + "ferry-backup-\(UUID().uuidString)"
        try! FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }

    /// A data directory with documents, a blob, an identity and a trust file.
    func sampleNode(_ root: String) throws -> (directory: String, nodeID: String, blob: BlobReference, uuid: String) {
        let directory = root + "/node"
        let store = try DocumentStore.open(directory: directory)
        let blob = try store.blobs.put(Array(repeating: 7, count: 100_000))
        for i in 0..<50 { _ = try store.put(docID("doc-\(i)"), body: ["i": .int(Int64(i))]) }
        _ = try store.put(docID("with-blob"), body: ["file": blob.json])
        let identity = try NodeIdentity.loadOrCreate(directory: directory)
        try #"{"peers":[]}"#.write(toFile: directory + "/trust.json", atomically: true, encoding: .utf8)
        return (directory, identity.nodeID, blob, store.uuid)
    }

    @Test func aRestoredBackupHasTheDocumentsBlobsAndIdentityAndANewDatabaseUUID() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        let backup = try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup")
        #expect(backup.documents == 51 && backup.blobs == 1 && backup.nodeID == node.nodeID)
        #expect(backup.linkedBlobs == 1, "same file system: the blob is hard-linked")
        #expect(FileManager.default.fileExists(atPath: root + "/backup/backup.json"))
        #expect(!FileManager.default.fileExists(atPath: root + "/backup/ferry.sqlite-wal"), "the copy is closed cleanly")

        let restored = try DataDirectoryBackup.restore(backup: root + "/backup", to: root + "/restored")
        #expect(restored.nodeID == node.nodeID && restored.documents == 51)
        #expect(restored.database != node.uuid && restored.database != backup.database)
        let store = try DocumentStore.openExisting(directory: root + "/restored")
        #expect(try store.document(docID("doc-49"))?.body["i"] == 49)
        #expect(try store.blobs.get(node.blob.digest)?.count == 100_000)
        #expect(FileManager.default.fileExists(atPath: root + "/restored/trust.json"))
        #expect(!FileManager.default.fileExists(atPath: root + "/restored/restore.incomplete"))
        #expect(try NodeIdentity.loadOrCreate(directory: root + "/restored").nodeID == node.nodeID)
    }

    @Test func aRestoreWithANewIdentityIsANewNodeOutsideTheOldGroup() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        try "{}".write(toFile: node.directory + "/group.json", atomically: true, encoding: .utf8)
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup", copyBlobs: true)
        let restored = try DataDirectoryBackup.restore(backup: root + "/backup", to: root + "/new", newIdentity: true)
        #expect(restored.nodeID != node.nodeID && restored.documents == 51)
        #expect(!FileManager.default.fileExists(atPath: root + "/new/group.json"))
        #expect(FileManager.default.fileExists(atPath: root + "/new/trust.json"), "whom it trusts is kept")
    }

    @Test func aBackupNeverWritesIntoANonEmptyDestination() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        try FileManager.default.createDirectory(atPath: root + "/taken", withIntermediateDirectories: true)
        try "keep me".write(toFile: root + "/taken/note.txt", atomically: true, encoding: .utf8)
        #expect(throws: BackupError.self) { try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/taken") }
        #expect(try FileManager.default.contentsOfDirectory(atPath: root + "/taken") == ["note.txt"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).filter { $0.contains(".backup-") }.isEmpty)
        // An empty directory is fine (a mount point, a directory made for it).
        try FileManager.default.createDirectory(atPath: root + "/empty", withIntermediateDirectories: true)
        #expect(try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/empty").documents == 51)
    }

    @Test func aRestoreRefusesANonEmptyDirectoryAndWhatIsNotABackup() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup")
        #expect(throws: BackupError.self) { try DataDirectoryBackup.restore(backup: root + "/backup", to: node.directory) }
        #expect(throws: BackupError.self) { try DataDirectoryBackup.restore(backup: node.directory, to: root + "/x") }
        #expect(try DocumentStore.openExisting(directory: node.directory).uuid == node.uuid, "the existing node is untouched")
    }

    @Test func nodesRefuseABackupAndAnUnfinishedRestoreWhichRunningRestoreAgainFinishes() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup")
        #expect(throws: BackupError.self) { try DataDirectoryBackup.refuseUnusable(root + "/backup") }
        #expect(throws: BackupError.self) {
            try FerryNode(configuration: NodeConfiguration(), dataDirectory: root + "/backup")
        }
        // A restore that died half-way: its marker and some files.
        let half = root + "/half"
        try FileManager.default.createDirectory(atPath: half, withIntermediateDirectories: true)
        try "".write(toFile: half + "/restore.incomplete", atomically: true, encoding: .utf8)
        try "junk".write(toFile: half + "/ferry.sqlite", atomically: true, encoding: .utf8)
        #expect(throws: BackupError.self) { try DataDirectoryBackup.refuseUnusable(half) }
        let restored = try DataDirectoryBackup.restore(backup: root + "/backup", to: half)
        #expect(restored.documents == 51)
        try DataDirectoryBackup.refuseUnusable(half)
    }

    @Test func workDirectoriesOfDeadBackupsAreRemovedAndLiveOnesKept() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        // pid 2^22 + 1 is above Linux's maximum pid, so no process has it.
        let dead = root + "/.b.backup-4194305"
        let live = root + "/.b.backup-1"
        for d in [dead, live] { try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true) }
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/b")
        #expect(!FileManager.default.fileExists(atPath: dead))
        #expect(FileManager.default.fileExists(atPath: live), "pid 1 runs: its work is not ours to remove")
    }

    @Test func aBackupKeepsTheMarkersOfDeferredBlobs() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let directory = root + "/node"
        let store = try DocumentStore.open(directory: directory)
        let lazy = BlobReference(digest: try BlobDigest(String(repeating: "ab", count: 32)), length: 5_000_000)
        try store.blobs.markDeferred(lazy)
        _ = try store.put(docID("lazy"), body: ["file": lazy.json])
        let backup = try DataDirectoryBackup.backup(dataDirectory: directory, to: root + "/backup")
        #expect(backup.blobs == 0)
        try DataDirectoryBackup.restore(backup: root + "/backup", to: root + "/restored")
        #expect(try DocumentStore.openExisting(directory: root + "/restored").blobs.deferredLength(lazy.digest) == 5_000_000)
    }

    @Test func aBackupIntoTheDataDirectoryItselfIsRefused() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        #expect(throws: BackupError.self) { try DataDirectoryBackup.backup(dataDirectory: node.directory, to: node.directory + "/backups/one") }
        #expect(throws: BackupError.self) { try DataDirectoryBackup.backup(dataDirectory: node.directory, to: node.directory) }
        #expect(!FileManager.default.fileExists(atPath: node.directory + "/backups"))
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/b")
        #expect(throws: BackupError.self) { try DataDirectoryBackup.restore(backup: root + "/b", to: root + "/b/inside") }
    }
}
