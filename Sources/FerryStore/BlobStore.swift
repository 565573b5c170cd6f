import FerryCore
import Foundation
import Crypto

/// Content-addressed blob storage: files named by their SHA-256 under a directory,
/// written atomically (temp file, fsync, rename), or kept in memory for tests.
public final class BlobStore: Sendable {
    /// The blob directory, or nil for an in-memory store.
    public let directory: String?
    private let memory = Locked<[BlobDigest: MemoryBlob]>([:])
    /// Held while a blob is confirmed present (put, has) and while collection removes one,
    /// so a blob someone has just relied on is never removed under them.
    private let sweepLock = Locked<Void>(())
    /// Digests an `IncomingBlob` of this process is receiving now.
    let receiving = Locked<Set<BlobDigest>>([])
    /// Tasks waiting for a digest's receiver to finish (see `waitWhileReceiving`).
    let receivingWaiters = Locked<[BlobDigest: [CheckedContinuation<Void, Never>]]>([:])
    /// Partly received blobs of an in-memory store.
    let memoryPartials = Locked<[BlobDigest: (total: Int64, bytes: [UInt8])]>([:])
    /// Deferred blobs of an in-memory store, with their declared lengths.
    let memoryDeferred = Locked<[BlobDigest: Int64]>([:])

    /// A blob kept in memory, with when it was last stored or asked for.
    private struct MemoryBlob {
        var content: [UInt8]
        var touched: Date
    }

    /// An in-memory blob store.
    public init() { directory = nil }

    /// A blob store in `directory`, created if needed.
    public init(directory: String) throws(StoreError) {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(
                atPath: (directory as NSString).appendingPathComponent("tmp"), withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create blob directory \(directory): \(StoreError.describe(error))")
        }
    }

    /// A blob store in `directory` that is only read: nothing is created.
    public init(existingDirectory directory: String) {
        self.directory = directory
    }

    func path(for digest: BlobDigest) -> String? {
        guard let directory else { return nil }
        let h = digest.hex
        return "\(directory)/\(h.prefix(2))/\(h)"
    }

    /// Stores `content`; storing the same content twice is a no-op. Returns its reference.
    @discardableResult
    public func put(_ content: [UInt8], contentType: String? = nil) throws(StoreError) -> BlobReference {
        let digest = BlobDigest.of(content)
        let ref = BlobReference(digest: digest, length: Int64(content.count), contentType: contentType)
        guard let directory, let final = path(for: digest) else {
            memory.withLock { $0[digest] = MemoryBlob(content: content, touched: Date()) }
            clearDeferred(digest)
            return ref
        }
        // Storing it again counts as new: its revision may follow, so collection waits again.
        if touchIfPresent(digest) { return ref }
        let temp = "\(directory)/tmp/\(UUID().uuidString)"
        try writeDurably(content, to: temp)
        try moveIntoPlace(temp, final)
        return ref
    }

    /// Stores the content of a file, hashing it as it is copied (memory stays flat).
    @discardableResult
    public func put(fileAt source: String, contentType: String? = nil) throws(StoreError) -> BlobReference {
        guard let input = FileHandle(forReadingAtPath: source) else { throw .io("cannot read \(source)") }
        defer { try? input.close() }
        guard let directory else {
            let data = (try? input.readToEnd()) ?? Data()
            return try put(Array(data), contentType: contentType)
        }
        let temp = "\(directory)/tmp/\(UUID().uuidString)"
        guard FileManager.default.createFile(atPath: temp, contents: nil, attributes: [.posixPermissions: 0o600]),
            let output = FileHandle(forWritingAtPath: temp)
        else { throw .io("cannot create \(temp)") }
        var hasher = SHA256()
        var length: Int64 = 0
        do {
            defer { try? output.close() }
            while let chunk = try input.read(upToCount: 1 << 20), !chunk.isEmpty {
                hasher.update(data: chunk)
                try output.write(contentsOf: chunk)
                length += Int64(chunk.count)
            }
            try output.synchronize()
        } catch {
            try? FileManager.default.removeItem(atPath: temp)
            throw .io("copying \(source) into the blob store: \(error.localizedDescription)")
        }
        let digest = BlobDigest(uncheckedHex: Hex.encode(hasher.finalize()))
        let final = path(for: digest)!
        if touchIfPresent(digest) {
            try? FileManager.default.removeItem(atPath: temp)
        } else {
            try moveIntoPlace(temp, final)
        }
        return BlobReference(digest: digest, length: length, contentType: contentType)
    }

    /// The content of a blob, verified against its digest; nil if absent.
    public func get(_ digest: BlobDigest) throws(StoreError) -> [UInt8]? {
        let content: [UInt8]
        if let path = path(for: digest) {
            guard let data = FileManager.default.contents(atPath: path) else { return nil }
            content = Array(data)
        } else {
            guard let c = memory.withLock({ $0[digest]?.content }) else { return nil }
            content = c
        }
        guard BlobDigest.of(content) == digest else { throw .blobCorrupt(digest) }
        return content
    }

    func memoryContent(_ digest: BlobDigest) -> [UInt8]? {
        memory.withLock { $0[digest]?.content }
    }

    /// Whether the blob is stored. A yes counts as a use, like storing it again: a caller
    /// that skips fetching it because it is here is not then left without it by collection.
    public func has(_ digest: BlobDigest) -> Bool { touchIfPresent(digest) }

