import FerryCore
import FerryStore

/// A blob a peer is pushing in chunks on one session: its partial file, and the chunks that
/// arrived ahead of their turn (requests are answered concurrently, so pipelined chunks may
/// be handled out of order).
final class BlobAssembly: @unchecked Sendable {
    // @unchecked: `ahead`, `closed`, `stored` and the file are touched only inside `serialized`.
    let incoming: IncomingBlob
    var ahead: [Int64: [UInt8]] = [:]
    /// Set once the blob is stored, or given up (suspended): later chunks find it closed.
    var closed = false
    var stored = false
    /// Serializes this blob's file work (`serialized`); other blobs' chunks go on meanwhile.
    private let lock = Locked(())

    init(_ incoming: IncomingBlob) { self.incoming = incoming }

    /// Runs `body` alone with this blob's file (appends, `fsync`, the final rename).
    func serialized<T>(_ body: () throws -> T) rethrows -> T {
        try lock.withLock { _ in try body() }
    }

    /// Appends `bytes` at `offset` if it continues what is held (keeping only what is new),
    /// holds it if it is at most `window` chunks ahead, or drops it; then appends what it held.
    func accept(offset: Int64, _ bytes: [UInt8], window: Int) throws(StoreError) {
        if offset <= incoming.length {
            let skip = Int(incoming.length - offset)
            if skip < bytes.count { try incoming.append(bytes[skip...]) }
        } else if offset - incoming.length <= Int64(window * BlobAssembly.maxChunk), ahead.count < window {
            ahead[offset] = bytes
        }
        while let key = ahead.keys.first(where: { $0 <= incoming.length }) {
            let held = ahead.removeValue(forKey: key)!
            let skip = Int(incoming.length - key)
            if skip < held.count { try incoming.append(held[skip...]) }
        }
    }

    /// The largest chunk a putBlob may carry: other implementations may choose larger chunks
    /// than this one sends, up to this.
    static let maxChunk = 1 << 20
}

extension ResponderSession {
    func hasBlobs(_ request: Message) throws -> Message {
        try requirePush()
        let asked = try HasBlobsRequest(try request.json())
        // A restricted peer is told it holds only what it could have read or has sent: it
        // must send the rest, proving it has the content before a revision may refer to it.
        let restricted = !policy.read.admitsEverything
        let grants = blobGrants.withLock { $0 }
        var missing = asked.digests.filter { !store.blobs.has($0) || (restricted && !grants.contains($0)) }
        let blobPolicy = options.blobPolicy(for: peerID ?? "")
        if let lengths = asked.lengths, !restricted, blobPolicy != .eager {
            // Left to fetch on first read: the revision may refer to it before it is here.
            let declared = Dictionary(zip(asked.digests, lengths), uniquingKeysWith: { a, _ in a })
            var deferred = Set<BlobDigest>()
            for digest in missing {
                guard let length = declared[digest], !blobPolicy.fetchesBeforeStoring(length: length) else { continue }
                try store.blobs.markDeferred(BlobReference(digest: digest, length: length))
                deferred.insert(digest)
            }
            missing.removeAll { deferred.contains($0) }
        }
        var partial: [BlobDigest: Int64] = [:]
        for digest in missing {
            let held = blobAssemblies.withLock { $0[digest] }.map { a in a.serialized { a.incoming.length } } ?? store.blobs.partialLength(digest)
            if held > 0 { partial[digest] = held }
        }
        return reply(request, HasBlobsReply(missing: missing, partial: partial).json)
    }

