import FerryCore
import FerryStore
import FerryTransport
import Foundation

/// Backs up a data directory, running node or not, and restores a backup into an empty
/// one. A backup is itself a data directory (database, blobs, identity, trust, users, group)
/// plus `backup.json`, which no `serve` starts on; it is written beside its destination and
/// renamed into place at the end, so an interrupted backup leaves no half backup and never
/// touches an earlier one. Neither follows a link or opens a special file in the tree it
/// reads: a backup copies only the regular files and directories of a data directory's
/// layout, and a restore refuses a backup holding anything else before it writes anything.
/// Every call blocks on file I/O and fsync: a serving process calls it from a thread made
/// for blocking work, never from a task on Swift's cooperative pool.
public enum DataDirectoryBackup {
    /// Marks a backup; `serve` refuses a directory holding it.
    public static let markerFile = "backup.json"
    /// Present while a restore runs; `serve` and the CLI refuse a directory holding it.
    public static let incompleteFile = "restore.incomplete"
    /// Files of a running node that say nothing about its data.
    static let runtimeFiles: Set<String> = ["node.json", "serve.lock", markerFile, incompleteFile]
    /// What belongs to the node's identity: left behind by `--new-identity`. A new node is
    /// not a member of the old one's group (its entry is signed for the old ID).
    static let identityFiles: Set<String> = [
        "identity", "admin.key", "couch-session.key", "group.json", "invitations.json", MembershipLedger.knownFileName,
    ]
    /// The regular files at the top of a data directory that a backup carries besides the
    /// database and the identity. A file a node keeps in its data directory must be listed
    /// here: a backup leaves anything else behind, and a restore refuses it.
    static let carriedFiles: Set<String> = [
        "trust.json", "couch-users.json", "group.json", MembershipLedger.knownFileName, "replications.json", "invitations.json",
        "admin.key", "couch-session.key",
    ]
    /// The files of the `identity` directory.
    static let identityContents: Set<String> = ["cert.pem", "key.pem"]
    /// SQLite's files beside the database: a node's are never copied (the online backup
    /// reads through them); a backup holds them only after a command opened it.
    static let databaseCompanions: Set<String> = [DocumentStore.databaseFileName + "-wal", DocumentStore.databaseFileName + "-shm"]

    /// What a backup or restore did.
    public struct Summary: Sendable, Equatable {
        public var nodeID: String
        public var documents: Int
        public var blobs: Int
        /// Blobs hard-linked rather than copied (same file system; a blob never changes).
        public var linkedBlobs: Int
        public var blobBytes: Int64
        public var database: String
        /// What the data directory holds outside a data directory's layout, relative to it
        /// (a backup leaves it behind, never following it); empty for a restore.
        public var leftBehind: [String] = []
    }

