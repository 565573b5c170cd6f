import FerryCore
import FerryStore

/// Moves the blobs a batch of revisions refers to, before the revisions: fetches those
/// missing here (pull) and sends those the other side lacks (push), each once, by digest.
struct BlobTransfer: Sendable {
    let store: DocumentStore
    let remote: any RemoteDatabase
    let progress: ReplicationProgress

    /// Fetches the blobs that accepted incoming revisions refer to and this store lacks;
    /// content that does not match its digest is a protocol error.
    func fetchMissing(for revisions: [IncomingRevision]) async throws {
        var needed = Set<BlobDigest>()
        for rev in revisions {
            if let bytes = rev.canonicalBody, !DocumentStore.mayReferenceBlobs(bytes) { continue }
            for ref in (try? rev.body.blobReferences()) ?? [] where !store.blobs.has(ref.digest) { needed.insert(ref.digest) }
        }
        for digest in needed.sorted() {
            let content = try await remote.blob(digest)
            guard BlobDigest.of(content) == digest else {
                throw SyncError.protocolViolation("blob \(digest) arrived with content that does not match its digest")
            }
            try store.blobs.put(content)
            progress.count { $0.blobsReceived += 1 }
        }
    }

    /// Sends the blobs that outgoing revisions refer to and the other side lacks.
    func sendMissing(for wires: [WireRevision], trees: [DocumentID: RevisionTree]) async throws {
        var digests = Set<BlobDigest>()
        for w in wires {
            guard let id = try? DocumentID(w.id, allowReserved: true), let rev = try? RevisionID(w.rev),
                let bytes = trees[id]?.revision(rev)?.body, DocumentStore.mayReferenceBlobs(bytes),
                let body = try? JSON.parse(bytes)
            else { continue }
            for ref in (try? body.blobReferences()) ?? [] { digests.insert(ref.digest) }
        }
        guard !digests.isEmpty else { return }
        for digest in try await remote.missingBlobs(digests.sorted()) {
            guard let content = try store.blobs.get(digest) else { continue }
            try await remote.putBlob(digest, content: content)
            progress.count { $0.blobsSent += 1 }
        }
    }
}