    func getBlob(_ request: Message) async throws -> Message {
        try requirePull()
        guard let digest = request[BlobProperty.name].flatMap({ try? BlobDigest($0) }) else {
            throw SyncError.protocolViolation("getBlob lacks a valid Digest property")
        }
        // A restricted peer gets only blobs of revisions it was sent in this session (a
        // puller fetches a revision's blobs right after the revision): a digest alone opens nothing.
        let granted = policy.read.admitsEverything || blobGrants.withLock { $0.contains(digest) }
        let notFound = SyncError(.notFound, message: "no blob \(digest)", isTransient: false)
        // A blob a lazy policy left for first read here: a peer's read counts, so it is fetched
        // from another peer first (one hop: never for a request itself made on behalf of one).
        if granted, request[BlobProperty.onBehalf] == nil, let length = store.blobs.deferredLength(digest),
            store.blobs.length(digest) == nil, let fetch = responder.options.fetchDeferredBlob
        {
            try await responder.onBehalfFetches.run(BlobReference(digest: digest, length: length), for: peerID, fetch)
        }
        guard let offset = try BlobProperty.number(request, BlobProperty.offset) else {
            // A whole blob, for a peer that does not speak `blobChunks`.
            guard granted, let content = try store.blobs.get(digest) else { throw notFound }
            counts.withLock {
                $0.blobsSent += 1
                $0.blobBytesSent += Int64(content.count)
            }
            return Message(kind: .response, number: request.number, body: content)
        }
        let asked = try BlobProperty.number(request, BlobProperty.length) ?? Int64(SyncProtocol.blobChunkSize)
        guard granted, let reader = try store.blobs.reader(digest) else { throw notFound }
        let bytes = try reader.read(offset: offset, count: Int(min(asked, Int64(BlobAssembly.maxChunk))))
        counts.withLock {
            $0.blobBytesSent += Int64(bytes.count)
            if offset + Int64(bytes.count) == reader.length { $0.blobsSent += 1 }
        }
        return Message(
            kind: .response, number: request.number, properties: [(BlobProperty.total, "\(reader.length)")], body: bytes)
    }

    func putBlob(_ request: Message) async throws -> Message {
        try requirePush()
        let restrictedReader = !policy.read.admitsEverything
        guard let digest = request[BlobProperty.name].flatMap({ try? BlobDigest($0) }) else {
            throw SyncError.protocolViolation("putBlob lacks a valid Digest property")
        }
        guard !policy.write.admitsNoApplicationDocument else {
            throw SyncError.forbidden("this peer may not write documents, so it may not send blobs")
        }
        guard let offset = try BlobProperty.number(request, BlobProperty.offset) else {
            // A whole blob, from a peer that does not speak `blobChunks`.
            guard BlobDigest.of(request.body) == digest else {
                throw SyncError.protocolViolation("blob content does not match digest \(digest)")
            }
            try store.blobs.put(request.body)
            blobGrants.withLock { $0.proven.insert(digest) }
            counts.withLock {
                $0.blobsReceived += 1
                $0.blobBytesReceived += Int64(request.body.count)
            }
            return reply(request, [:])
        }
        guard let total = try BlobProperty.number(request, BlobProperty.total) else {
            throw SyncError.protocolViolation("putBlob chunk lacks \(BlobProperty.total)")
        }
        let count = Int64(request.body.count)
        guard count <= Int64(BlobAssembly.maxChunk), offset <= total, count <= total - offset else {
            throw SyncError.protocolViolation("putBlob chunk of \(count) bytes at \(offset) does not fit a \(total)-byte blob")
        }
        // Another peer is sending this blob here now: wait for that transfer to end rather
        // than refuse (a refused pusher would retry at once, again and again).
        while blobAssemblies.withLock({ $0[digest] == nil }), store.blobs.isReceiving(digest) {
            await store.blobs.waitWhileReceiving(digest)
            try Task.checkCancellation()
        }
        if !restrictedReader, store.blobs.has(digest), blobAssemblies.withLock({ $0[digest] == nil }) {
            return reply(request, PutBlobReply(have: total).json)
        }
        let assembly: BlobAssembly = try blobAssemblies.withLock { a throws -> BlobAssembly in
            if let open = a[digest] {
                guard open.incoming.total == total else {
                    throw SyncError.protocolViolation("putBlob of \(digest) changed its length from \(open.incoming.total) to \(total)")
                }
                return open
            }
            guard let incoming = try store.blobs.receive(digest, total: total) else {
                throw SyncError(.busy, message: "blob \(digest) is being received from another peer", isTransient: true)
            }
            let assembly = BlobAssembly(incoming)
            a[digest] = assembly
            return assembly
        }
        // The chunk's write (and the last chunk's fsync and rename) runs off the cooperative
        // pool, and holds only this blob's lock: the session's other requests, and other
        // blobs' chunks, go on meanwhile.
        let counts = self.counts
        let body = request.body
        let outcome: Result<(have: Int64, completed: Bool), SyncError> = try await BlockingIO.run {
            assembly.serialized {
                if assembly.closed {
                    // A chunk that came beside the one that finished the blob, or gave it up.
                    if assembly.stored { return .success((total, false)) }
                    return .failure(SyncError(.busy, message: "the transfer of blob \(digest) broke off; it resumes", isTransient: true))
                }
                let before = assembly.incoming.length
                do {
                    try assembly.accept(offset: offset, body, window: SyncProtocol.blobChunkWindow)
                } catch {
                    assembly.closed = true
                    assembly.incoming.suspend()
                    return .failure(SyncError.from(error))
                }
                counts.withLock { $0.blobBytesReceived += assembly.incoming.length - before }
                guard assembly.incoming.length == total else { return .success((assembly.incoming.length, false)) }
                assembly.closed = true
                do { try assembly.incoming.complete() } catch StoreError.blobCorrupt {
                    return .failure(
                        SyncError(.blobCorrupt, message: "blob \(digest) arrived with content that does not match its digest", isTransient: true))
                } catch {
                    return .failure(SyncError.from(error))
                }
                assembly.stored = true
                return .success((total, true))
            }
        }
        if assembly.serialized({ assembly.closed }) { blobAssemblies.withLock { a in if a[digest] === assembly { a[digest] = nil } } }
        let (have, completed) = try outcome.get()
        if completed {
            blobGrants.withLock { $0.proven.insert(digest) }
            counts.withLock { $0.blobsReceived += 1 }
        }
        return reply(request, PutBlobReply(have: have).json)
    }

