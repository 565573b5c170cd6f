import FerryCore
import FerryStore

// One file by design (hence its length): every message of the protocol beside its one
// encoding is what both sides, and a second implementation, read.
//
// The typed requests and replies of the replication protocol (docs/protocol.md §3), each
// with its one encoding and one decoding. Both the requesting side (`FerryRemote`) and the
// answering side (`ReplicationResponder`) use these types, so no field is named in two
// places. Decoders are as lenient as the protocol allows (unknown members are ignored,
// optional members take their documented defaults); clamping to limits is the responder's.

/// A request body of the protocol: its profile, its JSON encoding, and the reply it gets.
protocol SyncRequestBody: Sendable {
    associatedtype Reply: SyncReplyBody
    static var profile: String { get }
    var json: JSON { get }
}

/// A reply the requester decodes from the responder's message.
protocol SyncReplyBody: Sendable {
    init(reply: Message) throws(SyncError)
}

/// A reply decoded from its JSON body.
protocol SyncJSONReply: SyncReplyBody {
    init(_ o: JSON) throws(SyncError)
}

extension SyncJSONReply {
    init(reply: Message) throws(SyncError) { try self.init(try reply.json()) }
}

/// The reply of a request answered with success alone (`setCheckpoint`).
struct Acknowledgement: SyncReplyBody {
    init(reply: Message) {}
}

/// The reply of `getRevs`: revisions in the batch encoding (docs/protocol.md), not JSON.
struct RevisionBatch: SyncReplyBody {
    let revisions: [WireRevision]
    init(reply: Message) throws(SyncError) { revisions = try WireRevision.decodeBatch(reply.body) }
}

extension SyncRequestBody {
    var bytes: [UInt8] { json.canonicalBytes }
}

/// The first request: who the requester is and what it speaks.
struct HelloRequest: SyncRequestBody {
    typealias Reply = HelloReply
    static let profile = SyncProtocol.Profile.hello
    var nodeID: String
    var database: String
    var protocols: [Int]
    var features: [String]
    /// The requester's coverage, when it pushes to this peer unfiltered (optional; docs/protocol.md, "Join catch-up").
    var coverage: CoverageSnapshot?

    var json: JSON {
        var o: [String: JSON] = [
            "nodeID": .string(nodeID), "database": .string(database),
            "protocol": .array(protocols.map { .int(Int64($0)) }), "features": .array(features.map { .string($0) }),
        ]
        if let coverage { o["coverage"] = coverage.json }
        return .object(o)
    }

    init(nodeID: String, database: String, protocols: [Int], features: [String], coverage: CoverageSnapshot? = nil) {
        self.nodeID = nodeID
        self.database = database
        self.protocols = protocols
        self.features = features
        self.coverage = coverage
    }

    init(_ o: JSON) throws(SyncError) {
        guard let node = o["nodeID"]?.stringValue, !node.isEmpty else { throw .protocolViolation("hello lacks nodeID") }
        guard case .array(let versions)? = o["protocol"] else { throw .protocolViolation("hello lacks protocol") }
        nodeID = node
        database = o["database"]?.stringValue ?? ""
        protocols = versions.compactMap(\.intValue).map(Int.init)
        features = Self.strings(o["features"])
        coverage = CoverageSnapshot(o["coverage"])
    }

    static func strings(_ value: JSON?) -> [String] {
        guard case .array(let items)? = value else { return [] }
        return items.compactMap(\.stringValue)
    }
}

/// The answer to hello: the responder's identity, the version chosen, and what it allows.
struct HelloReply: SyncJSONReply {
    var nodeID: String
    var database: String
    var protocolVersion: Int
    var features: [String]
    var allowPush: Bool
    var allowPull: Bool
    /// The responder's coverage, when it serves this peer's pulls unrestricted (optional; docs/protocol.md, "Join catch-up").
    var coverage: CoverageSnapshot?
    /// How many documents the responder ever purged for access (optional; absent: none): a
    /// pusher's checkpoint is keyed by it, so what the responder purged is offered again.
    var accessEpoch: Int64?
    /// What the responder's own roles let it hold, as a stable text (optional; absent: every
    /// document): a pusher's checkpoint is keyed by it too, so what the responder refused
    /// before its roles admitted it is offered again once they do.
    var accessStamp: String?

