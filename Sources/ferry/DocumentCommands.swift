import ArgumentParser
import FerryCore
import FerryStore
import Foundation

/// `ferry put`: creates a document or updates a current revision.
struct Put: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create a document, or update it with --rev. Prints the new revision.",
        discussion: "BODY is JSON text, '-' for stdin (the default), or @FILE.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "Document ID.") var id: String
    @Argument(help: "JSON object, '-' for stdin, or @FILE.") var body: String?
    @Option(help: "The current revision being updated (required to update an existing document).")
    var rev: String?

    func run() async throws {
        let docID = try Input.documentID(id)
        let parsed = try Input.splitMeta(try Input.parseJSON(try Input.readAll(body)))
        if let bodyID = parsed.id, bodyID != id {
            throw CLIError(message: "_id \"\(bodyID)\" in the body does not match the document ID \"\(id)\"")
        }
        if parsed.deleted { throw CLIError(message: "use 'ferry rm' to delete a document") }
        if let r = rev, let b = parsed.rev, r != b {
            throw CLIError(message: "--rev \(r) and _rev \(b) in the body disagree")
        }
        let parent = try (rev ?? parsed.rev).map(Input.revision)
        let newRev: String
        if let node = NodeClient.running(on: global.dataDirectory) {
            // Through the running node, so the change replicates at once.
            let query = parent.map { "?rev=\($0)" } ?? ""
            let reply = try await node.call("PUT", "/docs/\(NodeClient.path(docID.rawValue))\(query)", body: parsed.body)
            newRev = reply["rev"]?.stringValue ?? "?"
        } else {
            newRev = try global.openStore().put(docID, body: parsed.body, parent: parent).description
        }
        if global.json {
            Output.json(["id": .string(id), "rev": .string(newRev)])
        } else {
            Output.line(newRev)
        }
    }
}

/// `ferry get`: prints a document or one of its retained revisions.
struct Get: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print a document (its current revision, or --rev).")

    @OptionGroup var global: GlobalOptions
    @Argument var id: String
    @Option(help: "A specific revision, while its body is retained.") var rev: String?
    @Flag(help: "Include _conflicts, the other live leaves.") var conflicts = false

    func run() async throws {
        let docID = try DocumentID(id, allowReserved: true)
        let revision = try rev.map(Input.revision)
        let value: JSON
        if let node = NodeClient.running(on: global.dataDirectory) {
            var query: [String] = []
            if let revision { query.append("rev=\(revision)") }
            if conflicts { query.append("conflicts=true") }
            value = try await node.call(
                "GET", "/docs/\(NodeClient.path(docID.rawValue))\(query.isEmpty ? "" : "?" + query.joined(separator: "&"))")
        } else {
            let store = try global.openExistingStore()
            guard let doc = try store.document(docID, revision: revision) else { throw StoreError.notFound(docID) }
            value = doc.json(includeConflicts: conflicts)
        }
        if global.json { Output.json(value) } else { Output.line(value.prettyString) }
    }
}

/// `ferry rm`: writes a tombstone on a leaf revision.
struct Remove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete a document: writes a tombstone revision that replicates.")

    @OptionGroup var global: GlobalOptions
    @Argument var id: String
    @Option(help: "The leaf revision being deleted.") var rev: String
    @Flag(help: "Keep the deleted revision's properties in the tombstone (filters can still route it).")
    var keepProperties = false

    func run() async throws {
        let docID = try Input.documentID(id)
        let revision = try Input.revision(rev)
        let newRev: String
        if let node = NodeClient.running(on: global.dataDirectory) {
            let keep = keepProperties ? "&keepProperties=true" : ""
            let reply = try await node.call("DELETE", "/docs/\(NodeClient.path(docID.rawValue))?rev=\(revision)\(keep)")
            newRev = reply["rev"]?.stringValue ?? "?"
        } else {
            newRev = try global.openStore().delete(docID, revision: revision, keepProperties: keepProperties).description
        }
        if global.json {
            Output.json(["id": .string(id), "rev": .string(newRev)])
        } else {
            Output.line(newRev)
        }
    }
}

