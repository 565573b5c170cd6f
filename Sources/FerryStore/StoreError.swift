import FerryCore
import Foundation
import GRDB

/// Everything that can go wrong in the document store; each case says whether a retry may help.
public enum StoreError: FerryError, Equatable {
    /// An update named a revision that is not a current leaf, or a create hit a live document.
    case conflict(id: DocumentID, given: RevisionID?, current: RevisionID?)
    case notFound(DocumentID)
    case revisionNotFound(DocumentID, RevisionID)
    case bodyNotRetained(DocumentID, RevisionID)
    case invalidDocumentID(DocumentIDError)
    case invalidBody(String)
    case tooLarge(bytes: Int, limit: Int)
    /// A replicated revision would give the document more leaves than the store allows.
    case tooManyLeaves(DocumentID, limit: Int)
    case digestMismatch(DocumentID, RevisionID)
    case invalidHistory(DocumentID, String)
    case rejected(DocumentID, reason: String)
    case missingBlob(BlobDigest)
    case blobCorrupt(BlobDigest)
    case blobLengthMismatch(BlobDigest, declared: Int64, actual: Int64)
    case corrupt(String)
    case busy(String)
    case io(String)
    case database(String)
    /// A directory opened for reading holds no Ferry database.
    case noDatabase(directory: String)
    /// A scan named an index that does not exist (any more), or whose entries are not complete yet.
    case indexUnavailable(id: Int64, reason: String)

    public var domain: String { "store" }

    public var code: String {
        switch self {
        case .conflict: return "conflict"
        case .notFound: return "not_found"
        case .revisionNotFound: return "revision_not_found"
        case .bodyNotRetained: return "body_not_retained"
        case .invalidDocumentID: return "invalid_document_id"
        case .invalidBody: return "invalid_body"
        case .tooLarge: return "too_large"
        case .tooManyLeaves: return "too_many_leaves"
        case .digestMismatch: return "digest_mismatch"
        case .invalidHistory: return "invalid_history"
        case .rejected: return "rejected"
        case .missingBlob: return "missing_blob"
        case .blobCorrupt: return "blob_corrupt"
        case .blobLengthMismatch: return "blob_length_mismatch"
        case .corrupt: return "corrupt"
        case .busy: return "busy"
        case .io: return "io"
        case .database: return "database"
        case .noDatabase: return "no_database"
        case .indexUnavailable: return "index_unavailable"
        }
    }

    public var failure: FailureKind {
        switch self {
        case .conflict, .tooManyLeaves: .conflict
        case .notFound, .revisionNotFound, .bodyNotRetained: .notFound
        case .tooLarge: .tooLarge
        case .rejected: .forbidden
        // An I/O error is transient (a full disk, a file briefly locked): try again later.
        case .busy, .io: .unavailable
        case .corrupt, .database, .blobCorrupt: .internalFailure
        case .invalidDocumentID, .invalidBody, .digestMismatch, .invalidHistory, .missingBlob, .blobLengthMismatch,
            .noDatabase, .indexUnavailable:
            .invalidRequest
        }
    }

    /// Refused by the store's validator (a rule of the application, not a malformed revision).
    public var isValidationRefusal: Bool {
        if case .rejected = self { return true }
        return false
    }

    public var isTransient: Bool {
        switch self {
        case .busy, .io: return true
        default: return false
        }
    }

    public var description: String {
        switch self {
        case .conflict(let id, let given, let current):
            switch (given, current) {
            case (nil, let current?):
                return "conflict: document \"\(id)\" not created: it already exists at revision \(current) (update it with that revision)"
            case (let given?, let current?):
                return "conflict: document \"\(id)\" not changed: revision \(given) is not a current revision (the current one is \(current))"
            case (let given?, nil):
                return "conflict: document \"\(id)\" not changed: it has no live revision \(given)"
            case (nil, nil):
                return "conflict: document \"\(id)\" not changed"
            }
        case .notFound(let id): return "not found: no document \"\(id)\""
        case .revisionNotFound(let id, let rev): return "not found: document \"\(id)\" has no revision \(rev)"
        case .bodyNotRetained(let id, let rev):
            return "the body of revision \(rev) of \"\(id)\" is no longer retained (compacted)"
        case .invalidDocumentID(let e): return e.description
        case .invalidBody(let why): return "invalid document body: \(why)"
        case .tooLarge(let bytes, let limit): return "document too large: \(bytes) bytes, the limit is \(limit)"
        case .tooManyLeaves(let id, let limit):
            return "document \"\(id)\" already has \(limit) leaves (conflicting branches), the most allowed: resolve its conflicts first"
        case .digestMismatch(let id, let rev):
            return "revision \(rev) of \"\(id)\" does not match its body (digest mismatch)"
        case .invalidHistory(let id, let why): return "invalid revision history for \"\(id)\": \(why)"
        case .rejected(let id, let reason): return "rejected by validation: \"\(id)\": \(reason)"
        case .missingBlob(let d): return "missing blob \(d): store the blob before the document that refers to it"
        case .blobCorrupt(let d): return "blob \(d) is corrupt: its content does not match its digest"
        case .blobLengthMismatch(let d, let declared, let actual):
            return "blob \(d) has length \(actual), but the document declares \(declared)"
        case .corrupt(let why): return "database is corrupt: \(why)"
        case .busy(let why): return "database is busy: \(why)"
        case .io(let why): return "I/O error: \(why)"
        case .database(let why): return "database error: \(why)"
        case .noDatabase(let dir): return "no Ferry data in \(dir) (check --data; documents are written there by put, import, sync or serve)"
        case .indexUnavailable(let id, let reason): return "index \(id) cannot be read: \(reason)"
        }
    }

