import FerryCore
import FerryStore
import Logging

/// Moves the blobs a batch of revisions refers to, before the revisions: fetches those
/// missing here (pull) and sends those the other side lacks (push), each once, by digest;
/// in chunks that resume where an earlier transfer stopped when both sides speak
/// `blobChunks`, whole otherwise.
struct BlobTransfer: Sendable {
    let store: DocumentStore
    let remote: any RemoteDatabase
    let progress: ReplicationProgress
    let clock: any Clock<Duration>
    let logger: Logger
    var chunkSize = SyncProtocol.blobChunkSize
    var window = SyncProtocol.blobChunkWindow
    /// Which pulled blobs are fetched before their revisions are stored.
    var policy: BlobFetchPolicy

    init(context: ReplicationContext, remote: any RemoteDatabase) {
        store = context.store
        self.remote = remote
        progress = context.progress
        clock = context.clock
        logger = context.logger
        policy = context.configuration.blobPolicy
    }

    /// Fetches one blob (a deferred one, on first read) in chunks when the remote speaks them.
    func fetch(_ ref: BlobReference) async throws {
        guard !store.blobs.has(ref.digest) else { return }
        if remote.chunkedBlobs {
            try await fetchInChunks(ref.digest, declared: ref.length)
        } else {
            let content = try await remote.blob(ref.digest)
            guard BlobDigest.of(content) == ref.digest else {
                throw SyncError.protocolViolation("blob \(ref.digest) arrived with content that does not match its digest")
            }
            try store.blobs.put(content)
            progress.count {
                $0.blobsReceived += 1
                $0.blobBytesReceived += Int64(content.count)
            }
        }
    }

    /// Splits accepted revisions into those that can be stored now (every blob they refer to
    /// is here, or left for first read by the policy, which this records) and those whose
    /// blobs must be fetched first. A document's revisions stay together.
    func partition(_ revisions: [IncomingRevision]) throws -> (ready: [IncomingRevision], waiting: [IncomingRevision]) {
        var waitingDocs = Set<DocumentID>()
        for rev in revisions {
            if let bytes = rev.canonicalBody, !DocumentStore.mayReferenceBlobs(bytes) { continue }
            for ref in (try? rev.body.blobReferences()) ?? [] where !store.blobs.has(ref.digest) {
                if policy.fetchesBeforeStoring(length: ref.length) {
                    waitingDocs.insert(rev.id)
                } else if store.blobs.deferredLength(ref.digest) == nil {
                    try store.blobs.markDeferred(ref)
                    progress.count { $0.blobsDeferred += 1 }
                }
            }
        }
        guard !waitingDocs.isEmpty else { return (revisions, []) }
        return (revisions.filter { !waitingDocs.contains($0.id) }, revisions.filter { waitingDocs.contains($0.id) })
    }

    /// Fetches the blobs that accepted incoming revisions refer to and this store lacks.
    /// Content that does not match its digest is fetched once more, then is a protocol error.
    func fetchMissing(for revisions: [IncomingRevision]) async throws {
        var needed: [BlobDigest: Int64] = [:]
        for rev in revisions {
            if let bytes = rev.canonicalBody, !DocumentStore.mayReferenceBlobs(bytes) { continue }
            for ref in (try? rev.body.blobReferences()) ?? [] where needed[ref.digest] == nil && !store.blobs.has(ref.digest) {
                needed[ref.digest] = ref.length
            }
        }
        for digest in needed.keys.sorted() {
            let length = needed[digest]!
            if !policy.fetchesBeforeStoring(length: length) {
                // Lazy: the revision is stored now, the content fetched when first read.
                if store.blobs.deferredLength(digest) == nil {
                    try store.blobs.markDeferred(BlobReference(digest: digest, length: length))
                    progress.count { $0.blobsDeferred += 1 }
                }
                continue
            }
            try await fetch(BlobReference(digest: digest, length: length))
        }
    }

    /// Fetches one blob in chunks into a partial file, resuming at what it already holds.
    private func fetchInChunks(_ digest: BlobDigest, declared: Int64) async throws {
        var corruptions = 0
        while true {
            guard let incoming = try store.blobs.receive(digest, total: declared) else {
                // Another transfer of this process is receiving it: wait for that one to end.
                await store.blobs.waitWhileReceiving(digest)
                try Task.checkCancellation()
                if store.blobs.has(digest) { return }
                continue
            }
            let resumedAt = incoming.length
            progress.count { $0.blobBytesToReceive += declared - resumedAt }
            do {
                try await receiveChunks(into: incoming)
            } catch let mismatch as BlobLengthMismatch {
                // The sender's blob is not the length its revision declares: that revision
                // can never be stored, and is refused when inserted (missing blob).
                incoming.discard()
                logger.warning(
                    "blob length differs from its reference; the revision will be refused",
                    metadata: ["digest": "\(digest)", "declared": "\(declared)", "actual": "\(mismatch.actual)"])
                return
            } catch {
                incoming.suspend()
                throw error
            }
            do {
                try incoming.complete()
            } catch StoreError.blobCorrupt {
                corruptions += 1
                logger.warning(
                    "blob content does not match its digest; fetching it again",
                    metadata: ["digest": "\(digest)", "attempt": "\(corruptions)"])
                guard corruptions < 2 else {
                    throw SyncError(
                        .protocolViolation, message: "blob \(digest) arrived twice with content that does not match its digest",
                        isTransient: true)
                }
                continue
            }
            if resumedAt > 0 {
                logger.info("blob transfer resumed", metadata: ["digest": "\(digest)", "offset": "\(resumedAt)", "length": "\(declared)"])
            }
            progress.count { $0.blobsReceived += 1 }
            return
        }
    }

