import ArgumentParser
import FerryCore
import FerryNode
import Foundation

/// `ferry backup DEST`: a consistent copy of the data directory, while its node runs or not.
struct Backup: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Back up the data directory (running node or not) into a new directory DEST.",
        discussion: """
            The database is copied from one snapshot with SQLite's online backup while the node \
            goes on writing; blobs are hard-linked when DEST is on the same file system (a blob \
            never changes; --copy copies them); the identity, trust store, users, group and \
            replications are copied, and nothing else: a symbolic link or special file where one \
            of them belongs is refused, naming it, and is never followed. The copy is verified \
            (integrity check, every referenced blob present) in a directory beside DEST and \
            renamed to DEST only then, so an interrupted backup leaves no DEST and never \
            touches another backup. DEST must not exist or be empty. Bring it back with `ferry restore DEST --data DIR`.
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The new backup directory.") var destination: String
    @Flag(help: "Copy blobs even where a hard link would do (a backup on another disk needs no flag).") var copy = false

    func run() async throws {
        try global.requireData()
        let summary = try DataDirectoryBackup.backup(dataDirectory: global.dataDirectory, to: destination, copyBlobs: copy)
        if global.json {
            Output.json(summary.json(["backup": .string(destination)]))
        } else {
            Output.line(
                "backed up node \(summary.nodeID.prefix(16))… to \(destination): \(summary.documents) documents, \(summary.blobs) blobs (\(summary.blobBytes) bytes, \(summary.linkedBlobs) hard-linked)"
            )
            if !summary.leftBehind.isEmpty {
                Output.line("left behind (not part of a data directory): \(summary.leftBehind.map { LogText.escape($0) }.joined(separator: ", "))")
            }
        }
    }
}

/// `ferry restore BACKUP`: brings a backup back into an empty data directory.
struct Restore: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Restore a backup made by `ferry backup` into the data directory (--data), which must be empty or absent.",
        discussion: """
            By default the node comes back as itself (its identity, so its peers still trust it); \
            never run it beside the node it was backed up from. --new-identity makes it a new \
            node instead (a new certificate and admin key; trust it on its peers, or `ferry join` \
            the group again). Either way the database gets a new UUID, so peers send it what it \
            lacks and take what it writes after the restore. The node must not be running on the \
            directory. An interrupted restore is finished by running the same command again. \
            The whole backup is checked first: a symbolic link, a FIFO, socket or device, or a \
            file that is not part of a backup is refused, naming its path, before anything is written.
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The backup directory.") var backup: String
    @Flag(help: "Restore as a new node (new identity, admin key and session secret; no group membership).") var newIdentity = false
    @Flag(help: "Copy blobs even where a hard link would do.") var copy = false

    func run() async throws {
        let summary = try DataDirectoryBackup.restore(
            backup: backup, to: global.dataDirectory, newIdentity: newIdentity, copyBlobs: copy)
        if global.json {
            Output.json(summary.json(["dataDirectory": .string(global.dataDirectory), "newIdentity": .bool(newIdentity)]))
        } else {
            Output.line(
                "restored \(summary.documents) documents and \(summary.blobs) blobs into \(global.dataDirectory) as node \(summary.nodeID)\(newIdentity ? " (a new identity)" : "")"
            )
            Output.line("start it with: ferry --data \(global.dataDirectory) serve")
        }
    }
}

extension DataDirectoryBackup.Summary {
    func json(_ extra: [String: JSON]) -> JSON {
        var o: [String: JSON] = [
            "node": .string(nodeID), "documents": .int(Int64(documents)), "blobs": .int(Int64(blobs)),
            "linkedBlobs": .int(Int64(linkedBlobs)), "blobBytes": .int(blobBytes), "database": .string(database),
        ]
        if !leftBehind.isEmpty { o["leftBehind"] = .array(leftBehind.map(JSON.string)) }
        for (k, v) in extra { o[k] = v }
        return .object(o)
    }
}
