import Crypto
import ArgumentParser
import FerryCore
import FerryStore
import Foundation

/// `ferry import`: loads NDJSON documents, all or nothing unless batched.
struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Import newline-delimited JSON documents (each with \"_id\", optionally \"_rev\").",
        discussion: """
            By default the whole input is one transaction: any error imports nothing. \
            With --batch-size N, every N documents are committed and reported on stderr \
            ("committed N"); an error then stops the import, keeping earlier batches.
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "NDJSON file, or '-' for stdin.") var file: String = "-"
    @Option(help: "Commit every N documents (0 = one transaction for everything).") var batchSize: Int = 0

    func validate() throws {
        if batchSize < 0 { throw ValidationError("--batch-size must not be negative") }
    }

    func run() async throws {
        guard let handle = file == "-" ? FileHandle.standardInput : FileHandle(forReadingAtPath: file) else {
            throw CLIError(message: "cannot read file \(file)")
        }
        let store = try global.openStore()
        var lines = LineReader(handle: handle)
        var lineNumber = 0
        var imported = 0
        var finished = false
        while !finished {
            var inBatch = 0
            try store.write { txn in
                while batchSize == 0 || inBatch < batchSize {
                    guard let line = try lines.next() else {
                        finished = true
                        return
                    }
                    lineNumber += 1
                    if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { continue }
                    do {
                        try Self.importLine(line, into: txn)
                    } catch let error as any FerryError {
                        throw CLIError(message: "line \(lineNumber): \(error.description)", status: Ferry.exitStatus(for: error))
                    } catch let error as CLIError {
                        throw CLIError(message: "line \(lineNumber): \(error.message)", status: error.status)
                    }
                    inBatch += 1
                }
            }
            imported += inBatch
            if batchSize > 0 && inBatch > 0 { Output.error("committed \(imported)") }
        }
        if global.json {
            Output.json(["imported": .int(Int64(imported)), "lastSequence": .int(Int64(try store.lastSequence))])
        } else {
            Output.line("imported \(imported) documents")
        }
    }

    static func importLine(_ line: [UInt8], into txn: StoreTransaction) throws {
        let parsed = try Input.splitMeta(try Input.parseJSON(line))
        guard let id = parsed.id else { throw CLIError(message: "missing \"_id\"") }
        let docID = try Input.documentID(id)
        let rev = try parsed.rev.map(Input.revision)
        if parsed.deleted {
            guard let rev else { throw CLIError(message: "\"_deleted\" needs \"_rev\"") }
            try txn.delete(docID, revision: rev)
        } else {
            try txn.put(docID, body: parsed.body, parent: rev)
        }
    }
}

/// Reads a file handle line by line without loading it whole.
struct LineReader {
    let handle: FileHandle
    var buffer: [UInt8] = []
    var start = 0
    var eof = false

    mutating func next() throws -> [UInt8]? {
        while true {
            if let nl = buffer[start...].firstIndex(of: 0x0A) {
                let line = Array(buffer[start..<nl])
                start = nl + 1
                return line
            }
            if eof {
                guard start < buffer.count else { return nil }
                let line = Array(buffer[start...])
                start = buffer.count
                return line
            }
            buffer.removeFirst(start)
            start = 0
            let chunk = try handle.read(upToCount: 1 << 16) ?? Data()
            if chunk.isEmpty { eof = true } else { buffer.append(contentsOf: chunk) }
        }
    }
}

/// `ferry blob`: groups the blob subcommands.
struct BlobCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blob", abstract: "Store and read content-addressed blobs.",
        subcommands: [BlobPut.self, BlobGet.self, BlobStateCommand.self])
}

/// `ferry blob put`: stores a file as a blob and prints its reference.
struct BlobPut: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "put",
        abstract: "Store a file as a blob; prints the reference to embed in a document.")

    @OptionGroup var global: GlobalOptions
    @Argument var file: String
    @Option(help: "MIME type recorded in the reference.") var contentType: String?

    func run() async throws {
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: file, isDirectory: &isDir), !isDir.boolValue else {
            throw CLIError(message: "no such file: \(file)")
        }
        let store = try global.openStore()
        let ref = try store.blobs.put(fileAt: file, contentType: contentType)
        Output.json(ref.json)
    }
}

/// `ferry blob get`: writes a blob's verified content out.
struct BlobGet: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get", abstract: "Write a blob's content to stdout or --output FILE.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "sha256-<hex> digest.") var digest: String
    @Option(name: .shortAndLong, help: "Write to this file instead of stdout.") var output: String?

    func run() async throws {
        let d: BlobDigest
        do { d = try BlobDigest(digest) } catch { throw CLIError(message: error.description) }
        let store = try global.openExistingStore()
        if case .deferred = store.blobs.state(d) {
            // Left for first read by a lazy policy: the running node fetches it from a peer.
            guard let node = NodeClient.running(on: global.dataDirectory) else {
                throw CLIError(message: "unavailable: blob \(d) is not fetched yet and no node runs on this data directory", status: 5)
            }
            let reply = try await node.request("POST", "/blobs/\(d)/fetch", body: .object([:]))
            if reply.status == 503 {
                throw CLIError(message: "unavailable: \(reply.body["reason"]?.stringValue ?? "no connected peer has it")", status: 5)
            }
            guard (200..<300).contains(reply.status) else {
                throw CLIError(message: reply.body["reason"]?.stringValue ?? "fetching blob \(d) failed", status: reply.status == 404 ? 3 : 1)
            }
        }
        guard let reader = try store.blobs.reader(d) else {
            throw CLIError(message: "not found: no blob \(d)", status: 3)
        }
        if global.json && output == nil {
            let content = try reader.read(offset: 0, count: Int(reader.length))
            guard BlobDigest.of(content) == d else { throw CLIError(message: "blob \(d) is corrupt") }
            Output.json([
                "digest": .string(d.description), "length": .int(Int64(content.count)),
                "base64": .string(Data(content).base64EncodedString()),
            ])
            return
        }
        // Streamed a chunk at a time and checked as it goes: memory stays flat for any size.
        let handle: FileHandle
        if let output {
            guard FileManager.default.createFile(atPath: output, contents: nil), let h = FileHandle(forWritingAtPath: output) else {
                throw CLIError(message: "cannot write \(output)")
            }
            handle = h
        } else {
            handle = FileHandle.standardOutput
        }
        var hasher = SHA256()
        var offset: Int64 = 0
        while offset < reader.length {
            let chunk = try reader.read(offset: offset, count: 1 << 20)
            guard !chunk.isEmpty else { break }
            hasher.update(data: chunk)
            try handle.write(contentsOf: chunk)
            offset += Int64(chunk.count)
        }
        guard BlobDigest(uncheckedHex: Hex.encode(hasher.finalize())) == d else {
            if let output { try? FileManager.default.removeItem(atPath: output) }
            throw CLIError(message: "blob \(d) is corrupt: its content does not match its digest")
        }
        if let output {
            try? handle.close()
            if global.json {
                Output.json(["digest": .string(d.description), "length": .int(reader.length), "file": .string(output)])
            }
        }
    }
}

/// `ferry blob state`: whether a blob is here, deferred (lazy policy) or unknown.
struct BlobStateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "state", abstract: "Say whether a blob is present, deferred (to be fetched on first read) or absent.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "sha256-<hex> digest.") var digest: String

    func run() async throws {
        let d: BlobDigest
        do { d = try BlobDigest(digest) } catch { throw CLIError(message: error.description) }
        let store = try global.openExistingStore()
        var o: [String: JSON] = ["digest": .string(d.description)]
        switch store.blobs.state(d) {
        case .present(let length): o.merge(["state": "present", "length": .int(length), "received": .int(length)]) { $1 }
        case .deferred(let length, let partial): o.merge(["state": "deferred", "length": .int(length), "received": .int(partial)]) { $1 }
        case .absent: o["state"] = "absent"
        }
        if global.json {
            Output.json(.object(o))
        } else {
            var line = o["state"]!.stringValue!
            if let length = o["length"]?.intValue, let received = o["received"]?.intValue {
                line += " \(received)/\(length) bytes"
            }
            Output.line(line)
        }
        if case .absent = store.blobs.state(d) { throw ExitCode(3) }
    }
}

/// `ferry compact`: re-applies retention and collects unreferenced blobs.
struct Compact: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Prune revision history, drop old bodies, and delete unreferenced blobs.")

    @OptionGroup var global: GlobalOptions
    @Option(help: "Keep unreferenced blobs younger than this many seconds.") var blobMinAge: Double = 3600
    @Option(help: "Keep partly received blobs written to within this many seconds (a transfer may resume them).")
    var partialMinAge: Double = 3600

    func run() async throws {
        let store = try global.openStore()
        let rewritten = try store.compact()
        let removed = try store.collectBlobs(minimumAge: blobMinAge)
        let partials = store.blobs.tidyPartials(removingUnwrittenSince: Date().addingTimeInterval(-partialMinAge))
        if global.json {
            Output.json([
                "documentsRewritten": .int(Int64(rewritten)), "blobsRemoved": .int(Int64(removed.count)),
                "bytesFreed": .int(removed.bytes + partials.bytes), "partialBlobsRemoved": .int(Int64(partials.count)),
            ])
        } else {
            Output.line(
                "rewrote \(rewritten) documents; removed \(removed.count) blobs (\(removed.bytes) bytes) and \(partials.count) partial blobs (\(partials.bytes) bytes)"
            )
        }
    }
}

/// `ferry check`: runs SQLite's integrity check.
struct Check: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run SQLite's integrity check on the database.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let store = try global.openExistingStore()
        let findings = try store.integrityCheck()
        let ok = findings == ["ok"]
        if global.json {
            Output.json(["ok": .bool(ok), "details": .array(findings.map { .string($0) })])
        } else {
            Output.line(ok ? "ok" : findings.joined(separator: "\n"))
        }
        if !ok { throw CLIError(message: "integrity check failed") }
    }
}

/// `ferry watch`: prints each change as it commits, until interrupted.
struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run in the foreground and print every change as it is committed (Ctrl-C stops).",
        discussion: "With --json, prints one JSON object per line (NDJSON) for each change.")

    @OptionGroup var global: GlobalOptions
    @Option(help: "Start after this sequence (default: now).") var since: UInt64?

    func run() async throws {
        let store = try global.openExistingStore()
        let info = try store.info()
        let start = since ?? info.lastSequence
        if !global.json {
            Output.line("""
                Ferry store at \(global.dataDirectory) (database \(info.uuid))
                \(info.documentCount) documents, last sequence \(info.lastSequence). Watching for changes; Ctrl-C stops.
                Try in another terminal:  .build/debug/ferry put hello '{"greeting":"hi"}'
                """)
        }
        // SIGINT and SIGTERM end the watch (ProcessSignals holds them blocked and hands them here).
        let stop = AsyncStream<Void> { continuation in ProcessSignals.deliver { _ in continuation.finish() } }
        // Documents purged for access leave no change behind: their journal is followed beside the feed.
        let removedBefore = try store.accessRemovals().total
        try await Race.first(
            {
                let poll = LiveChanges.Poll(interval: .milliseconds(250))
                for try await c in store.liveChanges(since: start, poll: poll) {
                    if global.json {
                        Output.json(Output.change(c))
                    } else {
                        Output.line(Output.changeLine(c))
                    }
                    fflush(nil)
                }
            },
            {
                var seen = removedBefore
                while !Task.isCancelled {
                    for r in try store.accessRemovals(after: seen).removals {
                        seen = r.number
                        if global.json {
                            Output.json(["event": "accessRemoved", "id": .string(r.id), "reason": .string(r.reason)])
                        } else {
                            Output.line("accessRemoved \(LogText.escape(r.id)): \(r.reason)")
                        }
                        fflush(nil)
                    }
                    try await Task.sleep(for: .milliseconds(250))
                }
            },
            { for await _ in stop {} })
    }
}