    /// Backs up `dataDirectory` to the new directory `destination` (absent, or an empty
    /// directory). Blobs are hard-linked when both are on one file system unless `copyBlobs`.
    /// Verified before it is put in place: the copy passes SQLite's integrity check and holds
    /// every blob its documents refer to (or the deferred marker of a lazy one). Refused,
    /// before anything is written, when what it would copy is a symbolic link or a special
    /// file; what lies outside the layout is left behind and listed in `leftBehind`.
    @discardableResult
    public static func backup(dataDirectory: String, to destination: String, copyBlobs: Bool = false) throws(BackupError) -> Summary {
        try refuseUnusable(dataDirectory)
        let target = URL(fileURLWithPath: destination).standardizedFileURL.path
        let refuse = { (path: String, problem: String) -> BackupError in
            .refused(
                path: path,
                message: "cannot back up \(LogText.escape(dataDirectory)): \(LogText.escape(path)) \(problem); a backup copies only "
                    + "regular files and directories and follows no link, so nothing was written to \(LogText.escape(target))")
        }
        // Checked before the store is opened, so SQLite never opens a linked database.
        let manifest = try scan(dataDirectory, as: .dataDirectory, refuse: refuse)
        let source = try io { try DocumentStore.openExisting(directory: dataDirectory) }
        if isInside(target, dataDirectory) {
            throw .destinationExists("the backup destination \(target) is inside the data directory \(dataDirectory); choose one outside it")
        }
        try requireEmptyOrAbsent(target, what: "backup destination")
        let work = try workDirectory(for: target, kind: "backup")
        var completed = false
        defer { if !completed { try? FileManager.default.removeItem(atPath: work) } }

        let tree = try SourceTree(dataDirectory, refuse: refuse)
        let nodeID = identityID(dataDirectory)
        // Blobs first, then the snapshot, then what the snapshot refers to and the first pass
        // missed: a blob is stored before any revision that refers to it, and the collector
        // removes only blobs unreferenced for a grace period.
        var counts = BlobCounts()
        for blob in manifest.blobs {
            // The collector may remove an unreferenced blob meanwhile; what is referenced is checked later.
            try transferBlob(blob, from: tree, to: work, copy: copyBlobs, counts: &counts)
        }
        try io { try source.backupDatabase(to: "\(work)/\(DocumentStore.databaseFileName)") }
        for file in manifest.files {
            try makeDirectory(parent(of: "\(work)/\(file)"))
            _ = try tree.copy(file, to: "\(work)/\(file)", link: false)
        }
        // Verified through a store that is closed again before the rename (no WAL left behind).
        let (documents, database) = try verify(work) { copy throws(BackupError) in
            let referenced = try io { try copy.referencedBlobs() }
            let missing = referenced.filter { !copy.blobs.has($0) && copy.blobs.deferredLength($0) == nil }
            if !missing.isEmpty {
                for digest in missing {
                    let stored = "\(digest.hex.prefix(2))/\(digest.hex)"
                    if try !transferBlob(stored, from: tree, to: work, copy: copyBlobs, counts: &counts) {
                        try transferBlob("deferred/\(digest.hex)", from: tree, to: work, copy: copyBlobs, counts: &counts)
                    }
                }
                let still = missing.filter { !copy.blobs.has($0) && copy.blobs.deferredLength($0) == nil }
                if let first = still.first {
                    throw .incomplete("\(still.count) blobs the documents refer to are missing from \(dataDirectory) (first \(first)); nothing was written to \(target)")
                }
            }
        }
        let summary = Summary(
            nodeID: nodeID, documents: documents, blobs: counts.blobs, linkedBlobs: counts.linked, blobBytes: counts.bytes,
            database: database, leftBehind: manifest.leftBehind)
        let marker: JSON = [
            "ferryBackup": 1, "version": .string(FerryVersion.current), "node": .string(nodeID), "database": .string(database),
            "created": .string(ISO8601DateFormatter().string(from: Date())), "documents": .int(Int64(documents)),
            "blobs": .int(Int64(counts.blobs)), "source": .string(URL(fileURLWithPath: dataDirectory).standardizedFileURL.path),
        ]
        do { try writeAtomically(marker, to: "\(work)/\(markerFile)") } catch { throw .io(error.description) }
        try syncTree(work)
        try putInPlace(work, at: target)
        completed = true
        return summary
    }

