import FerryCore
import FerryStore

// The typed requests and replies of the replication protocol (docs/protocol.md §3), one
// file per verb family (HelloMessages, CheckpointMessages, ChangesMessages,
// RevisionMessages, BlobMessages, HeartbeatMessage), each message with its one encoding and
// one decoding. Both the requesting side (`FerryRemote`) and the
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
