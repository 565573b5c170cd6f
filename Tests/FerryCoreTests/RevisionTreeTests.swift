import Testing
@testable import FerryCore

/// Builds chains of revision IDs for tree tests.
struct RevisionFactory {
    static func body(_ text: String) -> [UInt8] { JSON.object(["v": .string(text)]).canonicalBytes }

    /// A chain of `count` revisions from `parent`, each with body `tag-n`.
    static func chain(_ count: Int, from parent: RevisionID? = nil, tag: String) -> [RevisionID] {
        var out: [RevisionID] = []
        var p = parent
        for i in 0..<count {
            let r = RevisionID.compute(parent: p, deleted: false, canonicalBody: body("\(tag)-\(i)"))
            out.append(r)
            p = r
        }
        return out
    }
}

@Suite struct RevisionTreeTests {
    func insertChain(_ tree: inout RevisionTree, _ chain: [RevisionID], deletedLast: Bool = false) throws {
        let last = chain.last!
        try tree.insert(
            last, history: chain.dropLast().reversed(), deleted: deletedLast, body: RevisionFactory.body("x"),
            hlc: .zero)
    }

    @Test func insertWithHistoryCreatesAncestorsAndIsIdempotent() throws {
        var tree = RevisionTree()
        let chain = RevisionFactory.chain(4, tag: "a")
        try insertChain(&tree, chain)
        #expect(tree.revisions.count == 4)
        #expect(tree.leaves.map(\.id) == [chain[3]])
        let before = tree
        #expect(try tree.insert(chain[3], history: chain.dropLast().reversed(), deleted: false, body: nil, hlc: .zero) == false)
        #expect(tree == before)
        #expect(tree.history(of: chain[3]) == chain.reversed())
    }

    @Test func inconsistentHistoryIsRejected() throws {
        var tree = RevisionTree()
        let chain = RevisionFactory.chain(3, tag: "a")
        #expect(throws: RevisionTreeError.self) {
            try tree.insert(chain[2], history: [chain[0]], deleted: false, body: nil, hlc: .zero)
        }
        #expect(tree.isEmpty)
    }

    @Test func winnerIsTheSameForEveryInsertionOrder() throws {
        let base = RevisionFactory.chain(2, tag: "base")
        let branchA = RevisionFactory.chain(2, from: base[1], tag: "a")
        let branchB = RevisionFactory.chain(3, from: base[1], tag: "b")
        let branchC = RevisionFactory.chain(3, from: base[1], tag: "c")
        let branchD = RevisionFactory.chain(5, from: base[1], tag: "d")  // longest, but deleted
        let inserts: [([RevisionID], Bool)] = [
            (base + branchA, false), (base + branchB, false), (base + branchC, false), (base + branchD, true),
        ]
        var rng = SeededGenerator(seed: 7)
        var winners = Set<RevisionID>()
        var conflictSets = Set<[RevisionID]>()
        for _ in 0..<50 {
            var tree = RevisionTree()
            for (chain, deleted) in inserts.shuffled(using: &rng) {
                try insertChain(&tree, chain, deletedLast: deleted)
            }
            winners.insert(tree.winner!.id)
            conflictSets.insert(tree.conflicts)
        }
        #expect(winners.count == 1)
        #expect(conflictSets.count == 1)
        // Live beats deleted (branch D is longer but a tombstone), then generation, then digest.
        let expected = [branchB.last!, branchC.last!].max()!
        #expect(winners.first == expected)
        #expect(conflictSets.first?.count == 2)
    }

    @Test func tombstoningTheLoserLeavesOneLiveLeaf() throws {
        var tree = RevisionTree()
        let base = RevisionFactory.chain(1, tag: "base")
        let a = RevisionFactory.chain(1, from: base[0], tag: "a")
        let b = RevisionFactory.chain(1, from: base[0], tag: "b")
        try insertChain(&tree, base + a)
        try insertChain(&tree, base + b)
        #expect(tree.hasConflicts)
        let loser = tree.conflicts[0]
        let tomb = RevisionID.compute(parent: loser, deleted: true, canonicalBody: Array("{}".utf8))
        try tree.addChild(tomb, of: loser, deleted: true, body: Array("{}".utf8), hlc: .zero)
        #expect(!tree.hasConflicts)
        #expect(tree.conflicts.isEmpty)
        #expect(tree.leaves.filter { !$0.deleted }.count == 1)
    }

    @Test func pruningKeepsWinnerAndConflictLeaves() throws {
        var tree = RevisionTree()
        let base = RevisionFactory.chain(10, tag: "base")
        let a = RevisionFactory.chain(8, from: base.last!, tag: "a")
        let b = RevisionFactory.chain(2, from: base.last!, tag: "b")
        try insertChain(&tree, base + a)
        try insertChain(&tree, base + b)
        let winner = tree.winner!.id
        let conflicts = tree.conflicts
        tree.prune(maxDepth: 5)
        #expect(tree.winner?.id == winner)
        #expect(tree.conflicts == conflicts)
        #expect(tree.history(of: a.last!).count == 5)
        #expect(tree.history(of: b.last!).count == 5)
        #expect(tree.revisions.count < 20)
        // The tree still round-trips after pruning re-indexed it.
        #expect(try RevisionTree(encoded: tree.encoded()) == tree)
    }

    @Test func droppingBodiesKeepsLeavesAndNearAncestors() throws {
        var tree = RevisionTree()
        var parent: RevisionID?
        for i in 0..<6 {
            let body = RevisionFactory.body("\(i)")
            let r = RevisionID.compute(parent: parent, deleted: false, canonicalBody: body)
            try tree.addChild(r, of: parent, deleted: false, body: body, hlc: .zero)
            parent = r
        }
        tree.dropBodies(retainingAncestors: 2)
        let withBodies = tree.revisions.filter { $0.body != nil }.map(\.id.generation).sorted()
        #expect(withBodies == [4, 5, 6])
    }

    @Test func commonAncestorIsTheNearestSharedRevision() throws {
        var tree = RevisionTree()
        let base = RevisionFactory.chain(3, tag: "base")
        let a = RevisionFactory.chain(2, from: base.last!, tag: "a")
        let b = RevisionFactory.chain(1, from: base.last!, tag: "b")
        try insertChain(&tree, base + a)
        try insertChain(&tree, base + b)
        #expect(tree.commonAncestor(a.last!, b.last!) == base.last!)
        #expect(tree.commonAncestor(a.last!, base[1]) == base[1])
    }

    @Test func encodingRoundTripsAndRejectsCorruption() throws {
        var tree = RevisionTree()
        let base = RevisionFactory.chain(3, tag: "base")
        try insertChain(&tree, base, deletedLast: true)
        let bytes = tree.encoded()
        #expect(try RevisionTree(encoded: bytes) == tree)
        #expect(throws: RevisionTreeError.self) { try RevisionTree(encoded: bytes.dropLast()) }
        #expect(throws: RevisionTreeError.self) { try RevisionTree(encoded: [UInt8]()) }
        #expect(throws: RevisionTreeError.self) { try RevisionTree(encoded: [9] + bytes.dropFirst()) }
        var rng = SeededGenerator(seed: 3)
        for _ in 0..<200 {
            var mutated = bytes
            mutated[Int.random(in: 0..<mutated.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            _ = try? RevisionTree(encoded: mutated)  // must not crash
        }
    }
}
