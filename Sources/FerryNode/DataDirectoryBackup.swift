import FerryCore
import FerryStore
import FerryTransport
import Foundation

/// Backs up a data directory, running node or not, and restores a backup into an empty
/// one. A backup is itself a data directory (database, blobs, identity, trust, users, group)
/// plus `backup.json`, which no `serve` starts on; it is written beside its destination and
/// renamed into place at the end, so an interrupted backup leaves no half backup and never
/// touches an earlier one.
public enum DataDirectoryBackup {
    /// Marks a backup; `serve` refuses a directory holding it.
    public static let markerFile = "backup.json"
    /// Present while a restore runs; `serve` and the CLI refuse a directory holding it.
    public static let incompleteFile = "restore.incomplete"
    /// Files of a running node that say nothing about its data.
    static let runtimeFiles: Set<String> = ["node.json", "serve.lock", markerFile, incompleteFile]
    /// What belongs to the node's identity: left behind by `--new-identity`. A new node is
    /// not a member of the old one's group (its entry is signed for the old ID).
    static let identityFiles: Set<String> = ["identity", "admin.key", "couch-session.key", "group.json", "invitations.json"]

    /// What a backup or restore did.
    public struct Summary: Sendable, Equatable {
        public var nodeID: String
        public var documents: Int
        public var blobs: Int
        /// Blobs hard-linked rather than copied (same file system; a blob never changes).
        public var linkedBlobs: Int
        public var blobBytes: Int64
        public var database: String
    }

