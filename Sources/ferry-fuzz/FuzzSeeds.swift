#if !FUZZING
import FerryBLIP
import FerryCore
import FerryNode
import FerrySync
import FerryTransport
import Foundation

/// The seed corpora, made by Ferry's own encoders so they follow the formats as they change
/// (`ferry-fuzz seeds Fuzz/corpus` rewrites them).
enum FuzzSeeds {
    static var all: [(FuzzTarget, [(String, [UInt8])])] {
        FuzzTarget.allCases.map { ($0, seeds(for: $0)) }
    }

    static func text(_ s: String) -> [UInt8] { Array(s.utf8) }

    static let messages: [Message] = [
        Message(kind: .request, number: 1, properties: [("Profile", "getCheckpoint"), ("client", "abc")]),
        Message(kind: .response, number: 7, properties: [("Profile", "changes")], body: text(#"[[1,"doc-1","1-abc"],[2,"doc-2","2-def"]]"#)),
        Message(kind: .request, number: 9, flags: Message.flagNoReply, properties: [("Profile", "heartbeat")], body: text(#"{"digest":"00ff"}"#)),
        Message(
            kind: .request, number: 12,
            properties: [("Profile", "putBlob"), ("Digest", "sha256-" + String(repeating: "ab", count: 32)), ("Offset", "262144"), ("Blob-Length", "1048576")],
            body: Array(repeating: 0x5a, count: 64)),
        Message(kind: .error, number: 3, properties: [("Error-Code", "rejected")], body: text("refused by pull filter")),
    ]

    static func seeds(for target: FuzzTarget) -> [(String, [UInt8])] {
        switch target {
        case .frames:
            return messages.enumerated().map { i, m in
                ("frames-\(i)", [UInt8(i * 5 + 1)] + LengthFramer.frame(m.encoded()) + LengthFramer.frame(messages[0].encoded()))
            }
        case .message:
            return messages.enumerated().map { i, m in ("message-\(i)", m.encoded()) }
        case .json:
            return [
                ("object", text(#"{"a":1,"b":[true,false,null],"c":{"d":"é\u00e9\ud83d\ude00"},"e":-0.5e-3}"#)),
                ("numbers", text("[0,-1,1.5,1e308,-9007199254740993,123456789012345678901234567890]")),
                ("deep", text(String(repeating: "[", count: 40) + String(repeating: "]", count: 40))),
                ("strings", text(#"["\"\\\/\b\f\n\r\t","\u0000",""]"#)),
            ]
        case .delta:
            let base: [String: JSON] = ["name": "pump", "parts": ["a", "b"], "spec": ["rpm": 1200, "v": 24], "old": true]
            let target: [String: JSON] = ["name": "pump 2", "parts": ["a", "b", "c"], "spec": ["rpm": 1500, "v": 24], "new": .null]
            return [
                ("change", JSON.object(base).canonicalBytes + [0] + JSONDelta.diff(from: base, to: target).canonicalBytes),
                ("empty", text("{}") + [0] + JSONDelta.diff(from: [:], to: base).canonicalBytes),
            ]
        case .revisions:
            let body = JSON.object(["title": "manual", "pages": 12]).canonicalBytes
            let full = WireRevision(
                id: "doc-1", rev: "2-" + String(repeating: "c", count: 64), history: ["1-" + String(repeating: "b", count: 64)],
                deleted: false, hlc: 1_700_000_000_000, content: body, deltaBase: nil)
            var delta = full
            delta.deltaBase = "1-" + String(repeating: "b", count: 64)
            delta.content = text(#"{"pages":13}"#)
            var deleted = full
            deleted.deleted = true
            deleted.content = text("{}")
            return [
                ("batch", WireRevision.encodeBatch([full, delta, deleted])),
                ("missing", WireRevision.encodeBatch([WireRevision.missing(id: "gone", rev: "3-abc")])),
            ]
        case .mango:
            return [
                ("find", text(#"{"selector":{"type":"order","n":{"$gt":1}},"fields":["_id","n"],"sort":[{"n":"desc"}],"limit":10}"#)),
                ("operators", text(#"{"selector":{"$or":[{"tags":{"$elemMatch":{"$eq":"x"}}},{"text":{"$regex":"^Hel+o"}},{"n":{"$in":[1,2,3]}},{"nested.k.deep":{"$exists":true}},{"n":{"$mod":[2,1]}},{"tags":{"$size":0}},{"$not":{"when":{"$type":"string"}}}]}}"#)),
                ("all", text(#"{"selector":{"$and":[{"_id":{"$gte":null}},{"tags":{"$all":["x"]}}]},"use_index":"by-n","bookmark":"nil"}"#)),
            ]
        case .multipart:
            let body = "b0undary\n--b0undary\r\nContent-Type: application/json\r\n\r\n"
                + #"{"_id":"scan","_rev":"1-abc","_attachments":{"x.png":{"follows":true,"content_type":"image/png","length":5}}}"#
                + "\r\n--b0undary\r\nContent-Disposition: attachment; filename=\"x.png\"\r\nContent-Type: image/png\r\n\r\nhello\r\n--b0undary--\r\n"
            return [("related", text(body))]
        case .couchdoc:
            return [
                ("bulk", text(#"{"docs":[{"_id":"a","_rev":"3-ccc","_revisions":{"start":3,"ids":["ccc","bbb","aaa"]},"v":1},{"_id":"b","_deleted":true},{"_id":"c","_attachments":{"t.txt":{"content_type":"text/plain","data":"aGVsbG8="},"s.bin":{"stub":true,"digest":"md5-XrY7u+Ae7tCTyyK7j1rNww==","length":5}}}],"new_edits":false}"#)),
                ("plain", text(#"{"_id":"_local/x","_conflicts":[],"name":"y"}"#)),
            ]
        case .invitation:
            let code = InvitationCode(inviter: String(repeating: "a1", count: 32), secret: Array(0..<32), addresses: ["192.168.1.20:4985", "[fe80::1]:4985"])
            return [("code", text(code.text))]
        case .member:
            let directory = NSTemporaryDirectory() + "ferry-fuzz-seed-\(getpid())"
            defer { try? FileManager.default.removeItem(atPath: directory) }
            guard let identity = try? NodeIdentity.loadOrCreate(directory: directory, name: "seed"),
                let entry = try? MemberEntry.signed(
                    group: identity.nodeID, node: identity.nodeID, name: "ward-a", state: .member, admin: true, version: 1,
                    addresses: ["10.0.0.2:4985"], by: identity),
                let record = try? MemberAddresses.signed(group: identity.nodeID, addresses: ["10.0.0.2:5104", "[fe80::1]:5104"], version: 1, by: identity)
            else { return [] }
            return [("signed", entry.body.canonicalBytes), ("addresses", record.body.canonicalBytes)]
        case .config:
            return [
                ("config", text(#"{"name":"ward-a","port":4985,"peers":[{"url":"wss://10.0.0.3:4985","id":"\#(String(repeating: "ab", count: 32))"}],"blobs":{"fetch":"lazy","peers":{}},"replications":[{"id":"up","target":"http://127.0.0.1:5984/ferry","direction":"push","blobs":"16MB"}]}"#)),
            ]
        case .blobpolicy:
            return [("eager", text("eager")), ("lazy", text("lazy")), ("size", text("16MB"))]
        case .blip:
            // What Couchbase Lite sends first: checkpoints, a subscription, a proposal, and a
            // compressed revision long enough to take several frames.
            var sender = BLIPConnection(maxFrameData: 4096)
            let requests: [BLIPMessage] = [
                .request("getCheckpoint", [("client", "cp-HN33UiKlSjIJA3tN212s1QplZE4=")]),
                .request("subChanges", [("batch", "200"), ("versioning", "rev-trees"), ("activeOnly", "true")]),
                .request("proposeChanges", [("conflictIncludesRev", "true")], body: text(#"[["doc-1","1-991913d984f1443ab2a02b89af78aa89a9f154ee"]]"#)),
                .request("rev", [("id", "doc-1"), ("rev", "2-ab"), ("history", "1-cd")],
                    body: text("{\"text\":\"" + String(repeating: "ward round ", count: 900) + "\"}"), flags: [.compressed]),
            ]
            var records: [UInt8] = []
            for r in requests { try? sender.send(r) }
            // And the app's reply to the node's first request, a blob's content over several frames.
            try? sender.send(BLIPMessage(type: .response, number: 1, properties: [("Content-Type", "image/jpeg")], body: (0..<12_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }))
            while let frame = try? sender.nextOutgoing() {
                records += [UInt8(frame.count >> 8), UInt8(frame.count & 0xFF)] + frame
            }
            return [("session", records), ("first", Array(records.prefix(2 + (Int(records[0]) << 8 | Int(records[1])))))]
        }
    }
}
#endif
