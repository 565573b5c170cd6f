import FerryCore
import FerryStore
import FerrySync
import Logging

/// Fetches a deferred blob (left for first read by a lazy policy) from whichever peer this
/// node replicates with now has it, trying each open connection in turn.
public struct DeferredBlobFetcher: Sendable {
    let store: DocumentStore
    let replicators: @Sendable () -> [Replicator]
    let logger: Logger

    /// Makes sure the blob is here: present already, or fetched now (from any connected peer
    /// but `excluding`, the one that asked for it). Returns false when the blob is neither
    /// stored nor deferred (no revision here refers to it); throws `BlobUnavailable` when it
    /// is deferred and no connected peer could give it.
    public func ensure(_ digest: BlobDigest, excluding: String? = nil) async throws(BlobUnavailable) -> Bool {
        guard let length = store.blobs.deferredLength(digest) else { return store.blobs.length(digest) != nil }
        if store.blobs.length(digest) != nil { return true }
        let ref = BlobReference(digest: digest, length: length)
        var failures: [String] = []
        for replicator in replicators() where excluding == nil || replicator.remotePeerID != excluding {
            do {
                if try await replicator.fetchDeferredBlob(ref) {
                    logger.info("deferred blob fetched on first read", metadata: ["digest": "\(digest)", "length": "\(length)"])
                    return true
                }
            } catch {
                failures.append(error.statusText)
            }
        }
        let why =
            failures.isEmpty
            ? "no connected peer has it" : "no connected peer could send it (\(failures.prefix(3).joined(separator: "; ")))"
        throw BlobUnavailable(digest: digest, reason: why)
    }
}

/// A deferred blob that no connected peer could send: it may be later, when one connects.
public struct BlobUnavailable: FerryError {
    public let digest: BlobDigest
    public let reason: String
    public var domain: String { "node" }
    public var code: String { "blob_unavailable" }
    public var failure: FailureKind { .unavailable }
    public var isTransient: Bool { true }
    public var description: String { "blob \(digest) is not fetched yet and \(reason)" }
}

/// The replicators a running node has now, known once its peer manager exists (the CouchDB
/// API is built before it).
final class LiveReplicators: Sendable {
    private let provider = CallbackSlot<Void, [Replicator]>()

    /// Set once, by the peer manager made with it.
    func source(_ list: @escaping @Sendable () -> [Replicator]) { provider.set(list) }

    /// Every replicator running now; none before the peer manager is made.
    var list: @Sendable () -> [Replicator] { { [self] in self.provider() ?? [] } }
}