    /// Backs up `dataDirectory` to the new directory `destination` (absent, or an empty
    /// directory). Blobs are hard-linked when both are on one file system unless `copyBlobs`.
    /// Verified before it is put in place: the copy passes SQLite's integrity check and holds
    /// every blob its documents refer to (or the deferred marker of a lazy one).
    @discardableResult
    public static func backup(dataDirectory: String, to destination: String, copyBlobs: Bool = false) throws(BackupError) -> Summary {
        let source = try existingStore(dataDirectory)
        let target = URL(fileURLWithPath: destination).standardizedFileURL.path
        if isInside(target, dataDirectory) {
            throw .destinationExists("the backup destination \(target) is inside the data directory \(dataDirectory); choose one outside it")
        }
        try requireEmptyOrAbsent(target, what: "backup destination")
        let work = try workDirectory(for: target, kind: "backup")
        var completed = false
        defer { if !completed { try? FileManager.default.removeItem(atPath: work) } }

        let nodeID = identityID(dataDirectory)
        // Blobs first, then the snapshot, then what the snapshot refers to and the first pass
        // missed: a blob is stored before any revision that refers to it, and the collector
        // removes only blobs unreferenced for a grace period.
        var counts = BlobCounts()
        try transferBlobs(from: dataDirectory, to: work, only: nil, copy: copyBlobs, counts: &counts)
        try io { try source.backupDatabase(to: "\(work)/\(DocumentStore.databaseFileName)") }
        try copyOtherFiles(from: dataDirectory, to: work, skipping: [])
        // Verified through a store that is closed again before the rename (no WAL left behind).
        let (documents, database) = try verify(work) { copy throws(BackupError) in
            let referenced = try io { try copy.referencedBlobs() }
            let missing = referenced.filter { !copy.blobs.has($0) && copy.blobs.deferredLength($0) == nil }
            if !missing.isEmpty {
                try transferBlobs(from: dataDirectory, to: work, only: Set(missing.map(\.hex)), copy: copyBlobs, counts: &counts)
                let still = missing.filter { !copy.blobs.has($0) && copy.blobs.deferredLength($0) == nil }
                if let first = still.first {
                    throw .incomplete("\(still.count) blobs the documents refer to are missing from \(dataDirectory) (first \(first)); nothing was written to \(target)")
                }
            }
        }
        let summary = Summary(
            nodeID: nodeID, documents: documents, blobs: counts.blobs, linkedBlobs: counts.linked, blobBytes: counts.bytes,
            database: database)
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
    @discardableResult
    public static func restore(backup: String, to dataDirectory: String, newIdentity: Bool = false, copyBlobs: Bool = false)
        throws(BackupError) -> Summary
    {
        let marker = "\(backup)/\(markerFile)"
        guard let data = FileManager.default.contents(atPath: marker), let info = try? JSON.parse(Array(data)), info["ferryBackup"] != nil
        else {
            throw .notABackup("\(backup) is not a Ferry backup (it has no \(markerFile); make one with `ferry backup DEST`)")
        }
        let fm = FileManager.default
        let target = URL(fileURLWithPath: dataDirectory).standardizedFileURL.path
        if isInside(target, backup) || isInside(backup, target) {
            throw .destinationExists("the data directory \(target) and the backup \(backup) must not contain each other")
        }
        if fm.fileExists(atPath: "\(target)/\(incompleteFile)") {
            // An interrupted restore: start again from nothing.
            try clear(target)
        } else {
            try requireEmptyOrAbsent(target, what: "data directory")
        }
        do {
            try fm.createDirectory(atPath: target, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(target): \(error.localizedDescription)")
        }
        let lock: DataDirectoryLock
        do { lock = try DataDirectoryLock(directory: target) } catch { throw .nodeRunning(error.description) }
        defer { withExtendedLifetime(lock) {} }
        guard fm.createFile(atPath: "\(target)/\(incompleteFile)", contents: Data("restoring from \(backup)\n".utf8)) else {
            throw .io("cannot write \(target)/\(incompleteFile)")
        }
        try io { try DocumentStore.restoreDatabase(from: "\(backup)/\(DocumentStore.databaseFileName)", to: "\(target)/\(DocumentStore.databaseFileName)") }
        var counts = BlobCounts()
        try transferBlobs(from: backup, to: target, only: nil, copy: copyBlobs, counts: &counts)
        try copyOtherFiles(from: backup, to: target, skipping: newIdentity ? identityFiles : [])
        let nodeID: String
        do { nodeID = try NodeIdentity.loadOrCreate(directory: target).nodeID } catch { throw .io(error.description) }
        let (documents, database) = try verify(target) { _ throws(BackupError) in }
        try syncTree(target)
        guard unlink("\(target)/\(incompleteFile)") == 0 else { throw .io("cannot remove \(target)/\(incompleteFile): errno \(errno)") }
        return Summary(
            nodeID: nodeID, documents: documents, blobs: counts.blobs, linkedBlobs: counts.linked, blobBytes: counts.bytes, database: database)
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

    static func existingStore(_ dataDirectory: String) throws(BackupError) -> DocumentStore {
        try refuseUnusable(dataDirectory)
        return try io { try DocumentStore.openExisting(directory: dataDirectory) }
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

    /// Links (or copies) the stored blobs and the deferred markers of `from`'s blob store
    /// into `to`'s; partial and temporary files stay behind. `only` limits it to those hex digests.
    static func transferBlobs(from: String, to: String, only: Set<String>?, copy: Bool, counts: inout BlobCounts) throws(BackupError) {
        let fm = FileManager.default
        let source = "\(from)/blobs", target = "\(to)/blobs"
        try makeDirectory(target)
        for prefix in (try? fm.contentsOfDirectory(atPath: source)) ?? [] {
            let isShard = prefix.count == 2 && prefix.allSatisfy(\.isHexDigit)
            guard isShard || prefix == "deferred" else { continue }
            let names = ((try? fm.contentsOfDirectory(atPath: "\(source)/\(prefix)")) ?? []).filter { name in
                (try? BlobDigest(name)) != nil && (only == nil || only!.contains(name))
            }
            guard !names.isEmpty else { continue }
            try makeDirectory("\(target)/\(prefix)")
            for name in names {
                let from = "\(source)/\(prefix)/\(name)", to = "\(target)/\(prefix)/\(name)"
                if fm.fileExists(atPath: to) { continue }
                if isShard {
                    counts.blobs += 1
                    counts.bytes += ((try? fm.attributesOfItem(atPath: from))?[.size] as? NSNumber)?.int64Value ?? 0
                }
                if !copy && isShard && link(from, to) == 0 {
                    counts.linked += 1
                    continue
                }
                // The collector may remove an unreferenced blob meanwhile; what is referenced is checked later.
                guard fm.fileExists(atPath: from) else { continue }
                try copyFile(from, to)
            }
        }
    }

    /// The data directory's other files and directories (identity, trust, users, group,
    /// replications, keys), except the database, blobs, run-time files and `skipping`.
    static func copyOtherFiles(from: String, to: String, skipping: Set<String>) throws(BackupError) {
        let fm = FileManager.default
        for name in (try? fm.contentsOfDirectory(atPath: from)) ?? [] {
            if name == "blobs" || name.hasPrefix(DocumentStore.databaseFileName) || runtimeFiles.contains(name)
                || skipping.contains(name) || name.hasSuffix(".tmp")
            {
                continue
            }
            try copyTree("\(from)/\(name)", "\(to)/\(name)")
        }
    }

    static func copyTree(_ from: String, _ to: String) throws(BackupError) {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: from, isDirectory: &isDirectory) else { return }
        if isDirectory.boolValue {
            try makeDirectory(to)
            for name in (try? FileManager.default.contentsOfDirectory(atPath: from)) ?? [] {
                try copyTree("\(from)/\(name)", "\(to)/\(name)")
            }
        } else {
            try copyFile(from, to)
        }
    }

    static func makeDirectory(_ path: String) throws(BackupError) {
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(path): \(error.localizedDescription)")
        }
    }

    /// Copies one file with its permission bits (a key stays 0600), fsyncing the copy.
    static func copyFile(_ from: String, _ to: String) throws(BackupError) {
        let input = open(from, O_RDONLY)
        guard input >= 0 else { throw .io("cannot read \(from): \(String(cString: strerror(errno)))") }
        defer { close(input) }
        var st = stat()
        fstat(input, &st)
        let output = open(to, O_WRONLY | O_CREAT | O_EXCL, st.st_mode & 0o777)
        guard output >= 0 else { throw .io("cannot create \(to): \(String(cString: strerror(errno)))") }
        defer { close(output) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
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
        }
        guard fsync(output) == 0 else { throw .io("fsync of \(to): \(String(cString: strerror(errno)))") }
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
    case io(String)

    public var domain: String { "backup" }
    public var code: String {
        switch self {
        case .destinationExists: return "exists"
        case .notABackup: return "not_a_backup"
        case .notADataDirectory: return "not_a_data_directory"
        case .nodeRunning: return "locked"
        case .incomplete: return "incomplete"
        case .io: return "io"
        }
    }
    public var failure: FailureKind {
        switch self {
        case .nodeRunning: .unavailable
        case .destinationExists, .notABackup, .notADataDirectory: .invalidRequest
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
        }
    }
}