    /// Marks a stored blob as just used (its file's modification time, or the in-memory
    /// record's); false when it is absent.
    private func touchIfPresent(_ digest: BlobDigest) -> Bool {
        sweepLock.withLock { _ in
            guard let path = path(for: digest) else {
                return memory.withLock { m in
                    guard m[digest] != nil else { return false }
                    m[digest]!.touched = Date()
                    return true
                }
            }
            guard access(path, F_OK) == 0 else { return false }
            // A read-only store cannot touch; the blob is there all the same.
            _ = utimensat(AT_FDCWD, path, nil, 0)
            return true
        }
    }

    /// The length of a stored blob, or nil if absent.
    public func length(_ digest: BlobDigest) -> Int64? {
        if let path = path(for: digest) {
            guard let attrs = try? FileManager.default.attributesOfItem(atPath: path),
                let size = attrs[.size] as? NSNumber
            else { return nil }
            return size.int64Value
        }
        return memory.withLock { $0[digest].map { Int64($0.content.count) } }
    }

    /// Every stored digest with its size and modification date.
    func inventory() -> [(digest: BlobDigest, size: Int64, modified: Date)] {
        guard let directory else {
            return memory.withLock { m in m.map { ($0.key, Int64($0.value.content.count), $0.value.touched) } }
        }
        var out: [(BlobDigest, Int64, Date)] = []
        let fm = FileManager.default
        for prefix in (try? fm.contentsOfDirectory(atPath: directory)) ?? [] where prefix.count == 2 {
            let dir = "\(directory)/\(prefix)"
            for name in (try? fm.contentsOfDirectory(atPath: dir)) ?? [] {
                guard let digest = try? BlobDigest(name),
                    let attrs = try? fm.attributesOfItem(atPath: "\(dir)/\(name)")
                else { continue }
                let size = (attrs[.size] as? NSNumber)?.int64Value ?? 0
                out.append((digest, size, attrs[.modificationDate] as? Date ?? .distantPast))
            }
        }
        return out
    }

    func totalSize() -> Int64 { inventory().reduce(0) { $0 + $1.size } }

    /// Removes the blob if it was last stored or used before `cutoff`; returns its size, or
    /// nil when it is absent or was used since.
    func remove(_ digest: BlobDigest, ifUnusedSince cutoff: Date) throws(StoreError) -> Int64? {
        try sweepLock.withLock { _ throws(StoreError) -> Int64? in
            guard let path = path(for: digest) else {
                return memory.withLock { m -> Int64? in
                    guard let blob = m[digest], blob.touched <= cutoff else { return nil }
                    m[digest] = nil
                    return Int64(blob.content.count)
                }
            }
            guard let attrs = try? FileManager.default.attributesOfItem(atPath: path),
                let modified = attrs[.modificationDate] as? Date, modified <= cutoff
            else { return nil }
            do { try FileManager.default.removeItem(atPath: path) } catch {
                throw .io("cannot remove blob \(digest): \(error.localizedDescription)")
            }
            return (attrs[.size] as? NSNumber)?.int64Value ?? 0
        }
    }

    /// Removes files left in `tmp/` by writes that never finished (a crash mid-copy) and
    /// last written before `cutoff`; returns their count and bytes.
    func removeAbandonedTemporaries(before cutoff: Date) -> (count: Int, bytes: Int64) {
        guard let directory else { return (0, 0) }
        let tmp = "\(directory)/tmp"
        var count = 0
        var bytes: Int64 = 0
        for name in (try? FileManager.default.contentsOfDirectory(atPath: tmp)) ?? [] {
            let path = "\(tmp)/\(name)"
            guard let attrs = try? FileManager.default.attributesOfItem(atPath: path),
                let modified = attrs[.modificationDate] as? Date, modified <= cutoff,
                (try? FileManager.default.removeItem(atPath: path)) != nil
            else { continue }
            count += 1
            bytes += (attrs[.size] as? NSNumber)?.int64Value ?? 0
        }
        return (count, bytes)
    }

    private func writeDurably(_ content: [UInt8], to path: String) throws(StoreError) {
        let fd = Foundation.open(path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else { throw .io("cannot create \(path): \(StoreError.describe(errno: errno))") }
        defer { close(fd) }
        var written = 0
        while written < content.count {
            let n = content.withUnsafeBytes { Foundation.write(fd, $0.baseAddress! + written, content.count - written) }
            if n < 0 {
                if errno == EINTR { continue }
                unlink(path)
                throw .io("writing \(path): \(StoreError.describe(errno: errno))")
            }
            written += n
        }
        guard fsync(fd) == 0 else {
            unlink(path)
            throw .io("fsync \(path): \(StoreError.describe(errno: errno))")
        }
    }

    func moveIntoPlace(_ temp: String, _ final: String) throws(StoreError) {
        let dir = (final as NSString).deletingLastPathComponent
        do {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(dir): \(error.localizedDescription)")
        }
        guard rename(temp, final) == 0 else {
            unlink(temp)
            throw .io("cannot move blob into place at \(final): \(StoreError.describe(errno: errno))")
        }
        if let digest = try? BlobDigest((final as NSString).lastPathComponent) { clearDeferred(digest) }
        let dfd = Foundation.open(dir, O_RDONLY)
        if dfd >= 0 {
            fsync(dfd)
            close(dfd)
        }
    }
}
