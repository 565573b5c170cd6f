import FerryCore
import FerryStore
import Foundation
import Testing
@testable import FerrySync

@Suite(.timeLimit(.minutes(10))) struct ConflictResolverTests {
    /// Three peers edit one document concurrently, then sync in a ring until quiet.
    func threePeerConflict(
        resolvers: ResolverSet, edits: [(JSON?, UInt64)]
    ) async throws -> [DocumentStore] {
        let clocks = [TestWallClock(1000), TestWallClock(1000), TestWallClock(1000)]
        let peers = try (0..<3).map { i -> DocumentStore in
            var options = StoreOptions()
            let clock = clocks[i]
            options.wallClock = { clock.now }
            return try DocumentStore.inMemory(options: options)
        }
        let base = try peers[0].put(docID("doc"), body: ["type": "note", "title": "base", "body": "text", "tags": ["a"]])
        for p in peers.dropFirst() { await sync(p, peers[0]) }
        for (i, edit) in edits.enumerated() {
            clocks[i].set(edit.1)
            if let body = edit.0 {
                try peers[i].put(docID("doc"), body: body, parent: base)
            } else {
                try peers[i].delete(docID("doc"), revision: base)
            }
        }
        for _ in 0..<3 {
            for i in 0..<3 {
                await sync(peers[i], peers[(i + 1) % 3]) { $0.resolvers = resolvers }
            }
        }
        return peers
    }

    func expectConverged(_ peers: [DocumentStore]) throws {
        let d0 = try digest(peers[0])
        for p in peers.dropFirst() { #expect(try digest(p) == d0) }
    }

    @Test func defaultKeepsTheConflictVisibleAndIdenticalEverywhere() async throws {
        let peers = try await threePeerConflict(
            resolvers: ResolverSet(),
            edits: [(["type": "note", "title": "A"], 2000), (["type": "note", "title": "B"], 3000), (["type": "note", "title": "C"], 2500)])
        try expectConverged(peers)
        #expect(try peers[0].conflicts(of: docID("doc")).count == 2)
    }

    @Test func deletesWinRemovesTheDocumentEverywhere() async throws {
        let peers = try await threePeerConflict(
            resolvers: ResolverSet(byType: ["note": .deletesWin]),
            edits: [(["type": "note", "title": "A"], 2000), (nil, 1500), (["type": "note", "title": "C"], 2500)])
        try expectConverged(peers)
        for p in peers {
            #expect(try p.document(docID("doc"))?.deleted == true)
            #expect(try p.conflicts(of: docID("doc")).isEmpty)
        }
    }

    @Test func lastWriteWinsKeepsTheLatestEdit() async throws {
        let peers = try await threePeerConflict(
            resolvers: ResolverSet(fallback: .lastWriteWins),
            edits: [(["type": "note", "title": "A"], 2000), (["type": "note", "title": "B"], 3000), (["type": "note", "title": "C"], 2500)])
        try expectConverged(peers)
        for p in peers {
            let doc = try #require(try p.document(docID("doc")))
            #expect(doc.body["title"] == "B")
            #expect(doc.conflicts.isEmpty)
        }
    }

    @Test func mergeCombinesFieldsChangedOnDifferentPeers() async throws {
        let peers = try await threePeerConflict(
            resolvers: ResolverSet(byType: ["note": .merge]),
            edits: [
                (["type": "note", "title": "new title", "body": "text", "tags": ["a"]], 2000),
                (["type": "note", "title": "base", "body": "new body", "tags": ["a"]], 2000),
                (["type": "note", "title": "base", "body": "text", "tags": ["a", "b"]], 2000),
            ])
        try expectConverged(peers)
        let doc = try #require(try peers[0].document(docID("doc")))
        #expect(doc.body == ["type": "note", "title": "new title", "body": "new body", "tags": ["a", "b"]])
        #expect(doc.conflicts.isEmpty)
        // No resolution storm: the tree stays small.
        #expect(try peers[0].revisionTree(docID("doc"))!.revisions.count <= 8)
    }

    @Test func mergeFallsBackToLastWriteWinsWhenTheAncestorBodyIsGone() async throws {
        var options = StoreOptions()
        options.retainedAncestorBodies = 0
        let a = try DocumentStore.inMemory(options: options)
        let b = try DocumentStore.inMemory(options: options)
        let base = try a.put(docID("doc"), body: ["type": "note", "v": 0])
        await sync(a, b)
        try a.put(docID("doc"), body: ["type": "note", "v": 1], parent: base)
        try b.put(docID("doc"), body: ["type": "note", "v": 2], parent: base)
        await sync(a, b) { $0.resolvers = ResolverSet(fallback: .merge) }
        await sync(a, b) { $0.resolvers = ResolverSet(fallback: .merge) }
        #expect(try a.conflicts(of: docID("doc")).isEmpty)
        #expect(try a.document(docID("doc"))?.body["v"] == 2)  // the later edit
        #expect(try b.document(docID("doc"))?.revision == a.document(docID("doc"))?.revision)
    }

    @Test func mergeJoinsTheSameIDCreatedOnTwoPeers() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        try a.put(docID("doc"), body: ["from-a": 1, "shared": "a"])
        try b.put(docID("doc"), body: ["from-b": 2, "shared": "b"])
        await sync(a, b) { $0.resolvers = ResolverSet(fallback: .merge) }
        await sync(a, b) { $0.resolvers = ResolverSet(fallback: .merge) }
        let doc = try #require(try a.document(docID("doc")))
        #expect(doc.conflicts.isEmpty)
        #expect(doc.body["from-a"] == 1 && doc.body["from-b"] == 2)
        #expect(try b.document(docID("doc"))?.revision == doc.revision)
    }

    @Test func aCustomResolverDecides() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let base = try a.put(docID("doc"), body: ["n": 1])
        await sync(a, b)
        try a.put(docID("doc"), body: ["n": 5], parent: base)
        try b.put(docID("doc"), body: ["n": 9], parent: base)
        let sum = ConflictResolver(name: "sum") { ctx in
            .merge(["n": .int(ctx.liveLeaves.compactMap { ctx.body(of: $0)?["n"]?.intValue }.reduce(0, +))])
        }
        await sync(a, b) { $0.resolvers = ResolverSet(fallback: sum) }
        await sync(b, a) { $0.resolvers = ResolverSet(fallback: sum) }
        #expect(try a.document(docID("doc"))?.body == ["n": 14])
        #expect(try digest(a) == digest(b))
    }

    @Test func threeWayMergeTakesEachSidesChanges() {
        let base: [String: JSON] = ["a": 1, "b": 1, "c": ["x": 1, "y": 1], "gone": true]
        let ours: [String: JSON] = ["a": 2, "b": 1, "c": ["x": 2, "y": 1], "gone": true]
        let theirs: [String: JSON] = ["a": 1, "b": 3, "c": ["x": 1, "y": 3], "added": "t"]
        let merged = ThreeWayMerge.merge(base: base, ours: ours, theirs: theirs)
        #expect(merged == ["a": 2, "b": 3, "c": ["x": 2, "y": 3], "added": "t"])
        // Both changed the same field: ours (the better-ranked side) wins.
        #expect(ThreeWayMerge.merge(base: ["k": 1], ours: ["k": 2], theirs: ["k": 3]) == ["k": 2])
    }
}
