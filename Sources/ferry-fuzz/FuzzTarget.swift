import FerryBLIP
import FerryCore
import FerryCouchDocuments
import FerryCouch
import FerryNode
import FerryQuery
import FerrySync

/// One decoder that reads bytes from another machine, driven with arbitrary input: each must
/// refuse bad bytes with an error, never trap, hang or leak; some also check a round trip.
enum FuzzTarget: String, CaseIterable, Sendable {
    /// Length-framed byte streams (stdio, Unix sockets), cut at every point the input picks.
    case frames
    /// A sync message envelope (every WebSocket and framed message).
    case message
    /// The JSON parser (every body), with a canonical round trip.
    case json
    /// A JSON delta applied to a base document (pulled and pushed deltas).
    case delta
    /// A batch of revisions with their histories (`revs` and `putRevs` bodies).
    case revisions
    /// A Mango `_find` body, its selector run against a few documents.
    case mango
    /// A CouchDB `multipart/related` body.
    case multipart
    /// A document as a CouchDB client sends it (`_bulk_docs`, `PUT`, `new_edits=false` histories).
    case couchdoc
    /// An invitation code, as typed or pasted into `ferry join`.
    case invitation
    /// A signed group member entry or a member's own address record (join requests and
    /// replicated group documents).
    case member
    /// A node's config file.
    case config
    /// A blob fetch policy, as given on the command line or in the config.
    case blobpolicy
    /// Couchbase Lite's BLIP frames as WebSocket messages arrive (each record: a 2-byte
    /// big-endian length, then that many bytes), through one connection's decoder,
    /// checksum, inflater and assembler; each whole message must survive its own encoding.
    case blip

    /// Runs one input; a thrown error is the expected answer to bad bytes. Traps on a broken invariant.
    func run(_ bytes: [UInt8]) {
        switch self {
        case .frames:
            // The first byte picks the chunk size, so one input covers many cuttings.
            guard let first = bytes.first else { return }
            let step = Int(first % 16) + 1
            var framer = LengthFramer(maximumMessageSize: 1 << 16)
            var i = 1
            while i < bytes.count {
                let chunk = bytes[i..<min(bytes.count, i + step)]
                i += step
                guard let messages = try? framer.feed(chunk) else { return }
                for m in messages { _ = try? Message(decoding: m) }
            }
        case .message:
            guard let m = try? Message(decoding: bytes) else { return }
            // A decoded message encodes back to a message that decodes equal.
            let again = try? Message(decoding: m.encoded())
            precondition(again == m, "a decoded message did not survive its own encoding")
        case .json:
            guard let value = try? JSON.parse(bytes) else { return }
            let canonical = value.canonicalBytes
            guard let reparsed = try? JSON.parse(canonical) else { preconditionFailure("canonical JSON did not parse") }
            precondition(reparsed.canonicalBytes == canonical, "canonical JSON is not stable")
        case .delta:
            // base NUL delta
            let parts = bytes.split(separator: 0, maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, let base = (try? JSON.parse(Array(parts[0])))?.objectValue,
                let delta = try? JSON.parse(Array(parts[1]))
            else { return }
            guard let result = try? JSONDelta.apply(delta, to: base) else { return }
            // The diff of base to the result rebuilds the result.
            let rebuilt = try? JSONDelta.apply(JSONDelta.diff(from: base, to: result), to: base)
            precondition(rebuilt.map { JSON.object($0).canonicalBytes } == JSON.object(result).canonicalBytes, "diff and apply disagree")
        case .revisions:
            guard let batch = try? WireRevision.decodeBatch(bytes) else { return }
            for r in batch {
                _ = try? RevisionID(r.rev)
                for h in r.history { _ = try? RevisionID(h) }
                if !r.isDelta, !r.missing { _ = try? JSON.parse(r.content) }
            }
        case .mango:
            guard let body = try? JSON.parse(bytes), let query = try? MangoQuery(parsing: body) else { return }
            for document in Self.mangoDocuments {
                _ = try? query.selector.evaluate(document)
                _ = query.project(document)
            }
            _ = query.compareForSort(Self.mangoDocuments[0], Self.mangoDocuments[1])
        case .multipart:
            // The first line is the boundary.
            guard let newline = bytes.firstIndex(of: 10) else { return }
            let boundary = String(decoding: bytes[..<newline], as: UTF8.self)
            guard !boundary.isEmpty else { return }
            _ = try? Multipart.parse(Array(bytes[(newline + 1)...]), boundary: boundary)
        case .couchdoc:
            guard let value = try? JSON.parse(bytes) else { return }
            let documents: [JSON]
            if case .array(let list)? = value["docs"] { documents = list } else { documents = [value] }
            for d in documents { _ = try? CouchDocumentInput(parsing: d) }
        case .invitation:
            guard let code = try? InvitationCode(parsing: String(decoding: bytes, as: UTF8.self)) else { return }
            // A parsed code prints back to a code that parses equal.
            precondition((try? InvitationCode(parsing: code.text)) == code, "an invitation code did not survive its own text")
        case .member:
            guard let value = try? JSON.parse(bytes) else { return }
            // The certificate and signature inside are the sender's bytes too.
            if let record = try? MemberAddresses(parsing: value) { _ = try? record.verifySignature() }
            guard let entry = try? MemberEntry(parsing: value) else { return }
            _ = try? entry.verifySignature()
        case .config:
            guard let value = try? JSON.parse(bytes) else { return }
            _ = try? NodeConfiguration.parse(value, file: "fuzz.json")
        case .blobpolicy:
            _ = try? BlobFetchPolicy(parsing: String(decoding: bytes, as: UTF8.self))
        case .blip:
            var connection = BLIPConnection(maxMessageSize: 1 << 20)
            // Replies to this side's first two requests are taken as streams (a blob's), so
            // the input reaches both ways of assembling a reply.
            _ = try? connection.send(.request("getAttachment"), streamingReply: true)
            _ = try? connection.send(.request("getAttachment"), streamingReply: true)
            while (try? connection.nextOutgoing()) != nil {}
            var i = 0
            while i + 2 <= bytes.count {
                let length = Int(bytes[i]) << 8 | Int(bytes[i + 1])
                let end = min(bytes.count, i + 2 + length)
                let record = Array(bytes[(i + 2)..<end])
                i = end
                let received: BLIPConnection.Received?
                do { received = try connection.receiveAny(record) } catch { break }  // the connection fails
                guard case .message(let message) = received else { continue }
                let encoded = try? message.encoded()
                let again = encoded.flatMap { try? BLIPMessage(type: message.type, number: message.number, flags: message.flags, encoded: $0) }
                precondition(again == message, "a decoded BLIP message did not survive its own encoding")
                _ = try? connection.respond(to: message, body: message.body)
                while (try? connection.nextOutgoing()) != nil {}
            }
        }
    }

    static let mangoDocuments: [JSON] = [
        ["_id": "a", "type": "order", "n": 3, "tags": ["x", "y"], "nested": ["k": ["deep": true]]],
        ["_id": "b", "type": "note", "n": -1.5, "text": "Hello, World", "tags": []],
        ["_id": "c", "n": .null, "when": "2026-11-28T00:00:00Z"],
    ]
}
