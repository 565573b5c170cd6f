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

    @Test func theRememberedSignedEntriesGoWithTheGroupFiles() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        let known = MembershipLedger.knownFileName
        for file in ["group.json", known] {
            try "{}".write(toFile: node.directory + "/" + file, atomically: true, encoding: .utf8)
        }
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup")
        try DataDirectoryBackup.restore(backup: root + "/backup", to: root + "/same")
        #expect(FileManager.default.fileExists(atPath: root + "/same/" + known))
        try DataDirectoryBackup.restore(backup: root + "/backup", to: root + "/new", newIdentity: true)
        #expect(!FileManager.default.fileExists(atPath: root + "/new/" + known), "a new node is outside the old group")
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

    // MARK: links, special files and strays

    /// A file outside every directory the tests back up or restore, that no copy may hold.
    func secret(_ root: String) throws -> String {
        let directory = root + "/elsewhere"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try "secret-4711\n".write(toFile: directory + "/shadow", atomically: true, encoding: .utf8)
        return directory + "/shadow"
    }

    /// A node backed up into ROOT/backup.
    func sampleBackup(_ root: String) throws -> (node: String, backup: String) {
        let node = try sampleNode(root)
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup")
        return (node.directory, root + "/backup")
    }

    /// Requires `body` to throw a refusal naming `path`.
    func expectRefusal(naming path: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) {
        let error = #expect(throws: BackupError.self, sourceLocation: sourceLocation) { try body() }
        #expect(error?.code == "refused_entry", "\(String(describing: error))", sourceLocation: sourceLocation)
        #expect(error?.description.contains(path) == true, "the refusal names \(path): \(String(describing: error))", sourceLocation: sourceLocation)
    }

    /// Restoring `backup` is refused naming `path`, and neither a new target nor an empty
    /// one nor one an interrupted restore left is written to.
    func expectRestoreRefused(_ root: String, backup: String, naming path: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let fm = FileManager.default
        let new = root + "/restored-\(UUID().uuidString)"
        expectRefusal(naming: path, sourceLocation: sourceLocation) { try DataDirectoryBackup.restore(backup: backup, to: new) }
        #expect(!fm.fileExists(atPath: new), "a new target is not even created", sourceLocation: sourceLocation)

        let empty = root + "/empty-\(UUID().uuidString)"
        try fm.createDirectory(atPath: empty, withIntermediateDirectories: true)
        expectRefusal(naming: path, sourceLocation: sourceLocation) { try DataDirectoryBackup.restore(backup: backup, to: empty) }
        #expect(try fm.contentsOfDirectory(atPath: empty).isEmpty, "an empty target stays empty", sourceLocation: sourceLocation)

        // What an interrupted restore left is not cleared either.
        let half = root + "/half-\(UUID().uuidString)"
        try fm.createDirectory(atPath: half, withIntermediateDirectories: true)
        try "".write(toFile: half + "/restore.incomplete", atomically: true, encoding: .utf8)
        try "left".write(toFile: half + "/trust.json", atomically: true, encoding: .utf8)
        expectRefusal(naming: path, sourceLocation: sourceLocation) { try DataDirectoryBackup.restore(backup: backup, to: half) }
        #expect(
            try fm.contentsOfDirectory(atPath: half).sorted() == ["restore.incomplete", "trust.json"], "an interrupted target stays as it was",
            sourceLocation: sourceLocation)
    }

    @Test func aRestoreRefusesABackupLinkingAFileOutsideItAndWritesNothing() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let (_, backup) = try sampleBackup(root)
        let outside = try secret(root)
        try FileManager.default.removeItem(atPath: backup + "/trust.json")
        try FileManager.default.createSymbolicLink(atPath: backup + "/trust.json", withDestinationPath: outside)
        try expectRestoreRefused(root, backup: backup, naming: backup + "/trust.json")
    }

    @Test func aRestoreRefusesABackupLinkingADirectoryOutsideIt() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let (_, backup) = try sampleBackup(root)
        // An identity that would load, beside a secret, in a directory outside the backup.
        let outside = root + "/outside-identity"
        try FileManager.default.copyItem(atPath: backup + "/identity", toPath: outside)
        try "secret-4711\n".write(toFile: outside + "/secret.txt", atomically: true, encoding: .utf8)
        try FileManager.default.removeItem(atPath: backup + "/identity")
        try FileManager.default.createSymbolicLink(atPath: backup + "/identity", withDestinationPath: outside)
        try expectRestoreRefused(root, backup: backup, naming: backup + "/identity")
    }

    @Test func aRestoreRefusesABackupHoldingALinkLoop() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let (_, backup) = try sampleBackup(root)
        try FileManager.default.createSymbolicLink(atPath: backup + "/identity/loop", withDestinationPath: ".")
        try expectRestoreRefused(root, backup: backup, naming: backup + "/identity/loop")
    }

    @Test func aRestoreRefusesABackupHoldingAFIFOWithoutOpeningIt() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let (_, backup) = try sampleBackup(root)
        let fifo = backup + "/couch-users.json"
        let feeder = try FIFOFeeder(path: fifo, content: "secret-4711\n")
        defer { feeder.release() }
        // One attempt: the feeder serves one reader.
        expectRefusal(naming: fifo) { try DataDirectoryBackup.restore(backup: backup, to: root + "/restored") }
        #expect(!FileManager.default.fileExists(atPath: root + "/restored"))
    }

    @Test func aRestoreRefusesABackupHoldingAFileOutsideItsLayout() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let (_, backup) = try sampleBackup(root)
        try "stray".write(toFile: backup + "/notes.txt", atomically: true, encoding: .utf8)
        try expectRestoreRefused(root, backup: backup, naming: backup + "/notes.txt")
        try FileManager.default.removeItem(atPath: backup + "/notes.txt")
        try FileManager.default.createDirectory(atPath: backup + "/blobs/extra", withIntermediateDirectories: true)
        try expectRestoreRefused(root, backup: backup, naming: backup + "/blobs/extra")
    }

    @Test func aBackupThatACommandOpenedStillRestores() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let (_, backup) = try sampleBackup(root)
        // What `ferry --data BACKUP check` or `ls` does to it.
        let reader = try DocumentStore.openExisting(directory: backup)
        #expect(try reader.integrityCheck() == ["ok"])
        let restored = try DataDirectoryBackup.restore(backup: backup, to: root + "/restored")
        #expect(restored.documents == 51 && restored.blobs == 1)
        withExtendedLifetime(reader) {}
    }

    @Test func aBackupRefusesALinkWhereAFileOfTheDataDirectoryBelongsAndWritesNothing() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        let outside = try secret(root)
        try FileManager.default.removeItem(atPath: node.directory + "/trust.json")
        try FileManager.default.createSymbolicLink(atPath: node.directory + "/trust.json", withDestinationPath: outside)
        expectRefusal(naming: node.directory + "/trust.json") {
            try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup")
        }
        #expect(!FileManager.default.fileExists(atPath: root + "/backup"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).filter { $0.contains(".backup-") }.isEmpty)
    }

    @Test func aBackupRefusesALinkedBlobRatherThanCopyingItsTarget() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        let outside = try secret(root)
        let blob = node.directory + "/blobs/\(node.blob.digest.hex.prefix(2))/\(node.blob.digest.hex)"
        try FileManager.default.removeItem(atPath: blob)
        try FileManager.default.createSymbolicLink(atPath: blob, withDestinationPath: outside)
        expectRefusal(naming: blob) {
            try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup", copyBlobs: true)
        }
        #expect(!FileManager.default.fileExists(atPath: root + "/backup"))
    }

    @Test func aBackupLeavesALinkOutsideTheLayoutBehindUnfollowedAndRestores() throws {
        let root = tempDir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let node = try sampleNode(root)
        let outside = try secret(root)
        try FileManager.default.createSymbolicLink(
            atPath: node.directory + "/escape", withDestinationPath: (outside as NSString).deletingLastPathComponent)
        try FileManager.default.createSymbolicLink(atPath: node.directory + "/identity/loop", withDestinationPath: ".")
        try DataDirectoryBackup.backup(dataDirectory: node.directory, to: root + "/backup")
        let copied = try FileManager.default.subpathsOfDirectory(atPath: root + "/backup")
        #expect(!copied.contains { $0.hasPrefix("escape") || $0.contains("loop") }, "\(copied)")
        #expect(try DataDirectoryBackup.restore(backup: root + "/backup", to: root + "/restored").documents == 51)
    }
}

/// A FIFO whose writer waits on its own thread for one reader and then writes `content`: a
/// restore that opened it would copy the content rather than block, and `release` lets the
/// writer finish when nothing opened it.
final class FIFOFeeder: Sendable {
    let path: String
    let done = DispatchSemaphore(value: 0)

    init(path: String, content: String) throws {
        self.path = path
        try? FileManager.default.removeItem(atPath: path)
        guard mkfifo(path, 0o600) == 0 else { throw CocoaError(.fileWriteUnknown) }
        let done = done
        Thread.detachNewThread {
            let fd = open(path, O_WRONLY)
            if fd >= 0 {
                _ = Array(content.utf8).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                close(fd)
            }
            done.signal()
        }
    }

    /// Opens the FIFO for reading without blocking, so a writer still waiting goes on, and
    /// waits for it to finish.
    func release() {
        let fd = open(path, O_RDONLY | O_NONBLOCK)
        done.wait()
        if fd >= 0 { close(fd) }
    }
}