    var json: JSON {
        var o: [String: JSON] = [
            "nodeID": .string(nodeID), "database": .string(database), "protocol": .int(Int64(protocolVersion)),
            "features": .array(features.map { .string($0) }), "allowPush": .bool(allowPush), "allowPull": .bool(allowPull),
        ]
        if let coverage { o["coverage"] = coverage.json }
        if let accessEpoch { o["accessEpoch"] = .int(accessEpoch) }
        if let accessStamp { o["accessStamp"] = .string(accessStamp) }
        return .object(o)
    }

    init(
        nodeID: String, database: String, protocolVersion: Int, features: [String], allowPush: Bool, allowPull: Bool,
        coverage: CoverageSnapshot? = nil
    ) {
        self.nodeID = nodeID
        self.database = database
        self.protocolVersion = protocolVersion
        self.features = features
        self.allowPush = allowPush
        self.allowPull = allowPull
        self.coverage = coverage
    }

    init(_ o: JSON) throws(SyncError) {
        guard let database = o["database"]?.stringValue else { throw .protocolViolation("hello reply lacks database") }
        self.database = database
        nodeID = o["nodeID"]?.stringValue ?? ""
        protocolVersion = Int(o["protocol"]?.intValue ?? 0)
        features = HelloRequest.strings(o["features"])
        allowPush = o["allowPush"] == .bool(true)
        allowPull = o["allowPull"] == .bool(true)
        coverage = CoverageSnapshot(o["coverage"])
        if let e = o["accessEpoch"]?.intValue, e > 0 { accessEpoch = e }
        if let stamp = o["accessStamp"]?.stringValue, !stamp.isEmpty, stamp.utf8.count <= 4096 { accessStamp = stamp }
    }
}

/// Reads the peer's copy of a checkpoint; the reply is `CheckpointValue`.
struct GetCheckpointRequest: SyncRequestBody {
    typealias Reply = CheckpointValue
    static let profile = SyncProtocol.Profile.getCheckpoint
    var id: String
    /// Which way the requester's replication moves documents (optional; absent: unknown).
    var direction: CheckpointDirection?
    var json: JSON {
        var o: [String: JSON] = ["id": .string(id)]
        if let direction { o["direction"] = .string(direction.rawValue) }
        return .object(o)
    }
    init(id: String, direction: CheckpointDirection? = nil) {
        self.id = id
        self.direction = direction
    }
    init(_ o: JSON) throws(SyncError) {
        id = try Self.checkpointID(o)
        direction = try Self.direction(o)
    }

    /// The optional `direction` member: absent is unknown, anything but pull or push is an error.
    static func direction(_ o: JSON) throws(SyncError) -> CheckpointDirection? {
        guard let value = o["direction"], value != .null else { return nil }
        guard let text = value.stringValue, let direction = CheckpointDirection(rawValue: text) else {
            throw .protocolViolation("checkpoint direction must be \"pull\" or \"push\"")
        }
        return direction
    }

    static func checkpointID(_ o: JSON) throws(SyncError) -> String {
        guard let id = o["id"]?.stringValue, !id.isEmpty, id.utf8.count <= 200 else {
            throw .protocolViolation("checkpoint request lacks a valid id")
        }
        return id
    }
}

/// A getCheckpoint reply: the stored object, or nil when there is none, and for a push the
/// sequence of the requester's feed through which the responder already holds everything.
struct CheckpointValue: SyncJSONReply {
    var value: JSON?
    /// Push direction only, optional: the requester may resume its push from here.
    var holds: UInt64?
    var json: JSON {
        var o: [String: JSON] = ["value": value ?? .null]
        if let holds { o["holds"] = .int(Int64(clamping: holds)) }
        return .object(o)
    }
    init(value: JSON?, holds: UInt64? = nil) {
        self.value = value
        self.holds = holds
    }
    init(_ o: JSON) {
        // Spelled out: JSON is ExpressibleByNilLiteral, so a bare `nil` here would be `.null`.
        if let v = o["value"], v != .null { value = v } else { value = Optional<JSON>.none }
        if let n = o["holds"]?.intValue, n > 0 { holds = UInt64(n) } else { holds = nil }
    }
}