    /// Keeps what this session's unfinished pushes delivered, for the next one to resume.
    func blobsEnded() {
        let open = blobAssemblies.withLock { a -> [BlobAssembly] in
            defer { a.removeAll() }
            return Array(a.values)
        }
        for assembly in open {
            assembly.serialized {
                guard !assembly.closed else { return }
                assembly.closed = true
                assembly.incoming.suspend()
            }
        }
    }
}

/// The deferred blobs a responder is fetching for peers: one fetch per blob, which every
/// peer asking for it meanwhile waits on (a puller asks for several chunks at once).
final class OnBehalfFetches: Sendable {
    private let running = Locked<[BlobDigest: Task<Bool, any Error>]>([:])

    /// Fetches `ref` through `fetch` (excluding `peer`), or waits on the fetch already
    /// running; a blob no peer could send is a transient `unavailable` error.
    func run(
        _ ref: BlobReference, for peer: String?,
        _ fetch: @escaping @Sendable (BlobReference, String?) async throws -> Bool
    ) async throws {
        let task = running.withLock { r -> Task<Bool, any Error> in
            if let t = r[ref.digest] { return t }
            let t = Task { try await BlobProperty.$fetchingOnBehalf.withValue(true) { try await fetch(ref, peer) } }
            r[ref.digest] = t
            return t
        }
        let fetched: Bool
        do {
            fetched = try await task.value
        } catch {
            forget(ref.digest, task)
            throw SyncError(.unavailable, message: "blob \(ref.digest) is deferred here and \(SyncError.from(error).message)", isTransient: true)
        }
        forget(ref.digest, task)
        guard fetched else {
            throw SyncError(.unavailable, message: "blob \(ref.digest) is deferred here and no other peer could send it", isTransient: true)
        }
    }

    private func forget(_ digest: BlobDigest, _ task: Task<Bool, any Error>) {
        running.withLock { r in if r[digest] == task { r[digest] = nil } }
    }
}
