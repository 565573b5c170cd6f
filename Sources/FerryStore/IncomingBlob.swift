import Crypto
import FerryCore
import Foundation

/// A blob being received in pieces: bytes are appended in order to a partial file beside
/// the blob store (`partial/<hex>`), hashed as they arrive, and made durable every
/// `checkpointBytes` with their verified length recorded in `partial/<hex>.len`; `complete`
/// checks the digest and moves the file into place. One receiver per digest at a time.
///
/// A partial file survives a dropped link, a killed process and a restart: the next
/// receiver of the same digest resumes at the recorded length (bytes past it may be torn
/// by a crash and are cut off), rehashing what is already there.
public final class IncomingBlob: @unchecked Sendable {
    // @unchecked: one receiver at a time (the store hands each digest to one), which calls it
    // serially; the responder serializes a session's chunks through `BlobAssembly.serialized`.
    public let digest: BlobDigest
    /// The blob's full length, as its reference declares it.
    public let total: Int64
    /// Bytes received and hashed so far; the next append must start here.
    public private(set) var length: Int64
    private let store: BlobStore
    private var hasher = SHA256()
    private var fd: Int32 = -1
    private var memory: [UInt8] = []
    private var sinceCheckpoint: Int64 = 0
    private var finished = false

    /// Bytes between two fsyncs of a partial file: what a crash can cost a resume, against
    /// one fsync per 8 MiB (a few ms on this class of disk, well under 1 % of the transfer).
    public static let checkpointBytes: Int64 = 8 << 20

    init(store: BlobStore, digest: BlobDigest, total: Int64) throws(StoreError) {
        self.store = store
        self.digest = digest
        self.total = total
        length = 0
        guard let path = store.partialPath(for: digest) else {
            if let kept = store.takeMemoryPartial(digest), kept.total == total {
                memory = kept.bytes
                hasher.update(data: memory)
                length = Int64(memory.count)
            }
            return
        }
        let recorded = BlobStore.readPartialRecord(path + ".len")
        fd = Foundation.open(path, O_RDWR | O_CREAT, 0o600)
        guard fd >= 0 else { throw .io("cannot open partial blob \(path): \(StoreError.describe(errno: errno))") }
        if let recorded, recorded.total == total, recorded.verified <= total {
            // Bytes past the recorded length were written but never made durable: cut them off.
            guard ftruncate(fd, off_t(recorded.verified)) == 0 else { throw closing(.io("cannot truncate \(path): \(StoreError.describe(errno: errno))")) }
            do { try rehash(upTo: recorded.verified) } catch { throw closing(error) }
            length = recorded.verified
        } else {
            guard ftruncate(fd, 0) == 0 else { throw closing(.io("cannot truncate \(path): \(StoreError.describe(errno: errno))")) }
            try writeRecord()
        }
        guard lseek(fd, off_t(length), SEEK_SET) >= 0 else { throw closing(.io("cannot seek \(path): \(StoreError.describe(errno: errno))")) }
    }

    private func closing(_ error: StoreError) -> StoreError {
        if fd >= 0 { Foundation.close(fd) }
        fd = -1
        store.releaseIncoming(digest)
        return error
    }

    private func rehash(upTo count: Int64) throws(StoreError) {
        try readPrefix(of: fd, count: count, what: "partial blob \(digest)") { hasher.update(bufferPointer: $0) }
    }

    private func writeRecord() throws(StoreError) {
        guard let path = store.partialPath(for: digest) else { return }
        try BlobStore.writePartialRecord(path + ".len", total: total, verified: length)
    }