/// Writes the peer's copy of a checkpoint; the reply is an empty object.
struct SetCheckpointRequest: SyncRequestBody {
    typealias Reply = Acknowledgement
    static let profile = SyncProtocol.Profile.setCheckpoint
    var id: String
    var value: JSON
    /// As in `GetCheckpointRequest` (optional).
    var direction: CheckpointDirection?
    /// Push only, optional: the requester's feed ended at this checkpoint when it wrote it.
    var caughtUp = false
    /// Push only, optional: revisions the requester left out as relays since its last
    /// checkpoint write (the responder's coverage may not pass them until it holds them),
    /// and whether more were left out than reported.
    var skipped: [SkippedRelay] = []
    var skipsLost = false
    var json: JSON {
        var o: [String: JSON] = ["id": .string(id), "value": value]
        if let direction { o["direction"] = .string(direction.rawValue) }
        if caughtUp { o["caughtUp"] = true }
        SkippedRelay.encode(skipped, lost: skipsLost, into: &o)
        return .object(o)
    }
    init(id: String, value: JSON, direction: CheckpointDirection? = nil, caughtUp: Bool = false) {
        self.id = id
        self.value = value
        self.direction = direction
        self.caughtUp = caughtUp
    }
    init(_ o: JSON) throws(SyncError) {
        id = try GetCheckpointRequest.checkpointID(o)
        direction = try GetCheckpointRequest.direction(o)
        caughtUp = o["caughtUp"] == .bool(true)
        (skipped, skipsLost) = SkippedRelay.decode(o)
        guard let value = o["value"], value.objectValue != nil else {
            throw .protocolViolation("setCheckpoint lacks an object value")
        }
        self.value = value
    }
}

/// Asks for the changes feed after a sequence, once or as a long-poll.
struct ChangesRequest: SyncRequestBody {
    typealias Reply = ChangesReply
    static let profile = SyncProtocol.Profile.changes
    var since: UInt64 = 0
    var limit: Int64 = 200
    var live = false
    var timeoutMs: Int64 = 0
    var docIDs: [String]?
    /// Inline revisions of at most this many bytes (nil: none).
    var inline: Int64?
    var noDeltas = false

    init() {}

    var json: JSON {
        var o: [String: JSON] = [
            "since": .int(Int64(since)), "limit": .int(limit), "live": .bool(live), "timeoutMs": .int(timeoutMs),
        ]
        if let inline { o["inline"] = .int(inline) }
        if noDeltas { o["noDeltas"] = true }
        if let docIDs { o["docIDs"] = .array(docIDs.map { .string($0) }) }
        return .object(o)
    }

    init(_ o: JSON) {
        since = UInt64(max(0, o["since"]?.intValue ?? 0))
        limit = o["limit"]?.intValue ?? 200
        live = o["live"]?.boolValue ?? false
        timeoutMs = o["timeoutMs"]?.intValue ?? 0
        if case .array(let ids)? = o["docIDs"] { docIDs = ids.compactMap(\.stringValue) }
        inline = o["inline"]?.intValue
        noDeltas = o["noDeltas"] == .bool(true)
    }
}

/// One document in a changes reply: `[seq, id, [leafRevs], deleted, size, inline?]`.
struct ChangeEntry: Sendable {
    var sequence: UInt64
    var id: String
    var leaves: [String]
    var deleted: Bool
    var size: Int64
    /// The single leaf's revision in inline form (docs/protocol.md §3, changes).
    var inline: JSON?

    var json: JSON {
        var a: [JSON] = [
            .int(Int64(sequence)), .string(id), .array(leaves.map { .string($0) }), .bool(deleted), .int(size),
        ]
        if let inline { a.append(inline) }
        return .array(a)
    }

    init(sequence: UInt64, id: String, leaves: [String], deleted: Bool, size: Int64, inline: JSON? = nil) {
        self.sequence = sequence
        self.id = id
        self.leaves = leaves
        self.deleted = deleted
        self.size = size
        self.inline = inline
    }

    init(_ value: JSON) throws(SyncError) {
        guard case .array(let f) = value, f.count >= 3, let id = f[1].stringValue, case .array(let revs) = f[2] else {
            throw .protocolViolation("changes entry is malformed")
        }
        self.init(
            sequence: UInt64(max(0, f[0].intValue ?? 0)), id: id, leaves: revs.compactMap(\.stringValue),
            deleted: f.count > 3 ? f[3] == .bool(true) : false, size: f.count > 4 ? f[4].intValue ?? 0 : 0,
            inline: f.count > 5 ? Optional(f[5]) : Optional<JSON>.none)
    }
}