    /// The sender's blob length, when it differs from the declared one.
    private struct BlobLengthMismatch: Error {
        let actual: Int64
    }

    /// Asks for the chunks after what `incoming` holds, `window` at a time, and appends them in order.
    private func receiveChunks(into incoming: IncomingBlob) async throws {
        let (remote, digest, total, size) = (self.remote, incoming.digest, incoming.total, Int64(chunkSize))
        var next = incoming.length
        var inFlight: [(offset: Int64, task: Task<BlobChunk, any Error>)] = []
        defer { for f in inFlight { f.task.cancel() } }
        while incoming.length < total {
            // A local remote answers without suspending, so a stop is seen only here.
            try Task.checkCancellation()
            while inFlight.count < window, next < total {
                let (offset, count) = (next, Int(min(size, total - next)))
                inFlight.append((offset, Task { try await remote.blobChunk(digest, offset: offset, count: count) }))
                next += Int64(count)
            }
            let (offset, task) = inFlight.removeFirst()
            let chunk = try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() }
            guard chunk.total == total else { throw BlobLengthMismatch(actual: chunk.total) }
            guard chunk.bytes.count == Int(min(size, total - offset)) else {
                throw SyncError.protocolViolation(
                    "getBlob of \(digest) at \(offset) returned \(chunk.bytes.count) bytes, not \(min(size, total - offset))")
            }
            try incoming.append(chunk.bytes)
            progress.count { $0.blobBytesReceived += Int64(chunk.bytes.count) }
        }
    }

    /// Sends the blobs that outgoing revisions refer to and the other side lacks.
    func sendMissing(for wires: [WireRevision], trees: [DocumentID: RevisionTree]) async throws {
        var digests: [BlobDigest: Int64] = [:]
        for w in wires {
            guard let id = try? DocumentID(w.id, allowReserved: true), let rev = try? RevisionID(w.rev),
                let bytes = trees[id]?.revision(rev)?.body, DocumentStore.mayReferenceBlobs(bytes),
                let body = try? JSON.parse(bytes)
            else { continue }
            for ref in (try? body.blobReferences()) ?? [] { digests[ref.digest] = ref.length }
        }
        guard !digests.isEmpty else { return }
        guard remote.chunkedBlobs else {
            for digest in try await remote.missingBlobs(digests.keys.sorted()) {
                guard let content = try store.blobs.get(digest) else { continue }
                try await remote.putBlob(digest, content: content)
                progress.count {
                    $0.blobsSent += 1
                    $0.blobBytesSent += Int64(content.count)
                }
            }
            return
        }
        let missing = try await remote.missingBlobOffsets(
            digests.keys.sorted().map { BlobReference(digest: $0, length: digests[$0]!) })
        for digest in missing.keys.sorted() {
            guard let reader = try store.blobs.reader(digest) else { continue }
            try await sendInChunks(reader, from: missing[digest]!)
            progress.count { $0.blobsSent += 1 }
        }
    }

    /// Sends one blob from `offset` in chunks, `window` at a time. The other side applies
    /// chunks in order whatever order they arrive in; when it says it holds less than was
    /// sent (it lost a partial file), sending restarts from what it holds, until it stalls.
    private func sendInChunks(_ reader: BlobReader, from start: Int64) async throws {
        let (remote, digest, total, size) = (self.remote, reader.digest, reader.length, Int64(chunkSize))
        var next = min(max(0, start), total)
        progress.count { $0.blobBytesToSend += total - next }
        var have: Int64 = -1
        var stalls = 0
        var sentEmpty = false
        var inFlight: [(offset: Int64, task: Task<Int64, any Error>)] = []
        defer { for f in inFlight { f.task.cancel() } }
        while true {
            try Task.checkCancellation()
            // An empty blob still takes one (empty) chunk, which completes it.
            while inFlight.count < window, next < total || (total == 0 && !sentEmpty) {
                sentEmpty = true
                let offset = next
                let bytes = try reader.read(offset: offset, count: Int(min(size, total - offset)))
                guard Int64(bytes.count) == min(size, total - offset) else {
                    throw SyncError(.io, message: "blob \(digest) shrank while being sent", isTransient: true)
                }
                inFlight.append((offset, Task { try await remote.putBlobChunk(digest, offset: offset, total: total, bytes: bytes) }))
                next += Int64(bytes.count)
                progress.count { $0.blobBytesSent += Int64(bytes.count) }
            }
            guard !inFlight.isEmpty else { break }
            let (offset, task) = inFlight.removeFirst()
            let before = have
            // Chunks are sent only `window` ahead of the last reply, so this reply reflects every
            // chunk sent more than `window` before it.
            have = try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() }
            if have == total { return }
            // The other side holds chunks at most `window` ahead of what it has; one further
            // ahead was dropped (it lost its partial file): send again from what it holds.
            let dropped = have < offset - Int64(window) * size
            if dropped || (inFlight.isEmpty && next >= total) {
                stalls = have > before ? 0 : stalls + 1
                guard stalls < 3 else { break }
                for f in inFlight { f.task.cancel() }
                inFlight.removeAll()
                next = max(0, have)
                sentEmpty = false
            }
        }
        throw SyncError(.protocolViolation, message: "the peer did not confirm blob \(digest)", isTransient: true)
    }
}
