import Crypto
import FerryCore
import Foundation

/// Streams content whose digest is not known in advance into the blob store: bytes go to a
/// file in `tmp/` and are hashed as they arrive (SHA-256, and MD5 when asked, for CouchDB's
/// digests); `finish` makes the file durable and moves it into place under its digest.
/// Memory stays flat whatever the content's size.
///
/// With a `resumeKey`, the file is `tmp/<key>` and outlives the writer when it is
/// suspended (or the process dies): the next writer of the same key starts after the bytes
/// already there, rehashing them, so a download can resume with a range request. Nothing
/// there is trusted: the digest is computed over every byte at the end. Leftover files are
/// removed with the store's other abandoned temporaries.
public final class BlobWriter: @unchecked Sendable {
    // @unchecked: owned by one writer task at a time, which calls it serially (a download,
    // an attachment body, an app's blob); it is handed on, never shared.
    /// Bytes written so far (including those found on resume).
    public private(set) var length: Int64 = 0
    /// Bytes that were already there when the writer opened (resumed).
    public let resumedFrom: Int64
    private let store: BlobStore
    private let path: String?
    private var fd: Int32 = -1
    private var sha = SHA256()
    private var md5: Insecure.MD5?
    private let wantsMD5: Bool
    private var memory: [UInt8] = []
    private var finished = false

    /// A writer into `store`. `resumeKey` (letters, digits, `.`, `_`, `-`) names a resumable
    /// file; `md5` also computes CouchDB's MD5 of the content.
    public init(store: BlobStore, resumeKey: String? = nil, md5: Bool = false) throws(StoreError) {
        self.store = store
        wantsMD5 = md5
        self.md5 = md5 ? Insecure.MD5() : nil
        guard let directory = store.directory else {
            path = nil
            resumedFrom = 0
            return
        }
        let name: String
        if let resumeKey {
            guard !resumeKey.isEmpty, resumeKey.utf8.count <= 200,
                resumeKey.unicodeScalars.allSatisfy({ $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "._-".unicodeScalars.contains($0)) }),
                !resumeKey.hasPrefix(".")
            else { throw .io("bad blob resume key \(resumeKey)") }
            name = "resume-" + resumeKey
        } else {
            name = UUID().uuidString
        }
        let path = "\(directory)/tmp/\(name)"
        self.path = path
        do {
            try FileManager.default.createDirectory(
                atPath: "\(directory)/tmp", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .io("cannot create \(directory)/tmp: \(error.localizedDescription)")
        }
        fd = Foundation.open(path, O_RDWR | O_CREAT | (resumeKey == nil ? O_EXCL : 0), 0o600)
        guard fd >= 0 else { throw .io("cannot create \(path): errno \(errno)") }
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            Foundation.close(fd)
            throw .io("cannot stat \(path): errno \(errno)")
        }
        resumedFrom = Int64(st.st_size)
        if resumedFrom > 0 {
            do { try rehash(Int64(st.st_size)) } catch {
                Foundation.close(fd)
                throw error
            }
            length = resumedFrom
        }
        guard lseek(fd, off_t(length), SEEK_SET) >= 0 else {
            Foundation.close(fd)
            throw .io("cannot seek \(path): errno \(errno)")
        }
    }

    private func rehash(_ count: Int64) throws(StoreError) {
        try readPrefix(of: fd, count: count, what: "\(path ?? "a partial download") to resume") { hash($0) }
    }

    private func hash(_ bytes: UnsafeRawBufferPointer) {
        sha.update(bufferPointer: bytes)
        md5?.update(bufferPointer: bytes)
    }

    /// Appends `bytes`.
    public func write(_ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        precondition(!finished, "write after the blob writer finished")
        guard !bytes.isEmpty else { return }
        hash(bytes)
        if fd < 0 {
            memory.append(contentsOf: bytes)
        } else {
            var written = 0
            while written < bytes.count {
                let n = Foundation.write(fd, bytes.baseAddress! + written, bytes.count - written)
                if n < 0 {
                    if errno == EINTR { continue }
                    throw .io("writing \(path!): errno \(errno)")
                }
                written += n
            }
        }
        length += Int64(bytes.count)
    }

    /// Appends `bytes`.
    public func write(_ bytes: [UInt8]) throws(StoreError) {
        var failure: StoreError?
        bytes.withUnsafeBytes { b in
            do throws(StoreError) { try write(b) } catch { failure = error }
        }
        if let failure { throw failure }
    }

    /// Throws away what was written (a resumed file included) and starts again at byte 0:
    /// for a server that answered a range request with the whole content.
    public func restart() throws(StoreError) {
        precondition(!finished, "restart after the blob writer finished")
        sha = SHA256()
        md5 = wantsMD5 ? Insecure.MD5() : nil
        memory = []
        length = 0
        if fd >= 0 {
            guard ftruncate(fd, 0) == 0, lseek(fd, 0, SEEK_SET) >= 0 else { throw .io("cannot truncate \(path!): errno \(errno)") }
        }
    }

    /// The MD5 of what was written so far, as CouchDB writes digests (`md5-<base64>`); nil
    /// unless asked for at creation.
    public var md5Digest: String? {
        md5.map { "md5-" + Data($0.finalize()).base64EncodedString() }
    }

    /// The SHA-256 of what was written so far.
    public var digest: BlobDigest { BlobDigest(uncheckedHex: Hex.encode(sha.finalize())) }

    /// Makes the content durable and stores it under its digest (storing content already
    /// there is a no-op); returns its reference.
    @discardableResult
    public func finish(contentType: String? = nil) throws(StoreError) -> BlobReference {
        precondition(!finished, "finish twice")
        finished = true
        let digest = self.digest
        let reference = BlobReference(digest: digest, length: length, contentType: contentType)
        guard fd >= 0, let path else {
            let content = memory
            memory = []
            return try store.put(content, contentType: contentType)
        }
        defer {
            Foundation.close(fd)
            fd = -1
        }
        if store.has(digest) {
            unlink(path)
            return reference
        }
        guard fsync(fd) == 0 else {
            unlink(path)
            throw .io("fsync \(path): errno \(errno)")
        }
        guard let final = store.path(for: digest) else { return reference }
        let dir = (final as NSString).deletingLastPathComponent
        do {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            unlink(path)
            throw .io("cannot create \(dir): \(error.localizedDescription)")
        }
        guard rename(path, final) == 0 else {
            unlink(path)
            throw .io("cannot move blob into place at \(final): errno \(errno)")
        }
        let dfd = Foundation.open(dir, O_RDONLY)
        if dfd >= 0 {
            fsync(dfd)
            Foundation.close(dfd)
        }
        return reference
    }

    /// Stops for now: a resumable file is made durable and kept for the next writer of its
    /// key; any other is removed.
    public func suspend() {
        guard !finished else { return }
        finished = true
        memory = []
        guard fd >= 0 else { return }
        if path?.contains("/resume-") == true {
            fsync(fd)
        } else if let path {
            unlink(path)
        }
        Foundation.close(fd)
        fd = -1
    }

    /// Throws away what was written, a resumable file included.
    public func discard() {
        guard !finished else { return }
        finished = true
        memory = []
        if fd >= 0 {
            Foundation.close(fd)
            fd = -1
        }
        if let path { unlink(path) }
    }

    deinit {
        if fd >= 0 {
            Foundation.close(fd)
            // Abandoned without a word: a plain temporary is of no use to anyone.
            if let path, !path.contains("/resume-") { unlink(path) }
        }
    }
}