/// A changes reply: the entries, how far the feed was read, and whether it ended there.
struct ChangesReply: SyncJSONReply {
    var changes: [ChangeEntry]
    var lastSeq: UInt64
    var caughtUp: Bool
    /// Revisions of the page left out as relays (only to a requester whose hello lists
    /// `skipReports`), and whether more were left out than reported.
    var skipped: [SkippedRelay] = []
    var skipsLost = false
    /// How many changes follow this page in the feed (catching-up pages of an unfiltered,
    /// unrestricted feed only): a progress bar's total. Optional; older peers send none.
    var pending: Int?
    /// Documents the requester may no longer read (to a requester listing `accessRemoval`).
    var removed: [RemovalNotice] = []

    var json: JSON {
        var o: [String: JSON] = ["changes": .array(changes.map(\.json)), "lastSeq": .int(Int64(lastSeq))]
        if caughtUp { o["caughtUp"] = true }
        if let pending { o["pending"] = .int(Int64(pending)) }
        SkippedRelay.encode(skipped, lost: skipsLost, into: &o)
        RemovalNotice.encode(removed, into: &o)
        return .object(o)
    }

    init(changes: [ChangeEntry], lastSeq: UInt64, caughtUp: Bool) {
        self.changes = changes
        self.lastSeq = lastSeq
        self.caughtUp = caughtUp
    }

    init(_ o: JSON) throws(SyncError) {
        guard case .array(let entries)? = o["changes"], let last = o["lastSeq"]?.intValue else {
            throw .protocolViolation("changes reply is malformed")
        }
        var changes: [ChangeEntry] = []
        changes.reserveCapacity(entries.count)
        for e in entries { changes.append(try ChangeEntry(e)) }
        self.init(changes: changes, lastSeq: UInt64(max(0, last)), caughtUp: o["caughtUp"] == .bool(true))
        (skipped, skipsLost) = SkippedRelay.decode(o)
        if let p = o["pending"]?.intValue, p >= 0 { pending = Int(min(p, Int64(Int.max))) }
        removed = RemovalNotice.decode(o)
    }
}

/// One revision asked for, with the ancestors the requester holds with bodies (delta bases).
package struct RevisionRequest: Sendable, Equatable {
    package var id: DocumentID
    package var rev: RevisionID
    package var ancestors: [RevisionID]

    package var json: JSON {
        ["id": .string(id.rawValue), "rev": .string(rev.description), "ancestors": .array(ancestors.map { .string($0.description) })]
    }

    package init(id: DocumentID, rev: RevisionID, ancestors: [RevisionID]) {
        self.id = id
        self.rev = rev
        self.ancestors = ancestors
    }
}

/// Fetches revisions; the reply is a revision batch (`WireRevision.decodeBatch`).
struct GetRevsRequest: SyncRequestBody {
    typealias Reply = RevisionBatch
    static let profile = SyncProtocol.Profile.getRevs
    var revs: [RevisionRequest]
    var deltas: Bool
    var maxHistory: Int64

    var json: JSON { ["revs": .array(revs.map(\.json)), "deltas": .bool(deltas), "maxHistory": .int(maxHistory)] }

    init(revs: [RevisionRequest], deltas: Bool, maxHistory: Int64) {
        self.revs = revs
        self.deltas = deltas
        self.maxHistory = maxHistory
    }

    init(_ o: JSON) throws(SyncError) {
        guard case .array(let wanted)? = o["revs"] else { throw .protocolViolation("getRevs lacks revs") }
        var revs: [RevisionRequest] = []
        for w in wanted {
            guard let id = w["id"]?.stringValue.flatMap({ try? DocumentID($0, allowReserved: true) }),
                let rev = w["rev"]?.stringValue.flatMap({ try? RevisionID($0) })
            else { throw .protocolViolation("getRevs entry is malformed") }
            revs.append(RevisionRequest(id: id, rev: rev, ancestors: Self.revisions(w["ancestors"])))
        }
        self.init(revs: revs, deltas: o["deltas"]?.boolValue ?? false, maxHistory: o["maxHistory"]?.intValue ?? 100)
    }

    /// The valid revision IDs of a JSON array; others are skipped.
    static func revisions(_ value: JSON?) -> [RevisionID] {
        guard case .array(let items)? = value else { return [] }
        return items.compactMap { $0.stringValue.flatMap { try? RevisionID($0) } }
    }
}

/// Asks which of these leaf revisions the responder lacks.
struct RevsDiffRequest: SyncRequestBody {
    typealias Reply = RevsDiffReply
    static let profile = SyncProtocol.Profile.revsDiff
    var docs: [DocumentID: [RevisionID]]

    var json: JSON {
        .object(["docs": .object(Dictionary(uniqueKeysWithValues: docs.map { ($0.rawValue, .array($1.map { .string($0.description) })) }))])
    }