    /// A system error number in words; a full disk or a read-only file system also says
    /// what to do about it.
    static func describe(errno code: Int32) -> String {
        let text = String(cString: strerror(code))
        switch code {
        case ENOSPC: return "\(text): \(fullDisk)"
        case EROFS: return "\(text): \(readOnlyFileSystem)"
        default: return text
        }
    }

    /// A Foundation file error in words: its system error when it has one (Foundation's own
    /// text is "The operation could not be completed").
    static func describe(_ error: any Error) -> String {
        let ns = error as NSError
        if let posix = ns.userInfo[NSUnderlyingErrorKey] as? NSError, posix.domain == NSPOSIXErrorDomain {
            return describe(errno: Int32(posix.code))
        }
        if ns.domain == NSPOSIXErrorDomain { return describe(errno: Int32(ns.code)) }
        if ns.domain == NSCocoaErrorDomain, ns.code == NSFileWriteNoPermissionError || ns.code == NSFileReadNoPermissionError {
            return describe(errno: EACCES)
        }
        return ns.localizedDescription
    }

    /// Why this user cannot use `directory`, and what to do.
    static func notOurs(_ directory: String) -> String {
        var info = stat()
        let owner = stat(directory, &info) == 0 ? userName(info.st_uid) : nil
        let me = userName(getuid()) ?? "uid \(getuid())"
        let fix = owner.map { "run ferry as \($0) (sudo -u \($0) ferry …)" } ?? "run ferry as the user that owns it"
        return "user \(me) may not read and write the data directory \(directory)\(owner.map { ", which belongs to \($0)" } ?? ""): \(fix), or pass another --data"
    }

    private static func userName(_ uid: uid_t) -> String? {
        guard let entry = getpwuid(uid), let name = entry.pointee.pw_name else { return nil }
        return String(cString: name)
    }

    static let fullDisk = "the disk holding the data directory is full; free space, then retry"

    static let readOnlyFileSystem =
        "the file system holding the data directory is read-only (mounted read-only, or turned read-only by the kernel "
        + "after a disk error: see dmesg); repair it and make it writable, then restart the node; nothing already stored was changed"

    /// `error`, explained when it is an I/O error of a write to the database at `path` and
    /// that directory's file system refuses writes as read-only (SQLite reports only "disk
    /// I/O error" then). Probed by creating a file: a file system the kernel turned
    /// read-only after an error may still be mounted `rw`, so the mount flags cannot tell.
    static func explainingWrite(_ error: StoreError, path: String) -> StoreError {
        guard case .io = error else { return error }
        let probe = (path as NSString).deletingLastPathComponent + "/.write-probe-\(getpid())"
        let fd = open(probe, O_CREAT | O_EXCL | O_WRONLY, 0o600)
        if fd >= 0 {
            close(fd)
            unlink(probe)
            return error
        }
        return errno == EROFS ? .io(readOnlyFileSystem) : error
    }

    /// Maps any error thrown inside the store to a StoreError.
    static func wrap(_ error: any Error) -> StoreError {
        if let e = error as? StoreError { return e }
        if let e = error as? DatabaseError {
            switch e.resultCode {
            case .SQLITE_BUSY, .SQLITE_LOCKED: return .busy(e.message ?? "\(e)")
            case .SQLITE_CORRUPT, .SQLITE_NOTADB: return .corrupt(e.message ?? "\(e)")
            case .SQLITE_FULL:
                return .io("\(fullDisk) (\(e.message ?? "\(e)")); nothing already stored was changed")
            case .SQLITE_READONLY:
                return .io("the data directory cannot be written (\(e.message ?? "\(e)")): a read-only disk or mount; make it writable, then retry")
            case .SQLITE_IOERR:
                return .io("\(e.message ?? "\(e)") (the disk holding the data directory failed a read or write: see dmesg)")
            default: return .database(e.message ?? "\(e)")
            }
        }
        if let e = error as? RevisionTreeError { return .corrupt(e.description) }
        if let e = error as? any FerryError { return .database(e.description) }
        return .database("\(error)")
    }
}