    /// Appends the next bytes. Throws if they would run past the declared length.
    public func append(_ bytes: some Collection<UInt8>) throws(StoreError) {
        precondition(!finished, "append after the incoming blob was finished")
        guard Int64(bytes.count) <= total - length else {
            throw .blobLengthMismatch(digest, declared: total, actual: length + Int64(bytes.count))
        }
        hasher.update(data: Array(bytes))
        if fd < 0 {
            memory.append(contentsOf: bytes)
        } else {
            let array = Array(bytes)
            var written = 0
            while written < array.count {
                let n = array.withUnsafeBytes { Foundation.write(fd, $0.baseAddress! + written, array.count - written) }
                if n < 0 {
                    if errno == EINTR { continue }
                    throw .io("writing partial blob \(digest): \(StoreError.describe(errno: errno))")
                }
                written += n
            }
        }
        length += Int64(bytes.count)
        sinceCheckpoint += Int64(bytes.count)
        if sinceCheckpoint >= Self.checkpointBytes { try checkpoint() }
    }

    /// Makes what was appended durable and records its length, so a resume starts there.
    public func checkpoint() throws(StoreError) {
        sinceCheckpoint = 0
        guard fd >= 0 else { return }
        guard fsync(fd) == 0 else { throw .io("fsync of partial blob \(digest): \(StoreError.describe(errno: errno))") }
        try writeRecord()
    }

    /// Checks the whole content against the digest and stores the blob. A mismatch discards
    /// the partial file (it can never become this blob) and throws `blobCorrupt`.
    @discardableResult
    public func complete() throws(StoreError) -> BlobReference {
        guard length == total else { throw .blobLengthMismatch(digest, declared: total, actual: length) }
        let actual = BlobDigest(uncheckedHex: Hex.encode(hasher.finalize()))
        finished = true
        guard actual == digest else {
            discard()
            throw .blobCorrupt(digest)
        }
        defer { store.releaseIncoming(digest) }
        guard fd >= 0, let path = store.partialPath(for: digest) else {
            try store.put(memory)
            memory = []
            return BlobReference(digest: digest, length: total)
        }
        guard fsync(fd) == 0 else { throw .io("fsync of partial blob \(digest): \(StoreError.describe(errno: errno))") }
        Foundation.close(fd)
        fd = -1
        unlink(path + ".len")
        try store.adoptPartial(path, as: digest)
        return BlobReference(digest: digest, length: total)
    }

    /// Stops receiving for now and keeps what arrived, durable, for a later resume.
    public func suspend() {
        guard !finished else { return }
        finished = true
        if fd >= 0 {
            try? checkpoint()
            Foundation.close(fd)
            fd = -1
        } else if !memory.isEmpty {
            store.keepMemoryPartial(digest, total: total, bytes: memory)
        }
        store.releaseIncoming(digest)
    }

    /// Throws away what arrived.
    public func discard() {
        finished = true
        if fd >= 0 {
            Foundation.close(fd)
            fd = -1
        }
        if let path = store.partialPath(for: digest) {
            unlink(path)
            unlink(path + ".len")
        }
        memory = []
        store.releaseIncoming(digest)
    }

    deinit {
        if fd >= 0 { Foundation.close(fd) }
    }
}

/// Reads a stored blob in ranges without loading it whole.
public final class BlobReader: @unchecked Sendable {
    // @unchecked: immutable after init; reads use `pread`, which takes its offset per call,
    // so concurrent reads of one descriptor do not disturb each other.
    public let digest: BlobDigest
    public let length: Int64
    private let fd: Int32
    private let memory: [UInt8]?

    init(digest: BlobDigest, fd: Int32, length: Int64) {
        self.digest = digest
        self.fd = fd
        self.length = length
        memory = nil
    }

    init(digest: BlobDigest, memory: [UInt8]) {
        self.digest = digest
        fd = -1
        length = Int64(memory.count)
        self.memory = memory
    }