    init(docs: [DocumentID: [RevisionID]]) { self.docs = docs }

    init(_ o: JSON) throws {
        guard let docs = o["docs"]?.objectValue else { throw SyncError.protocolViolation("revsDiff lacks docs") }
        var query: [DocumentID: [RevisionID]] = [:]
        for (id, revs) in docs {
            guard let docID = try? DocumentID(id, allowReserved: true), case .array(let list) = revs else {
                throw SyncError.protocolViolation("revsDiff entry for \"\(id)\" is malformed")
            }
            query[docID] = try list.map { try RevisionID($0.stringValue ?? "") }
        }
        self.docs = query
    }
}

/// Of one document's leaf revisions, those the other side lacks, and the older revisions
/// it holds with bodies (candidate delta bases).
package struct MissingRevisions: Sendable, Equatable {
    package var missing: [RevisionID]
    package var possibleAncestors: [RevisionID]

    package init(missing: [RevisionID], possibleAncestors: [RevisionID]) {
        self.missing = missing
        self.possibleAncestors = possibleAncestors
    }
}

/// A revsDiff reply: per document with something missing, what and which held ancestors.
struct RevsDiffReply: SyncJSONReply {
    var entries: [DocumentID: MissingRevisions]

    var json: JSON {
        .object(
            Dictionary(
                uniqueKeysWithValues: entries.map { id, e in
                    (
                        id.rawValue,
                        JSON.object([
                            "missing": .array(e.missing.map { .string($0.description) }),
                            "ancestors": .array(e.possibleAncestors.map { .string($0.description) }),
                        ])
                    )
                }))
    }

    init(entries: [DocumentID: MissingRevisions]) { self.entries = entries }

    init(store answer: [DocumentID: RevsDiffEntry]) {
        entries = answer.mapValues { MissingRevisions(missing: $0.missing, possibleAncestors: $0.possibleAncestors) }
    }

    init(_ o: JSON) throws(SyncError) {
        guard let answer = o.objectValue else { throw .protocolViolation("revsDiff reply is malformed") }
        var entries: [DocumentID: MissingRevisions] = [:]
        for (key, entry) in answer {
            guard let id = try? DocumentID(key, allowReserved: true), case .array? = entry["missing"] else { continue }
            entries[id] = MissingRevisions(
                missing: GetRevsRequest.revisions(entry["missing"]), possibleAncestors: GetRevsRequest.revisions(entry["ancestors"]))
        }
        self.entries = entries
    }
}

/// What became of one pushed revision.
package enum PutStatus: Sendable, Equatable {
    case stored
    case exists
    /// Refused at the receiver's trust boundary, at a typed stage.
    case rejected(Rejection)
    /// A delta the receiver could not apply: send the full body.
    case needFull
}

/// One entry of a putRevs reply.
package struct PutResult: Sendable, Equatable {
    package var id: String
    package var rev: String
    package var status: PutStatus

    /// `{"id","rev","status","reason"?}`; a rejection's reason is `stage: text` on the wire.
    package var json: JSON {
        var o: [String: JSON] = ["id": .string(id), "rev": .string(rev)]
        switch status {
        case .stored: o["status"] = "ok"
        case .exists: o["status"] = "exists"
        case .needFull: o["status"] = "needFull"
        case .rejected(let r):
            o["status"] = "rejected"
            o["reason"] = .string(r.description)
        }
        return .object(o)
    }

    package init(id: String, rev: String, status: PutStatus) {
        self.id = id
        self.rev = rev
        self.status = status
    }

    package init(_ o: JSON) {
        id = o["id"]?.stringValue ?? ""
        rev = o["rev"]?.stringValue ?? ""
        switch o["status"]?.stringValue {
        case "ok": status = .stored
        case "exists": status = .exists
        case "needFull": status = .needFull
        default: status = .rejected(Rejection(wireText: o["reason"]?.stringValue))
        }
    }
}

/// A putRevs reply: one result per pushed revision, in request order.
struct PutRevsReply: Sendable {
    var results: [PutResult]
    var json: JSON { ["results": .array(results.map(\.json))] }
    init(results: [PutResult]) { self.results = results }
    init(_ o: JSON) throws(SyncError) {
        guard case .array(let results)? = o["results"] else { throw .protocolViolation("putRevs reply does not answer every revision") }
        self.results = results.map(PutResult.init)
    }
}

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

