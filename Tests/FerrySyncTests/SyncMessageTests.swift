import FerryCore
import FerryStore
import Foundation
import Testing
@testable import FerrySync

/// The typed messages: each encodes to the bytes docs/protocol.md documents, and decodes back.
@Suite struct SyncMessageTests {
    func text(_ json: JSON) -> String { String(decoding: json.canonicalBytes, as: UTF8.self) }

    @Test func changesRequestsAndRepliesKeepTheDocumentedWireForm() throws {
        var request = ChangesRequest()
        request.since = 7
        request.limit = 100
        request.live = true
        request.timeoutMs = 30000
        request.inline = 4096
        request.noDeltas = true
        request.docIDs = ["a"]
        #expect(text(request.json) == #"{"docIDs":["a"],"inline":4096,"limit":100,"live":true,"noDeltas":true,"since":7,"timeoutMs":30000}"#)
        let back = ChangesRequest(request.json)
        #expect(back.since == 7 && back.limit == 100 && back.live && back.inline == 4096 && back.noDeltas && back.docIDs == ["a"])

        let reply = ChangesReply(
            changes: [ChangeEntry(sequence: 3, id: "d", leaves: ["1-aa"], deleted: false, size: 12, inline: ["hlc": 1])],
            lastSeq: 9, caughtUp: true)
        #expect(text(reply.json) == #"{"caughtUp":true,"changes":[[3,"d",["1-aa"],false,12,{"hlc":1}]],"lastSeq":9}"#)
        let decoded = try ChangesReply(reply.json)
        #expect(decoded.lastSeq == 9 && decoded.caughtUp && decoded.changes.first?.inline == ["hlc": 1])
        #expect(throws: SyncError.self) { try ChangesReply(["changes": [[1, 2]], "lastSeq": 1]) }
    }

    @Test func aRejectionKeepsItsStageAcrossTheWire() {
        let result = PutResult(id: "d", rev: "1-aa", status: .rejected(Rejection(stage: .policy, reason: "this peer may not write \"d\"")))
        #expect(text(result.json) == #"{"id":"d","reason":"policy: this peer may not write \"d\"","rev":"1-aa","status":"rejected"}"#)
        #expect(PutResult(result.json) == result)
        // A reason without a known stage is kept whole.
        #expect(PutResult(["id": "d", "rev": "1-aa", "status": "rejected", "reason": "odd"]).status == .rejected(Rejection(stage: .peer, reason: "odd")))
        #expect(PutResult(["id": "d", "rev": "1-aa", "status": "ok"]).status == .stored)
    }

    @Test func helloAndCheckpointMessagesRoundTrip() throws {
        let hello = HelloRequest(nodeID: "n", database: "db", protocols: [1], features: ["inline"])
        #expect(text(hello.json) == #"{"database":"db","features":["inline"],"nodeID":"n","protocol":[1]}"#)
        #expect(try HelloRequest(hello.json).protocols == [1])
        #expect(throws: SyncError.self) { try HelloRequest(["protocol": [1]]) }
        let reply = HelloReply(nodeID: "m", database: "db2", protocolVersion: 1, features: [], allowPush: false, allowPull: true)
        let back = try HelloReply(reply.json)
        #expect(back.database == "db2" && back.allowPull && !back.allowPush)
        #expect(CheckpointValue(["value": nil]).value == nil)
        #expect(throws: SyncError.self) { try SetCheckpointRequest(["id": "k", "value": 3]) }
    }
}

/// The one owner of a replicator's status.
@Suite struct ReplicationProgressTests {
    @Test func theLastStatusPublishedIsTheCurrentOneUnderConcurrentUpdates() async {
        let progress = ReplicationProgress(metrics: nil, logger: .init(label: "test"), continuous: true)
        let changes = progress.statusBroadcaster.subscribe()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<200 { group.addTask { progress.update { $0.completed += 1 } } }
        }
        progress.finish()
        var last: ReplicatorStatus?
        for await s in changes { last = s }
        #expect(last == progress.status)
        #expect(progress.status.completed == 200)
    }
}