    /// Up to `count` bytes from `offset` (fewer only at the end; empty at or past it).
    public func read(offset: Int64, count: Int) throws(StoreError) -> [UInt8] {
        guard offset >= 0, count >= 0 else { throw .io("bad blob range \(offset)+\(count)") }
        guard offset < length else { return [] }
        let want = Int(min(Int64(count), length - offset))
        if let memory { return Array(memory[Int(offset)..<(Int(offset) + want)]) }
        var out = [UInt8](repeating: 0, count: want)
        var done = 0
        while done < want {
            let n = out.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, want - done, off_t(offset) + off_t(done)) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw .io("reading blob \(digest): \(StoreError.describe(errno: errno))") }
            if n == 0 { throw .io("blob \(digest) is shorter than its length") }
            done += n
        }
        return out
    }

    deinit {
        if fd >= 0 { Foundation.close(fd) }
    }
}

extension BlobStore {
    /// Where partial files live: `partial/` beside the blobs, never inside SQLite.
    func partialPath(for digest: BlobDigest) -> String? {
        directory.map { "\($0)/partial/\(digest.hex)" }
    }

    /// Starts or resumes receiving `digest`, declared `total` bytes long; nil while another
    /// transfer in this process receives it. The caller must `complete`, `suspend` or `discard`.
    public func receive(_ digest: BlobDigest, total: Int64) throws(StoreError) -> IncomingBlob? {
        guard total >= 0 else { throw .blobLengthMismatch(digest, declared: total, actual: 0) }
        let claimed = receiving.withLock { r -> Bool in r.insert(digest).inserted }
        guard claimed else { return nil }
        if let directory {
            do {
                try FileManager.default.createDirectory(
                    atPath: "\(directory)/partial", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            } catch {
                releaseIncoming(digest)
                throw .io("cannot create \(directory)/partial: \(error.localizedDescription)")
            }
        }
        return try IncomingBlob(store: self, digest: digest, total: total)
    }

    /// How many verified bytes of `digest` a partial file holds (0 when none), for resumes.
    public func partialLength(_ digest: BlobDigest) -> Int64 {
        guard let path = partialPath(for: digest) else {
            return memoryPartials.withLock { $0[digest].map { Int64($0.bytes.count) } ?? 0 }
        }
        return Self.readPartialRecord(path + ".len")?.verified ?? 0
    }

    /// Opens a stored blob for ranged reads; nil if absent. The content is not verified
    /// here: a reader of the whole blob checks it, a receiver checks it on arrival.
    public func reader(_ digest: BlobDigest) throws(StoreError) -> BlobReader? {
        guard let path = path(for: digest) else {
            guard let content = memoryContent(digest) else { return nil }
            return BlobReader(digest: digest, memory: content)
        }
        let fd = Foundation.open(path, O_RDONLY)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw .io("cannot open blob \(digest): \(StoreError.describe(errno: errno))")
        }
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            Foundation.close(fd)
            throw .io("cannot stat blob \(digest): \(StoreError.describe(errno: errno))")
        }
        return BlobReader(digest: digest, fd: fd, length: Int64(st.st_size))
    }

    /// Finishes partial files a crash left complete (checked, then moved into place) and
    /// removes partial files not written since `cutoff`. Returns the removed count and bytes.
    @discardableResult
    public func tidyPartials(removingUnwrittenSince cutoff: Date) -> (count: Int, bytes: Int64) {
        guard let directory else { return (0, 0) }
        let dir = "\(directory)/partial"
        var count = 0
        var bytes: Int64 = 0
        for name in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] where !name.hasSuffix(".len") {
            guard let digest = try? BlobDigest(name) else { continue }
            let path = "\(dir)/\(name)"
            if let record = Self.readPartialRecord(path + ".len"), record.verified == record.total,
                let incoming = try? receive(digest, total: record.total)
            {
                // Crashed between the last write and the move into place.
                if (try? incoming.complete()) != nil { continue }
            }
            guard receiving.withLock({ !$0.contains(digest) }),
                let attrs = try? FileManager.default.attributesOfItem(atPath: path),
                let modified = attrs[.modificationDate] as? Date, modified <= cutoff
            else { continue }
            unlink(path)
            unlink(path + ".len")
            count += 1
            bytes += (attrs[.size] as? NSNumber)?.int64Value ?? 0
        }
        return (count, bytes)
    }

    /// `tidyPartials`, removing partial files not written for `seconds`.
    @discardableResult
    public func tidyPartials(unwrittenFor seconds: Double) -> (count: Int, bytes: Int64) {
        tidyPartials(removingUnwrittenSince: Date().addingTimeInterval(-seconds))
    }

    func releaseIncoming(_ digest: BlobDigest) {
        // The waiters are taken under the same lock that registers them: none is missed.
        let waiters = receiving.withLock { r -> [CheckedContinuation<Void, Never>] in
            r.remove(digest)
            return receivingWaiters.withLock { $0.removeValue(forKey: digest) } ?? []
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Whether a transfer of this process receives `digest` now.
    public func isReceiving(_ digest: BlobDigest) -> Bool { receiving.withLock { $0.contains(digest) } }

    /// Returns once no transfer of this process receives `digest` (at once when none does):
    /// a second receiver waits for the first instead of polling.
    public func waitWhileReceiving(_ digest: BlobDigest) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = receiving.withLock { r -> Bool in
                guard r.contains(digest) else { return true }
                receivingWaiters.withLock { $0[digest, default: []].append(c) }
                return false
            }
            if now { c.resume() }
        }
    }

    func adoptPartial(_ partial: String, as digest: BlobDigest) throws(StoreError) {
        guard let final = path(for: digest) else { return }
        if has(digest) {
            unlink(partial)
            return
        }
        try moveIntoPlace(partial, final)
    }

    func takeMemoryPartial(_ digest: BlobDigest) -> (total: Int64, bytes: [UInt8])? {
        memoryPartials.withLock { $0.removeValue(forKey: digest) }
    }

    func keepMemoryPartial(_ digest: BlobDigest, total: Int64, bytes: [UInt8]) {
        memoryPartials.withLock { $0[digest] = (total, bytes) }
    }

    /// The record beside a partial file: `<total> <verified>` in decimal.
    static func readPartialRecord(_ path: String) -> (total: Int64, verified: Int64)? {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else {
            return nil
        }
        let parts = text.split(separator: " ").compactMap { Int64($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        guard parts.count == 2, parts[0] >= 0, parts[1] >= 0 else { return nil }
        return (parts[0], parts[1])
    }

    /// Replaces the record atomically (temp file, fsync, rename), so a crash leaves the old or the new one.
    static func writePartialRecord(_ path: String, total: Int64, verified: Int64) throws(StoreError) {
        let temp = path + ".tmp"
        let bytes = Array("\(total) \(verified)\n".utf8)
        let fd = Foundation.open(temp, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0 else { throw .io("cannot write \(temp): \(StoreError.describe(errno: errno))") }
        let n = bytes.withUnsafeBytes { Foundation.write(fd, $0.baseAddress!, bytes.count) }
        let synced = fsync(fd) == 0
        Foundation.close(fd)
        guard n == bytes.count, synced, rename(temp, path) == 0 else {
            unlink(temp)
            throw .io("cannot record partial blob length at \(path): \(StoreError.describe(errno: errno))")
        }
    }
}

/// Reads the first `count` bytes of the file `fd` in 1 MiB pieces, handing each to `body`
/// (rehashing what a resumed transfer already holds); a shorter file is an I/O error.
func readPrefix(
    of fd: Int32, count: Int64, what: String, _ body: (UnsafeRawBufferPointer) -> Void
) throws(StoreError) {
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    var done: Int64 = 0
    while done < count {
        let want = Int(min(Int64(buffer.count), count - done))
        let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress!, want, off_t(done)) }
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { throw .io("\(what) is shorter than the \(count) bytes expected (\(StoreError.describe(errno: errno)))") }
        buffer.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        done += Int64(n)
    }
}
