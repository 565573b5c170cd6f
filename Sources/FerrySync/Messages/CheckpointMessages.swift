import FerryCore
import FerryStore

// getCheckpoint and setCheckpoint: the peer's copy of a replication's checkpoint.

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