/// `ferry ls`: lists documents in ID order.
struct List: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List documents in ID order.")

    @OptionGroup var global: GlobalOptions
    @Option(help: "At most this many.") var limit: Int?
    @Flag(help: "Include deleted documents.") var deleted = false
    @Flag(help: "Include Ferry's own documents (_ferry/…: group membership), hidden like in _all_docs.") var `internal` = false

    func validate() throws {
        if let limit, limit < 0 { throw ValidationError("--limit must not be negative") }
    }

    func run() async throws {
        let store = try global.openExistingStore()
        let wanted = limit ?? .max
        var docs = try store.allDocuments(limit: wanted, includeDeleted: deleted)
        if !`internal` {
            // Ask for more until `wanted` remain without the hidden ones, or none are left.
            var asked = wanted
            while true {
                let full = docs.count == asked
                let shown = docs.filter { !$0.id.rawValue.hasPrefix("_ferry/") }
                if shown.count >= wanted || !full {
                    docs = Array(shown.prefix(wanted))
                    break
                }
                asked = asked > Int.max / 2 ? .max : asked * 2
                docs = try store.allDocuments(limit: asked, includeDeleted: deleted)
            }
        }
        if global.json {
            Output.json(.array(docs.map { d in
                var o: [String: JSON] = ["id": .string(d.id.rawValue), "rev": .string(d.revision.description)]
                if d.deleted { o["deleted"] = true }
                return .object(o)
            }))
        } else {
            for d in docs { Output.line("\(d.id)\t\(d.revision)\(d.deleted ? "\tdeleted" : "")") }
        }
    }
}

/// `ferry changes`: prints the changes feed after a sequence.
struct Changes: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The changes feed: one entry per document changed after --since, in sequence order.")

    @OptionGroup var global: GlobalOptions
    @Option(help: "Only changes after this sequence.") var since: UInt64 = 0
    @Option(help: "At most this many.") var limit: Int = 10_000

    func validate() throws {
        if limit < 1 { throw ValidationError("--limit must be at least 1") }
    }

    func run() async throws {
        let store = try global.openExistingStore()
        // As in the admin API: a `since` past the store's end is read as the end, so
        // `last_seq` never points past a change not yet seen.
        let since = min(self.since, try store.lastSequence)
        let changes = try store.changes(since: since, limit: limit)
        let last = changes.last?.sequence ?? since
        if global.json {
            Output.json(["results": .array(changes.map(Output.change)), "last_seq": .int(Int64(last))])
        } else {
            for c in changes { Output.line(Output.changeLine(c)) }
            Output.line("last_seq \(last)")
        }
    }
}

/// `ferry conflicts`: lists documents with conflicting leaves.
struct Conflicts: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List documents that have conflicting revisions.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let store = try global.openExistingStore()
        var entries: [(DocumentID, RevisionID, [RevisionID])] = []
        for id in try store.conflictedDocumentIDs() {
            guard let doc = try store.document(id) else { continue }
            entries.append((id, doc.revision, doc.conflicts))
        }
        if global.json {
            Output.json(.array(entries.map { e in
                ["id": .string(e.0.rawValue), "rev": .string(e.1.description),
                 "conflicts": .array(e.2.map { .string($0.description) })]
            }))
        } else {
            if entries.isEmpty { Output.line("no conflicts") }
            for e in entries {
                Output.line("\(e.0)\twinner \(e.1)\tconflicts \(e.2.map(\.description).joined(separator: " "))")
            }
        }
    }
}

/// `ferry purge`: removes a document and its history locally.
struct Purge: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove a document and all its history, on this node only (never replicated).")

    @OptionGroup var global: GlobalOptions
    @Argument var id: String

    func run() async throws {
        let docID = try DocumentID(id, allowReserved: true)
        let store = try global.openStore()
        guard try store.purge(docID) else { throw StoreError.notFound(docID) }
        if global.json { Output.json(["id": .string(id), "purged": true]) } else { Output.line("purged \(id)") }
    }
}

/// `ferry info`: prints database-wide figures.
struct Info: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Database UUID, counts, last sequence, size on disk.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let store = try global.openExistingStore()
        let i = try store.info()
        if global.json {
            Output.json([
                "uuid": .string(i.uuid), "docCount": .int(Int64(i.documentCount)),
                "deletedCount": .int(Int64(i.deletedCount)), "conflictCount": .int(Int64(i.conflictedCount)),
                "lastSequence": .int(Int64(i.lastSequence)), "sizeOnDisk": .int(i.sizeOnDisk),
                "path": .string(global.dataDirectory),
            ])
        } else {
            Output.line("""
                data directory  \(global.dataDirectory)
                database uuid   \(i.uuid)
                documents       \(i.documentCount) live, \(i.deletedCount) deleted, \(i.conflictedCount) in conflict
                last sequence   \(i.lastSequence)
                size on disk    \(i.sizeOnDisk) bytes
                """)
        }
    }
}
