import FerryCore
import FerryStore

// hasBlobs, getBlob and putBlob: which blobs a side lacks, and blobs moved in chunks.

/// Asks which blobs the responder lacks; the reply is `HasBlobsReply`. With `blobChunks`,
/// `lengths` gives each blob's length (in the order of `digests`), so the responder may
/// leave a large one to fetch later under a lazy policy.
struct HasBlobsRequest: SyncRequestBody {
    typealias Reply = HasBlobsReply
    static let profile = SyncProtocol.Profile.hasBlobs
    var digests: [BlobDigest]
    var lengths: [Int64]?
    var json: JSON {
        var o: [String: JSON] = ["digests": .array(digests.map { .string($0.description) })]
        if let lengths { o["lengths"] = .array(lengths.map { .int($0) }) }
        return .object(o)
    }
    init(digests: [BlobDigest], lengths: [Int64]? = nil) {
        self.digests = digests
        self.lengths = lengths
    }
    init(_ o: JSON) throws(SyncError) {
        guard case .array(let list)? = o["digests"] else { throw .protocolViolation("hasBlobs lacks digests") }
        var digests: [BlobDigest] = []
        for d in list {
            guard let digest = d.stringValue.flatMap({ try? BlobDigest($0) }) else { throw .protocolViolation("bad blob digest") }
            digests.append(digest)
        }
        self.digests = digests
        if case .array(let given)? = o["lengths"] {
            let lengths = given.compactMap { $0.intValue }.filter { $0 >= 0 }
            guard lengths.count == digests.count else { throw .protocolViolation("hasBlobs lengths do not match its digests") }
            self.lengths = lengths
        }
    }
}

/// The blobs a hasBlobs request named that the responder lacks, and (feature `blobChunks`)
/// how many leading bytes of each it already holds, so a push resumes there.
struct HasBlobsReply: SyncJSONReply {
    var missing: [BlobDigest]
    var partial: [BlobDigest: Int64] = [:]
    var json: JSON {
        var o: [String: JSON] = ["missing": .array(missing.map { .string($0.description) })]
        if !partial.isEmpty {
            o["partial"] = .object(Dictionary(uniqueKeysWithValues: partial.map { ($0.key.description, JSON.int($0.value)) }))
        }
        return .object(o)
    }
    init(missing: [BlobDigest], partial: [BlobDigest: Int64] = [:]) {
        self.missing = missing
        self.partial = partial
    }
    init(_ o: JSON) throws(SyncError) {
        guard case .array(let list)? = o["missing"] else { throw .protocolViolation("hasBlobs reply is malformed") }
        missing = list.compactMap { $0.stringValue.flatMap { try? BlobDigest($0) } }
        // A malformed offset is read as none: the push then starts at byte 0, which is always safe.
        if case .object(let fields)? = o["partial"] {
            for (key, value) in fields {
                if let d = try? BlobDigest(key), let n = value.intValue, n > 0 { partial[d] = n }
            }
        }
    }
}

/// The properties of getBlob and putBlob (docs/protocol.md, hasBlobs / putBlob / getBlob).
enum BlobProperty {
    /// The blob's digest, on both requests.
    static let name = "Digest"
    /// The first byte a chunk carries (getBlob asks for it, putBlob sends from it); decimal.
    static let offset = "Offset"
    /// The most bytes a getBlob asks for; decimal.
    static let length = "Length"
    /// The blob's whole length: on a getBlob reply, and on every putBlob chunk.
    static let total = "Blob-Length"
    /// On a getBlob sent while fetching a deferred blob for another peer ("1"): the
    /// responder answers from its store only, and never fetches a blob deferred there in
    /// turn, so that on-behalf fetches go one hop and never around a cycle.
    static let onBehalf = "On-Behalf"

    /// Set while a deferred blob is fetched on behalf of a peer: the getBlob requests of that
    /// fetch carry `On-Behalf`.
    @TaskLocal static var fetchingOnBehalf = false

    /// A non-negative decimal property, or nil when absent; malformed is a protocol error.
    static func number(_ message: Message, _ name: String) throws(SyncError) -> Int64? {
        guard let text = message[name] else { return nil }
        guard let n = Int64(text), n >= 0 else { throw .protocolViolation("\(name) is not a non-negative integer: \(text.prefix(40))") }
        return n
    }
}

/// The reply to a putBlob chunk: how many leading bytes of the blob the responder now holds
/// (the whole length once the blob is complete and verified).
struct PutBlobReply: Sendable {
    var have: Int64
    var json: JSON { ["have": .int(have)] }
    init(have: Int64) { self.have = have }
    init(_ o: JSON) {
        // An older responder replies `{}` to a whole-blob put: it holds all of it.
        have = o["have"]?.intValue ?? -1
    }
}
