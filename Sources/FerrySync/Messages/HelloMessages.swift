import FerryCore
import FerryStore

// hello: who the requester is and what each side speaks (docs/protocol.md §3).

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