extension Rejection {
    /// Reads the `stage: text` form a putRevs reply carries; a reason without a known
    /// stage is kept whole, at stage `peer`.
    init(wireText: String?) {
        guard let text = wireText else {
            self.init(stage: .peer, reason: "refused by peer")
            return
        }
        if let colon = text.firstIndex(of: ":"), let stage = Stage(rawValue: String(text[..<colon])) {
            var rest = text[text.index(after: colon)...]
            if rest.first == " " { rest = rest.dropFirst() }
            self.init(stage: stage, reason: String(rest))
        } else {
            self.init(stage: .peer, reason: text)
        }
    }
}

/// The no-reply `heartbeat` request (docs/protocol.md §3): sent on an idle connection, and
/// at once when the sender's live links changed, which it then lists. An empty body says
/// nothing but "alive".
struct HeartbeatMessage: Sendable, Equatable {
    static let profile = SyncProtocol.Profile.heartbeat
    /// The node IDs of the sender's live full links, sorted; nil when unchanged since its last heartbeat.
    var links: [String]?
    /// Whether the sender's half of this connection replicates every document both ways; sent with `links`.
    var full: Bool?
    /// The version of the group's access rules at the sender (absent without rules); sent with `full`.
    var rules: String?
    /// Whether the sender's half replicates, both ways, every document those rules grant the
    /// peer, with nothing narrowed by hand; sent (true only) with `full`.
    var grant = false
    /// The sender's content digest (as `GET /` shows it) as of its latest commit; sent when
    /// it changed since the sender's last heartbeat on this connection (anti-entropy).
    var digest: String?
    /// The digest last sent no longer describes the sender's store, and no new one is known
    /// yet (wire: `"digest": null`): the receiver forgets it.
    var digestUnknown = false
    /// The sender's digest over the documents both ends may read under the group's rules
    /// (sent on a link under the rules in place of `digest`); same rules as `digest`.
    var view: String?
    /// As `digestUnknown`, for `view` (wire: `"view": null`).
    var viewUnknown = false

    init(links: [String]? = nil, full: Bool? = nil, digest: String? = nil) {
        self.links = links
        self.full = full
        self.digest = digest
    }

    /// Empty when there is nothing to say beyond "alive".
    var bytes: [UInt8] {
        var o: [String: JSON] = [:]
        if let links { o["links"] = .array(links.map { .string($0) }) }
        if let full { o["full"] = .bool(full) }
        if let rules { o["rules"] = .string(rules) }
        if grant { o["grant"] = true }
        if let digest { o["digest"] = .string(digest) } else if digestUnknown { o["digest"] = .null }
        if let view { o["view"] = .string(view) } else if viewUnknown { o["view"] = .null }
        return o.isEmpty ? [] : JSON.object(o).canonicalBytes
    }

    init(body: [UInt8]) throws(SyncError) {
        guard !body.isEmpty else { return }
        let o: JSON
        do { o = try JSON.parse(body) } catch { throw .protocolViolation("heartbeat body is not JSON") }
        guard case .object = o else { throw .protocolViolation("heartbeat body is not a JSON object") }
        switch o["links"] {
        case nil: break
        case .array(let items)?:
            var ids: [String] = []
            for item in items {
                guard let id = item.stringValue else { throw .protocolViolation("heartbeat links must be strings") }
                ids.append(id)
            }
            links = ids
        default: throw .protocolViolation("heartbeat links must be an array")
        }
        switch o["full"] {
        case nil: break
        case .bool(let b)?: full = b
        default: throw .protocolViolation("heartbeat full must be a boolean")
        }
        switch o["rules"] {
        case nil: break
        case .string(let v)? where !v.isEmpty && v.utf8.count <= 128: rules = v
        default: throw .protocolViolation("heartbeat rules must be a string of 1 to 128 bytes")
        }
        switch o["grant"] {
        case nil: break
        case .bool(let b)?: grant = b
        default: throw .protocolViolation("heartbeat grant must be a boolean")
        }
        switch o["digest"] {
        case nil: break
        case .string(let d)? where !d.isEmpty && d.utf8.count <= 128: digest = d
        case .null?: digestUnknown = true
        default: throw .protocolViolation("heartbeat digest must be null or a string of at most 128 bytes")
        }
        switch o["view"] {
        case nil: break
        case .string(let d)? where !d.isEmpty && d.utf8.count <= 128: view = d
        case .null?: viewUnknown = true
        default: throw .protocolViolation("heartbeat view must be null or a string of at most 128 bytes")
        }
    }
}
