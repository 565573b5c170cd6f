import FerryCore
import Testing

/// Trees with many leaves (replicated conflicts): lookups, leaf counts and the encoding stay
/// exact past the size where the tree indexes its revisions by ID.
@Suite struct WideRevisionTreeTests {
    static let root = RevisionID.compute(parent: nil, deleted: false, canonicalBody: Array("{\"root\":1}".utf8))

    static func leaf(_ i: Int) -> RevisionID {
        RevisionID.compute(parent: root, deleted: false, canonicalBody: Array("{\"leaf\":\(i)}".utf8))
    }

    static func wideTree(_ n: Int) throws -> RevisionTree {
        var tree = RevisionTree()
        try tree.insert(root, history: [], deleted: false, body: Array("{\"root\":1}".utf8), hlc: .zero)
        for i in 0..<n {
            try tree.insert(leaf(i), history: [root], deleted: false, body: Array("{\"leaf\":\(i)}".utf8), hlc: .zero)
        }
        return tree
    }

    @Test func aWideTreeFindsEveryRevisionAndCountsItsLeaves() throws {
        let tree = try Self.wideTree(500)
        #expect(tree.revisions.count == 501)
        #expect(tree.leafCount == 500)
        #expect(tree.leaves.count == 500)
        for i in 0..<500 {
            let id = Self.leaf(i)
            #expect(tree.index(of: id).map { tree.revisions[$0].id } == id)
        }
        #expect(tree.index(of: Self.root) == 0)
        #expect(!tree.contains(Self.leaf(500)))
        #expect(tree.conflicts.count == 499)
    }

    @Test func extendingALeafKeepsTheLeafCountAndABranchAddsOne() throws {
        var tree = try Self.wideTree(200)
        #expect(!tree.addsLeaf(history: [Self.leaf(7)]))
        #expect(tree.addsLeaf(history: [Self.root]))
        #expect(tree.addsLeaf(history: []))
        let child = RevisionID.compute(parent: Self.leaf(7), deleted: false, canonicalBody: Array("{}".utf8))
        try tree.insert(child, history: [Self.leaf(7)], deleted: false, body: Array("{}".utf8), hlc: .zero)
        #expect(tree.leafCount == 200)
        #expect(tree.index(of: child) == 201)
        // A history whose newest ancestors are unknown attaches below the nearest known one.
        let far = RevisionID(generation: 5, ferryDigestBytes: Array(repeating: 1, count: 32))
        let gap = [RevisionID(generation: 4, ferryDigestBytes: Array(repeating: 2, count: 32)), child]
        #expect(!tree.addsLeaf(history: gap))
        try tree.insert(far, history: gap, deleted: false, body: Array("{}".utf8), hlc: .zero)
        #expect(tree.leafCount == 200)
        #expect(tree.history(of: far) == [far] + gap + [Self.leaf(7), Self.root])
    }

    @Test func aWideTreeSurvivesEncodingAndPruning() throws {
        var tree = try Self.wideTree(300)
        let decoded = try RevisionTree(encoded: tree.encoded())
        #expect(decoded == tree)
        #expect(decoded.leafCount == 300)
        #expect(decoded.index(of: Self.leaf(299)) == 300)
        // Pruning renumbers revisions: lookups must follow.
        var deep = tree.revisions[1].id
        for g in 0..<5 {
            let next = RevisionID.compute(parent: deep, deleted: false, canonicalBody: Array("{\"g\":\(g)}".utf8))
            try tree.insert(next, history: tree.history(of: deep), deleted: false, body: Array("{\"g\":\(g)}".utf8), hlc: .zero)
            deep = next
        }
        tree.prune(maxDepth: 2)
        #expect(tree.leafCount == 300)
        for i in 1..<300 { #expect(tree.index(of: Self.leaf(i)).map { tree.revisions[$0].id } == Self.leaf(i)) }
        #expect(tree.index(of: deep).map { tree.revisions[$0].id } == deep)
        #expect(!tree.contains(Self.leaf(0)))
    }

    @Test func aSmallTreeAndAWideOneAnswerAlike() throws {
        let small = try Self.wideTree(3)
        #expect(small.leafCount == 3)
        #expect(small.index(of: Self.leaf(2)) == 3)
        #expect(small.index(of: Self.leaf(3)) == nil)
    }
}
