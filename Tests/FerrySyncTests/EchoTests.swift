import FerryCore
import FerryStore
import Foundation
import Testing
@testable import FerrySync

/// The echo of a push: a later pull by the same peer database leaves out the feed entries
/// its own push made, and nothing else.
@Suite(.timeLimit(.minutes(10))) struct EchoTests {
    @Test func aPullInALaterSessionLeavesOutTheEchoOfAnEarlierPush() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try writeDocuments(a, prefix: "d", count: 2_000)
        let push = await sync(a, b, direction: .push)
        #expect(push.summary.pushed == 2_000)
        try b.put(docID("from-b"), body: ["n": 1])
        let pull = await sync(a, b, direction: .pull)
        let debug = "\(try b.localDocuments(prefix: "echo/")) last \(try b.lastSequence) from-b \(String(describing: try b.document(docID("from-b"))?.sequence))"
        #expect(pull.summary.pulled == 1, "\(debug)")
        // 2,000 changes entries (id, leaves, sequence) are over 100 KB; the echo costs nothing.
        #expect(pull.summary.bytesReceived < 10_000, "received \(pull.summary.bytesReceived) bytes")
        #expect(try digest(a) == digest(b))
        // Another database pulling from b gets everything.
        let c = try DocumentStore.inMemory()
        let other = await sync(c, b, direction: .pull)
        #expect(other.summary.pulled == 2_001)
    }

    @Test func aPushThatBranchesADocumentRecordsNoEchoSoItsOtherLeafIsPulled() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let base = try a.put(docID("shared"), body: ["v": 0])
        await sync(a, b)
        try a.put(docID("shared"), body: ["v": "a"], parent: base)
        try b.put(docID("shared"), body: ["v": "b"], parent: base)
        try writeDocuments(a, prefix: "clean", count: 50)
        await sync(a, b, direction: .push)
        await sync(a, b, direction: .pull)
        #expect(try a.document(docID("shared"))?.conflicts.count == 1, "the other side's leaf arrived")
        #expect(try digest(a) == digest(b))
    }

    @Test func laterEditsOnTheReceiverAreNotLeftOut() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try writeDocuments(a, prefix: "d", count: 20)
        await sync(a, b, direction: .push)
        // b edits a pushed document: its entry moves past the echo range.
        let current = try #require(try b.document(docID("d-3")))
        try b.put(docID("d-3"), body: ["edited": true], parent: current.revision)
        let pull = await sync(a, b, direction: .pull)
        #expect(pull.summary.pulled == 1)
        #expect(try a.document(docID("d-3"))?.body["edited"] == true)
        #expect(try digest(a) == digest(b))
    }
}

/// Pages whose every entry is left out do not end a one-shot pull early.
@Suite(.timeLimit(.minutes(10))) struct LeftOutPageTests {
    @Test func aOneShotPullReadsPastManyPagesOfHiddenDocuments() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try writeDocuments(b, prefix: "secret", count: 3_500)
        try b.put(docID("public-1"), body: ["n": 1])
        var options = ReplicationResponder.Options()
        options.defaultPolicy = PeerPolicy(read: AccessRule(idPatterns: ["public-*"]), write: .all, mayDelete: true)
        let pull = await sync(a, b, direction: .pull, configure: { $0.batchSize = 50 }, responder: options)
        #expect(pull.summary.pulled == 1, "the document after 70 pages of hidden ones arrives")
        #expect(try a.document(docID("public-1")) != nil)
        #expect(try a.document(docID("secret-0")) == nil)
    }
}
