import FerryCore
import Foundation
import Logging
import ServiceLifecycle

/// Stops the node when its data directory or database file is deleted or replaced under it
/// (`rm -rf`, a restore copied over it): the node would otherwise serve a database nobody
/// can open any more, and the CLI would write into a new one beside it.
struct DataDirectoryWatch: Service {
    let directory: String
    let database: String
    let clock: any Clock<Duration>
    let logger: Logger
    /// How often the files are looked at. Default 2 s.
    var interval: Duration = .seconds(2)

    /// A file's identity: the same device and inode while it is the same file.
    struct FileIdentity: Equatable {
        let device: UInt64
        let inode: UInt64

        init?(_ path: String) {
            var info = stat()
            guard stat(path, &info) == 0 else { return nil }
            device = UInt64(info.st_dev)
            inode = UInt64(info.st_ino)
        }
    }

    func run() async throws {
        // Ends with the node's graceful shutdown, like every other service of it.
        do {
            try await cancelWhenGracefulShutdown { try await watch() }
        } catch is CancellationError {
            return
        }
    }

    private func watch() async throws {
        let (dir, db) = (FileIdentity(directory), FileIdentity(database))
        while !Task.isCancelled {
            try await clock.sleep(for: interval)
            if let problem = Self.change(directory: directory, was: dir, database: database, was: db) {
                logger.critical("data directory gone; stopping", metadata: ["directory": "\(directory)", "reason": "\(problem)"])
                throw NodeError.dataDirectoryGone(
                    "the data directory \(directory) was \(problem) while the node ran; it stopped so as not to serve a database "
                        + "that is no longer there: start it again on the data you mean to serve")
            }
        }
    }

    /// What happened to the directory or the database, or nil when both are as they were.
    static func change(directory: String, was dir: FileIdentity?, database: String, was db: FileIdentity?) -> String? {
        guard let nowDir = FileIdentity(directory) else { return "deleted" }
        if let dir, nowDir != dir { return "replaced" }
        guard let nowDB = FileIdentity(database) else { return "emptied (its database file was deleted)" }
        if let db, nowDB != db { return "changed (its database file was replaced)" }
        return nil
    }
}
