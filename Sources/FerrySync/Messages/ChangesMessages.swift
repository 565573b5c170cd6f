import FerryCore
import FerryStore

// changes: the feed after a sequence, once or as a long-poll, and its entries.

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