    /// Restores the backup `backup` into `dataDirectory` (absent, empty, or left by an
    /// interrupted restore), as the same node, or with `newIdentity` as a new one (a new
    /// certificate, admin key and session secret; no group membership). Either way the
    /// database gets a new UUID (see `DocumentStore.restoreDatabase`), so peers send what
    /// it lacks and take what it writes. Refused while a node runs on `dataDirectory`.
    /// The whole backup is checked first, without following any link: a symbolic link, a
    /// special file or anything outside a backup's layout is refused, naming its path, and
    /// `dataDirectory` is left as it was (not created, not cleared).
    @discardableResult
    public static func restore(backup: String, to dataDirectory: String, newIdentity: Bool = false, copyBlobs: Bool = false)
        throws(BackupError) -> Summary
    {
        let fm = FileManager.default
        let target = URL(fileURLWithPath: dataDirectory).standardizedFileURL.path
        let refuse = { (path: String, problem: String) -> BackupError in
            .refused(
                path: path,
                message: "cannot restore \(LogText.escape(backup)): \(LogText.escape(path)) \(problem); a backup holds only the "
                    + "regular files and directories of a data directory, so nothing was written to \(LogText.escape(target))")
        }
        // A file the check passed that is not what the copy finds: a change made meanwhile.
        let refuseChanged = { (path: String, problem: String) -> BackupError in
            .refused(
                path: path,
                message: "cannot restore \(LogText.escape(backup)): \(LogText.escape(path)) \(problem) (it changed during the restore); "
                    + "\(LogText.escape(target)) holds an unfinished restore (\(incompleteFile))")
        }
        // Nothing below writes until the backup and the target have both been checked.
        try readMarker(backup, refuse: refuse)
        let manifest = try scan(backup, as: .backup, refuse: refuse)
        if isInside(target, backup) || isInside(backup, target) {
            throw .destinationExists("the data directory \(target) and the backup \(backup) must not contain each other")
        }
        let interrupted = fm.fileExists(atPath: "\(target)/\(incompleteFile)")
        if !interrupted { try requireEmptyOrAbsent(target, what: "data directory") }
        let tree = try SourceTree(backup, refuse: refuseChanged)

        do {
            try fm.createDirectory(atPath: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(target): \(error.localizedDescription)")
        }
        let lock: DataDirectoryLock
        do { lock = try DataDirectoryLock(directory: target) } catch { throw .nodeRunning(error.description) }
        defer { withExtendedLifetime(lock) {} }
        if interrupted {
            // An interrupted restore (no other one holds the lock): start again from nothing.
            try clear(target)
        }
        guard fm.createFile(atPath: "\(target)/\(incompleteFile)", contents: Data("restoring from \(backup)\n".utf8)) else {
            throw .io("cannot write \(target)/\(incompleteFile)")
        }
        // SQLite opens the database by its path: it must still be the file that was checked.
        let database = "\(backup)/\(DocumentStore.databaseFileName)"
        try tree.requireUnchanged(DocumentStore.databaseFileName, manifest.database)
        try io { try DocumentStore.restoreDatabase(from: database, to: "\(target)/\(DocumentStore.databaseFileName)") }
        try tree.requireUnchanged(DocumentStore.databaseFileName, manifest.database)
        var counts = BlobCounts()
        try makeDirectory("\(target)/blobs")
        for blob in manifest.blobs {
            guard try transferBlob(blob, from: tree, to: target, copy: copyBlobs, counts: &counts) else {
                throw refuseChanged("\(backup)/blobs/\(blob)", "is gone")
            }
        }
        for file in manifest.files {
            if newIdentity, let top = file.split(separator: "/").first, identityFiles.contains(String(top)) { continue }
            try makeDirectory(parent(of: "\(target)/\(file)"))
            guard try tree.copy(file, to: "\(target)/\(file)", link: false) != nil else {
                throw refuseChanged("\(backup)/\(file)", "is gone")
            }
        }
        let nodeID: String
        do { nodeID = try NodeIdentity.loadOrCreate(directory: target).nodeID } catch { throw .io(error.description) }
        let (documents, uuid) = try verify(target) { _ throws(BackupError) in }
        try syncTree(target)
        guard unlink("\(target)/\(incompleteFile)") == 0 else { throw .io("cannot remove \(target)/\(incompleteFile): errno \(errno)") }
        return Summary(
            nodeID: nodeID, documents: documents, blobs: counts.blobs, linkedBlobs: counts.linked, blobBytes: counts.bytes, database: uuid)
    }

    /// Refuses to run a node on a backup or on a directory whose restore did not finish.
    public static func refuseUnusable(_ dataDirectory: String) throws(BackupError) {
        if FileManager.default.fileExists(atPath: "\(dataDirectory)/\(markerFile)") {
            throw .notADataDirectory(
                "\(dataDirectory) is a backup made by `ferry backup`; bring it back with `ferry restore \(dataDirectory) --data DIR` (a node never runs on a backup)")
        }
        if FileManager.default.fileExists(atPath: "\(dataDirectory)/\(incompleteFile)") {
            throw .notADataDirectory(
                "a restore into \(dataDirectory) did not finish; run `ferry restore BACKUP --data \(dataDirectory)` again")
        }
    }

    // MARK: layout

    /// What `scan` found to copy, as paths relative to the directory it read.
    struct Manifest {
        /// Regular files besides the database and blobs: identity, trust, users, group, keys.
        var files: [String] = []
        /// Under `blobs/`: stored blobs (`ab/ab…`) and deferred markers (`deferred/ab…`).
        var blobs: [String] = []
        /// What lies outside the layout (a data directory's; a backup's is refused).
        var leftBehind: [String] = []
        /// The database file as found, so a restore can tell that SQLite opened that one.
        var database: FileIdentity?
    }

    /// A file's device and inode.
    struct FileIdentity: Equatable {
        var device: UInt64
        var inode: UInt64
        init(_ st: stat) {
            device = UInt64(st.st_dev)
            inode = UInt64(st.st_ino)
        }
    }

    /// Whether `scan` reads a node's data directory (what lies outside the layout, and the
    /// run-time files, are left behind) or a backup (anything outside the layout is refused).
    enum Reading { case dataDirectory, backup }

    /// Walks `root` with lstat, never following a link, and answers what a backup or restore
    /// copies. Throws `refuse(path, problem)` for a symbolic link, FIFO, socket or device
    /// where a file or directory of the layout belongs, for a file where a directory belongs
    /// (or the reverse), and, reading a backup, for anything outside the layout.
    static func scan(_ root: String, as reading: Reading, refuse: (String, String) -> BackupError) throws(BackupError) -> Manifest {
        var manifest = Manifest()
        let top: OpenDirectory
        do { top = try OpenDirectory(path: root) } catch {
            throw .io("cannot read the directory \(root): \(String(cString: strerror(error.code)))")
        }
        /// Outside the layout: left behind by a backup, refused by a restore.
        func outside(_ directory: OpenDirectory, _ name: String, _ relative: String) throws(BackupError) {
            guard reading == .backup else { return manifest.leftBehind.append(relative) }
            let kind = directory.status(name).map { st in
                [S_IFREG, S_IFDIR].contains(st.st_mode & S_IFMT) ? "is" : "\(describe(st, in: directory, name)),"
            }
            throw refuse("\(root)/\(relative)", "\(kind ?? "is") not part of a Ferry backup")
        }
        func require(_ kind: mode_t, _ directory: OpenDirectory, _ name: String, _ relative: String) throws(BackupError) -> stat? {
            guard let st = directory.status(name) else { return nil }
            guard st.st_mode & S_IFMT == kind else {
                let belongs = kind == S_IFDIR ? "a directory" : "a regular file"
                throw refuse("\(root)/\(relative)", "\(describe(st, in: directory, name)), where \(belongs) belongs")
            }
            return st
        }
        func subdirectory(_ parent: OpenDirectory, _ name: String, _ relative: String) throws(BackupError) -> OpenDirectory? {
            guard try require(S_IFDIR, parent, name, relative) != nil else { return nil }
            do { return try OpenDirectory(in: parent, name) } catch {
                if error.code == ENOENT { return nil }
                throw refuse("\(root)/\(relative)", "cannot be opened as a directory (\(String(cString: strerror(error.code))))")
            }
        }

        for name in top.names() {
            let database = DocumentStore.databaseFileName
            switch name {
            case database:
                if let st = try require(S_IFREG, top, name, name) { manifest.database = FileIdentity(st) }
            case _ where databaseCompanions.contains(name):
                // SQLite reads a backup's through their paths; a node's stay behind.
                if reading == .backup { _ = try require(S_IFREG, top, name, name) }
            case markerFile where reading == .backup, "serve.lock" where reading == .backup:
                // The lock of a `serve` that was refused on the backup stays behind too.
                _ = try require(S_IFREG, top, name, name)
            case _ where reading == .dataDirectory && (runtimeFiles.contains(name) || name.hasSuffix(".tmp")):
                continue
            case _ where carriedFiles.contains(name):
                if try require(S_IFREG, top, name, name) != nil { manifest.files.append(name) }
            case "identity":
                guard let identity = try subdirectory(top, name, name) else { continue }
                for file in identity.names() {
                    let relative = "identity/\(file)"
                    if identityContents.contains(file) {
                        if try require(S_IFREG, identity, file, relative) != nil { manifest.files.append(relative) }
                    } else if reading == .dataDirectory && file.hasSuffix(".tmp") {
                        continue
                    } else {
                        try outside(identity, file, relative)
                    }
                }
            case "blobs":
                guard let blobs = try subdirectory(top, name, name) else { continue }
                for shard in blobs.names() {
                    let relative = "blobs/\(shard)"
                    let isShard = shard.utf8.count == 2 && shard.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
                    if isShard || shard == "deferred" {
                        guard let directory = try subdirectory(blobs, shard, relative) else { continue }
                        for file in directory.names() {
                            let digest = try? BlobDigest(file)
                            guard let digest, digest.hex == file, !isShard || digest.hex.hasPrefix(shard) else {
                                try outside(directory, file, "\(relative)/\(file)")
                                continue
                            }
                            if try require(S_IFREG, directory, file, "\(relative)/\(file)") != nil { manifest.blobs.append("\(shard)/\(file)") }
                        }
                    } else if shard == "tmp" || (shard == "partial" && reading == .dataDirectory) {
                        // Blobs being written and partly received ones stay behind. A backup's
                        // `tmp` is made empty by opening its store, and stays empty.
                        guard reading == .backup, let tmp = try subdirectory(blobs, shard, relative) else { continue }
                        if let first = tmp.names().first { try outside(tmp, first, "\(relative)/\(first)") }
                    } else {
                        try outside(blobs, shard, relative)
                    }
                }
            default:
                try outside(top, name, name)
            }
        }
        if reading == .backup && manifest.database == nil {
            throw .notABackup("\(root) holds no \(DocumentStore.databaseFileName); it is not a complete Ferry backup")
        }
        return manifest
    }

    /// Reads `backup.json` through a descriptor (never a link, never a FIFO) and requires it
    /// to mark a backup.
    static func readMarker(_ backup: String, refuse: (String, String) -> BackupError) throws(BackupError) {
        let notABackup = BackupError.notABackup(
            "\(backup) is not a Ferry backup (it has no \(markerFile); make one with `ferry backup DEST`)")
        guard let root = try? OpenDirectory(path: backup), let st = root.status(markerFile) else { throw notABackup }
        guard st.st_mode & S_IFMT == S_IFREG else {
            throw refuse("\(backup)/\(markerFile)", "\(describe(st, in: root, markerFile)), where a regular file belongs")
        }
        // A marker is a few hundred bytes; anything far larger is not one.
        guard st.st_size < 1 << 20, let file = try? root.openFile(markerFile), let bytes = try? readAll(file),
            let info = try? JSON.parse(bytes), info["ferryBackup"] != nil
        else { throw notABackup }
    }

    /// What a refused entry is, for the message naming it.
    static func describe(_ st: stat, in directory: OpenDirectory, _ name: String) -> String {
        switch st.st_mode & S_IFMT {
        case S_IFLNK:
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
            let n = readlinkat(directory.fd, name, &buffer, buffer.count)
            guard n >= 0 else { return "is a symbolic link" }
            let destination = String(decoding: buffer.prefix(n).map { UInt8(bitPattern: $0) }, as: UTF8.self)
            return "is a symbolic link (to \(LogText.escape(destination)))"
        case S_IFIFO: return "is a FIFO (named pipe)"
        case S_IFSOCK: return "is a socket"
        case S_IFCHR, S_IFBLK: return "is a device"
        case S_IFDIR: return "is a directory"
        case S_IFREG: return "is a regular file"
        default: return "is a special file"
        }
    }

    /// A directory opened once: what lies under it is reached by name from its descriptor
    /// with O_NOFOLLOW, so no link is followed, not even one put in place after a check.
    final class OpenDirectory {
        /// Why a directory could not be opened: an errno value.
        struct Failure: Error { let code: Int32 }

        let fd: Int32

        /// Opens `path` itself, following a link there: it is the path the operator named.
        init(path: String) throws(Failure) {
            fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { throw Failure(code: errno) }
        }

        /// Opens `name` in `parent`; a link there fails (ELOOP or ENOTDIR).
        init(in parent: OpenDirectory, _ name: String) throws(Failure) {
            fd = openat(parent.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { throw Failure(code: errno) }
        }

        deinit { close(fd) }

        /// The names of its entries, sorted.
        func names() -> [String] {
            let copy = dup(fd)
            guard copy >= 0 else { return [] }
            guard let stream = fdopendir(copy) else {
                close(copy)
                return []
            }
            defer { closedir(stream) }
            rewinddir(stream)
            var names: [String] = []
            while let entry = readdir(stream) {
                let name = withUnsafePointer(to: entry.pointee.d_name) { pointer in
                    pointer.withMemoryRebound(to: CChar.self, capacity: MemoryLayout.size(ofValue: pointer.pointee)) { String(cString: $0) }
                }
                if name != "." && name != ".." { names.append(name) }
            }
            return names.sorted()
        }

        /// lstat of `name`; nil when it does not exist.
        func status(_ name: String) -> stat? {
            var st = stat()
            return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? st : nil
        }

        /// Opens the regular file `name` for reading. A link fails (ELOOP); a FIFO opens
        /// without blocking and is refused by its type, like a socket or a device.
        func openFile(_ name: String) throws(Failure) -> Int32 {
            let file = openat(fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
            guard file >= 0 else { throw Failure(code: errno) }
            var st = stat()
            guard fstat(file, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
                close(file)
                throw Failure(code: EINVAL)
            }
            return file
        }
    }

    /// The tree a backup or restore copies from, its directories opened by name without
    /// following links; a path that is not what the check found is refused through `refuse`.
    final class SourceTree {
        let root: String
        let top: OpenDirectory
        let refuse: (String, String) -> BackupError
        private var opened: [String: OpenDirectory] = [:]

        init(_ root: String, refuse: @escaping (String, String) -> BackupError) throws(BackupError) {
            self.root = root
            self.refuse = refuse
            do { top = try OpenDirectory(path: root) } catch {
                throw .io("cannot read the directory \(root): \(String(cString: strerror(error.code)))")
            }
        }

        /// The directory `relative` (`blobs/ab`), opened one name at a time; nil when absent.
        func directory(_ relative: String) throws(BackupError) -> OpenDirectory? {
            if relative.isEmpty { return top }
            if let known = opened[relative] { return known }
            var current = top
            var walked = ""
            for part in relative.split(separator: "/").map(String.init) {
                walked = walked.isEmpty ? part : "\(walked)/\(part)"
                if let known = opened[walked] {
                    current = known
                    continue
                }
                do { current = try OpenDirectory(in: current, part) } catch {
                    if error.code == ENOENT { return nil }
                    throw refuse("\(root)/\(walked)", "is not a directory (\(String(cString: strerror(error.code))))")
                }
                opened[walked] = current
            }
            return current
        }

        /// Copies the regular file `relative` to the new file `destination`, or hard-links it
        /// with `link` where the file system allows; answers its size and whether it was
        /// linked, or nil when it is gone.
        func copy(_ relative: String, to destination: String, link: Bool) throws(BackupError) -> (bytes: Int64, linked: Bool)? {
            let name = String(relative.split(separator: "/").last ?? "")
            let folder = relative.split(separator: "/").dropLast().joined(separator: "/")
            let path = "\(root)/\(relative)"
            guard let directory = try self.directory(folder), let st = directory.status(name) else { return nil }
            guard st.st_mode & S_IFMT == S_IFREG else {
                throw refuse(path, "\(DataDirectoryBackup.describe(st, in: directory, name)), where a regular file belongs")
            }
            if link && linkat(directory.fd, name, AT_FDCWD, destination, 0) == 0 {
                // linkat links a link itself, never its target: what was linked must be a file.
                var linked = stat()
                guard lstat(destination, &linked) == 0, linked.st_mode & S_IFMT == S_IFREG else {
                    unlink(destination)
                    throw refuse(path, "is not a regular file")
                }
                return (Int64(linked.st_size), true)
            }
            let input: Int32
            do { input = try directory.openFile(name) } catch {
                switch error.code {
                case ENOENT: return nil
                case ELOOP, EINVAL:
                    // Replaced since the check above by a link or something that is not a file.
                    let now = directory.status(name).map { DataDirectoryBackup.describe($0, in: directory, name) } ?? "is gone"
                    throw refuse(path, now)
                default: throw .io("cannot read \(path): \(String(cString: strerror(error.code)))")
                }
            }
            defer { close(input) }
            return (try DataDirectoryBackup.copyFile(input, from: path, to: destination), false)
        }

        /// Refuses unless `relative` is still the file `expected`.
        func requireUnchanged(_ relative: String, _ expected: FileIdentity?) throws(BackupError) {
            guard let st = top.status(relative), st.st_mode & S_IFMT == S_IFREG, FileIdentity(st) == expected else {
                throw refuse("\(root)/\(relative)", "is not the file that was checked")
            }
        }
    }

    // MARK: steps

    /// Opens the store in `directory`, runs `check` on it, requires SQLite's integrity check
    /// to pass, and closes it again; answers its live documents and database UUID.
    static func verify(_ directory: String, _ check: (DocumentStore) throws(BackupError) -> Void) throws(BackupError) -> (Int, String) {
        let store = try io { try DocumentStore.openExisting(directory: directory) }
        try check(store)
        let findings = try io { try store.integrityCheck() }
        guard findings == ["ok"] else {
            throw .incomplete("the database copied to \(directory) fails its integrity check: \(findings.prefix(3).joined(separator: "; "))")
        }
        let documents = try io { try store.info().documentCount }
        return (documents, store.uuid)
    }

    struct BlobCounts {
        var blobs = 0
        var linked = 0
        var bytes: Int64 = 0
    }

    /// The node ID of the identity in `dataDirectory`, creating nothing; "?" when it has none.
    static func identityID(_ dataDirectory: String) -> String {
        let identity = "\(dataDirectory)/identity"
        return (try? NodeIdentity.load(certificatePath: "\(identity)/cert.pem", keyPath: "\(identity)/key.pem").nodeID) ?? "?"
    }

    /// Whether `path` is `directory` or lies under it (symbolic links resolved where they exist).
    static func isInside(_ path: String, _ directory: String) -> Bool {
        func resolved(_ p: String) -> String {
            let url = URL(fileURLWithPath: p).standardizedFileURL
            // The path may not exist yet: resolve its nearest existing ancestor.
            var existing = url
            var rest: [String] = []
            while !FileManager.default.fileExists(atPath: existing.path) && existing.path != "/" {
                rest.insert(existing.lastPathComponent, at: 0)
                existing.deleteLastPathComponent()
            }
            return ([existing.resolvingSymlinksInPath().path] + rest).joined(separator: "/").replacingOccurrences(of: "//", with: "/")
        }
        let p = resolved(path), d = resolved(directory)
        return p == d || p.hasPrefix(d.hasSuffix("/") ? d : d + "/")
    }

    static func requireEmptyOrAbsent(_ path: String, what: String) throws(BackupError) {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { return }
        guard isDirectory.boolValue else { throw .destinationExists("the \(what) \(path) exists and is not a directory") }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
        guard entries.isEmpty else {
            throw .destinationExists("the \(what) \(path) is not empty; choose a new one (nothing there is overwritten)")
        }
    }

    /// A fresh directory beside `target` (same file system, so the final rename is atomic),
    /// after removing what interrupted runs of dead processes left there.
    static func workDirectory(for target: String, kind: String) throws(BackupError) -> String {
        let url = URL(fileURLWithPath: target)
        let parent = url.deletingLastPathComponent().path
        let prefix = ".\(url.lastPathComponent).\(kind)-"
        let fm = FileManager.default
        for name in (try? fm.contentsOfDirectory(atPath: parent)) ?? [] where name.hasPrefix(prefix) {
            if let pid = Int32(name.dropFirst(prefix.count)), pid != getpid(), kill(pid, 0) != 0, errno == ESRCH {
                try? fm.removeItem(atPath: "\(parent)/\(name)")
            }
        }
        let work = "\(parent)/\(prefix)\(getpid())"
        try? fm.removeItem(atPath: work)
        do {
            try fm.createDirectory(atPath: work, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(work): \(error.localizedDescription)")
        }
        return work
    }

    static func putInPlace(_ work: String, at target: String) throws(BackupError) {
        // rename(2) replaces an empty directory and refuses a non-empty one: never a half swap.
        guard rename(work, target) == 0 else {
            throw .io("cannot move the finished backup to \(target): \(String(cString: strerror(errno)))")
        }
        let parent = URL(fileURLWithPath: target).deletingLastPathComponent().path
        let fd = open(parent, O_RDONLY | O_DIRECTORY)
        if fd >= 0 {
            fsync(fd)
            close(fd)
        }
    }

    /// Links (or copies) the stored blob or deferred marker `relative` (under `blobs/`) of
    /// `tree` into `to`'s blob store; answers false when it is not there.
    @discardableResult
    static func transferBlob(_ relative: String, from tree: SourceTree, to: String, copy: Bool, counts: inout BlobCounts) throws(BackupError) -> Bool {
        let isShard = !relative.hasPrefix("deferred/")
        let destination = "\(to)/blobs/\(relative)"
        if FileManager.default.fileExists(atPath: destination) { return true }
        try makeDirectory(parent(of: destination))
        guard let done = try tree.copy("blobs/\(relative)", to: destination, link: !copy && isShard) else { return false }
        if isShard {
            counts.blobs += 1
            counts.bytes += done.bytes
            if done.linked { counts.linked += 1 }
        }
        return true
    }

    static func parent(of path: String) -> String {
        (path as NSString).deletingLastPathComponent
    }

    static func makeDirectory(_ path: String) throws(BackupError) {
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(path): \(error.localizedDescription)")
        }
    }

    /// Copies the open file `input` to the new file `to` with its permission bits (a key
    /// stays 0600), fsyncing the copy; answers the bytes copied.
    static func copyFile(_ input: Int32, from: String, to: String) throws(BackupError) -> Int64 {
        var st = stat()
        fstat(input, &st)
        let output = open(to, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, st.st_mode & 0o777)
        guard output >= 0 else { throw .io("cannot create \(to): \(String(cString: strerror(errno)))") }
        defer { close(output) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var total: Int64 = 0
        while true {
            let n = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress, $0.count) }
            if n == 0 { break }
            guard n > 0 else { throw .io("cannot read \(from): \(String(cString: strerror(errno)))") }
            var written = 0
            while written < n {
                let w = buffer.withUnsafeBytes { write(output, $0.baseAddress! + written, n - written) }
                guard w > 0 else { throw .io("cannot write \(to): \(String(cString: strerror(errno)))") }
                written += w
            }
            total += Int64(n)
        }
        guard fsync(output) == 0 else { throw .io("fsync of \(to): \(String(cString: strerror(errno)))") }
        return total
    }

    /// The whole content of the open file `fd` (closed afterwards).
    static func readAll(_ fd: Int32) throws(OpenDirectory.Failure) -> [UInt8] {
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n == 0 { return bytes }
            guard n > 0 else { throw OpenDirectory.Failure(code: errno) }
            bytes += buffer[0..<n]
        }
    }

    /// fsyncs every directory of the tree, so the entries of copied files survive a power loss.
    static func syncTree(_ path: String) throws(BackupError) {
        let fm = FileManager.default
        var directories = [path]
        if let walker = fm.enumerator(atPath: path) {
            while let name = walker.nextObject() as? String {
                var isDirectory: ObjCBool = false
                if fm.fileExists(atPath: "\(path)/\(name)", isDirectory: &isDirectory), isDirectory.boolValue { directories.append("\(path)/\(name)") }
            }
        }
        for directory in directories {
            let fd = open(directory, O_RDONLY | O_DIRECTORY)
            guard fd >= 0 else { continue }
            fsync(fd)
            close(fd)
        }
    }

    static func clear(_ directory: String) throws(BackupError) {
        let fm = FileManager.default
        for name in (try? fm.contentsOfDirectory(atPath: directory)) ?? [] where name != "serve.lock" {
            do { try fm.removeItem(atPath: "\(directory)/\(name)") } catch {
                throw .io("cannot clear the interrupted restore in \(directory): \(error.localizedDescription)")
            }
        }
    }

    static func io<T>(_ body: () throws -> T) throws(BackupError) -> T {
        do { return try body() } catch let error as any FerryError { throw .io(error.description) } catch { throw .io("\(error)") }
    }
}

/// Why a backup or restore did not happen; nothing was changed where it refuses.
public enum BackupError: FerryError, Equatable {
    case destinationExists(String)
    case notABackup(String)
    case notADataDirectory(String)
    case nodeRunning(String)
    /// The copy could not be verified (missing blobs, a failed integrity check).
    case incomplete(String)
    /// `path` is what a backup or restore does not copy: a symbolic link, a special file
    /// (FIFO, socket, device), or, in a backup, something outside a backup's layout.
    case refused(path: String, message: String)
    case io(String)

    public var domain: String { "backup" }
    public var code: String {
        switch self {
        case .destinationExists: return "exists"
        case .notABackup: return "not_a_backup"
        case .notADataDirectory: return "not_a_data_directory"
        case .nodeRunning: return "locked"
        case .incomplete: return "incomplete"
        case .refused: return "refused_entry"
        case .io: return "io"
        }
    }
    public var failure: FailureKind {
        switch self {
        case .nodeRunning: .unavailable
        case .destinationExists, .notABackup, .notADataDirectory, .refused: .invalidRequest
        case .incomplete: .unavailable
        case .io: .internalFailure
        }
    }
    /// A missing blob or a busy database may be gone on the next try.
    public var isTransient: Bool {
        if case .incomplete = self { return true }
        return false
    }
    public var description: String {
        switch self {
        case .destinationExists(let why), .notABackup(let why), .notADataDirectory(let why), .nodeRunning(let why), .incomplete(let why), .io(let why):
            return why
        case .refused(_, let message):
            return message
        }
    }
}
