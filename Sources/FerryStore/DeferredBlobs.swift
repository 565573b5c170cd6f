import FerryCore
import Foundation

/// Where a blob stands in this store.
public enum BlobState: Sendable, Equatable {
    /// Stored whole, `length` bytes.
    case present(length: Int64)
    /// Referred to by a stored revision but not fetched yet (a lazy policy), `length` bytes
    /// declared; `partial` of them already arrived.
    case deferred(length: Int64, partial: Int64)
    /// Neither stored nor deferred.
    case absent
}

/// Deferred blobs: documents may refer to them before their content is here (a lazy fetch
/// policy). Each is a marker file `deferred/<hex>` holding its declared length, removed
/// when the content arrives or when no revision refers to the blob any more.
extension BlobStore {
    func deferredPath(for digest: BlobDigest) -> String? {
        directory.map { "\($0)/deferred/\(digest.hex)" }
    }

    /// Records that revisions may refer to `ref` before its content is here.
    public func markDeferred(_ ref: BlobReference) throws(StoreError) {
        guard !has(ref.digest) else { return }
        guard let path = deferredPath(for: ref.digest), let directory else {
            memoryDeferred.withLock { $0[ref.digest] = ref.length }
            return
        }
        do {
            try FileManager.default.createDirectory(
                atPath: "\(directory)/deferred", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(directory)/deferred: \(error.localizedDescription)")
        }
        try Self.writePartialRecord(path, total: ref.length, verified: 0)
    }

    /// The declared length of a deferred blob; nil when it is not deferred.
    public func deferredLength(_ digest: BlobDigest) -> Int64? {
        guard let path = deferredPath(for: digest) else { return memoryDeferred.withLock { $0[digest] } }
        return Self.readPartialRecord(path)?.total
    }

    /// Every deferred blob with its declared length.
    public func deferredBlobs() -> [BlobReference] {
        guard let directory else {
            return memoryDeferred.withLock { $0.map { BlobReference(digest: $0.key, length: $0.value) } }
        }
        let dir = "\(directory)/deferred"
        return ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).compactMap { name in
            guard let digest = try? BlobDigest(name), let length = Self.readPartialRecord("\(dir)/\(name)")?.total else { return nil }
            return BlobReference(digest: digest, length: length)
        }
    }

    /// Forgets that a blob is deferred (its content arrived, or nothing refers to it).
    func clearDeferred(_ digest: BlobDigest) {
        guard let path = deferredPath(for: digest) else {
            _ = memoryDeferred.withLock { $0.removeValue(forKey: digest) }
            return
        }
        unlink(path)
    }

    /// Forgets deferred blobs no revision refers to any more, marked before `cutoff` (a
    /// marker is written just before the revision that needs it is stored).
    func forgetDeferred(except referenced: Set<BlobDigest>, markedBefore cutoff: Date) {
        for ref in deferredBlobs() where !referenced.contains(ref.digest) {
            if let path = deferredPath(for: ref.digest) {
                guard let attrs = try? FileManager.default.attributesOfItem(atPath: path),
                    let modified = attrs[.modificationDate] as? Date, modified <= cutoff
                else { continue }
            }
            clearDeferred(ref.digest)
        }
    }

    /// Where the blob stands: stored, deferred (with what already arrived), or absent.
    public func state(_ digest: BlobDigest) -> BlobState {
        if let length = length(digest) { return .present(length: length) }
        if let declared = deferredLength(digest) { return .deferred(length: declared, partial: partialLength(digest)) }
        return .absent
    }
}
