import Testing
@testable import FerryCore

@Suite struct RevisionTreeEncodingVersionTests {
    /// Eight little-endian bytes of an HLC value.
    func hlc(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> (8 * UInt64($0))) } }

    /// A two-revision tree as version 1 wrote it, byte by byte: 1-11…11 (no body) and its
    /// leaf child 2-22…22 with body `{}`.
    var versionOneFixture: [UInt8] {
        [1, 2]
            + [1] + [UInt8](repeating: 0x11, count: 32) + [0, 0] + hlc(5)
            + [2] + [UInt8](repeating: 0x22, count: 32) + [1, 6] + hlc(7) + [2] + Array("{}".utf8)
    }

    @Test func versionOneTreesStillDecode() throws {
        let tree = try RevisionTree(encoded: versionOneFixture)
        #expect(tree.revisions.map(\.id.description) == ["1-" + String(repeating: "11", count: 32), "2-" + String(repeating: "22", count: 32)])
        #expect(tree.revisions[1].parent == 0)
        #expect(tree.revisions[0].hlc.rawValue == 5)
        #expect(tree.revisions[1].body == Array("{}".utf8))
        #expect(tree.winner?.id.isFerryDigest == true)
    }

    @Test func ferryOnlyTreesAreStillWrittenAsVersionOneByteForByte() throws {
        let tree = try RevisionTree(encoded: versionOneFixture)
        #expect(tree.encoded() == versionOneFixture)
    }

    /// 1-<32 hex> and its leaf child 2-abc, as version 2 writes them.
    var versionTwoFixture: [UInt8] {
        [2, 2]
            + [1, 1] + Hex.decode("9c65296036141e575d32ba9c034dd3ee")! + [0, 0] + hlc(0)
            + [2, 2, 3] + Array("abc".utf8) + [1, 6] + hlc(9) + [2] + Array("{}".utf8)
    }

    @Test func treesHoldingForeignIDsAreWrittenAsVersionTwo() throws {
        var tree = RevisionTree()
        try tree.insert(
            try RevisionID("2-abc"), history: [try RevisionID("1-9C65296036141E575D32BA9C034DD3EE")], deleted: false,
            body: Array("{}".utf8), hlc: HLCTimestamp(rawValue: 9))
        #expect(tree.encoded() == versionTwoFixture)
        let decoded = try RevisionTree(encoded: versionTwoFixture)
        #expect(decoded == tree)
        #expect(decoded.revisions.map(\.id.description) == ["1-9c65296036141e575d32ba9c034dd3ee", "2-abc"])
    }

    @Test func aMixedTreeRoundTripsEveryForm() throws {
        var tree = RevisionTree()
        let foreign = [try RevisionID("1-9c65296036141e575d32ba9c034dd3ee"), try RevisionID("2-" + String(repeating: "z", count: 128))]
        try tree.insert(foreign[1], history: [foreign[0]], deleted: false, body: Array("{}".utf8), hlc: .zero)
        let child = RevisionID.compute(parent: foreign[1], deleted: false, canonicalBody: Array("{}".utf8))
        try tree.addChild(child, of: foreign[1], deleted: false, body: Array("{}".utf8), hlc: .zero)
        try tree.insert(try RevisionID("2-sha1-like"), history: [foreign[0]], deleted: true, body: Array("{}".utf8), hlc: .zero)
        let bytes = tree.encoded()
        #expect(bytes[0] == 2)
        let decoded = try RevisionTree(encoded: bytes)
        #expect(decoded == tree)
        #expect(decoded.revisions.map(\.id.form) == tree.revisions.map(\.id.form))
        #expect(decoded.winner?.id == child)
    }

    @Test func corruptVersionTwoEncodingsAreRefused() throws {
        let good = versionTwoFixture
        // An unknown form byte.
        var badForm = good
        badForm[3] = 7
        #expect(throws: RevisionTreeError.self) { try RevisionTree(encoded: badForm) }
        func withText(_ text: [UInt8]) -> [UInt8] {
            [2, 1, 1, 2, UInt8(text.count)] + text + [0, 4] + hlc(0)
        }
        #expect(try RevisionTree(encoded: withText(Array("abc".utf8))).revisions[0].id.description == "1-abc")
        // Text that would read back as another form, or that is not a hash at all.
        for text in ["abcdefghijklmnop", String(repeating: "a", count: 64), "a b", "", String(repeating: "f", count: 32)] {
            #expect(throws: RevisionTreeError.self, "\(text)") { try RevisionTree(encoded: withText(Array(text.utf8))) }
        }
        #expect(throws: RevisionTreeError.self) { try RevisionTree(encoded: withText([0xFF, 0xFE])) }
        // Longer than any hash.
        var long = [UInt8]([2, 1, 1, 2])
        Varint.write(129, into: &long)
        long += [UInt8](repeating: 0x61, count: 129) + [0, 4] + hlc(0)
        #expect(throws: RevisionTreeError.self) { try RevisionTree(encoded: long) }
        #expect(throws: RevisionTreeError.self) { try RevisionTree(encoded: good.dropLast()) }
        var rng = SeededGenerator(seed: 5)
        for _ in 0..<500 {
            var mutated = good
            mutated[Int.random(in: 0..<mutated.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            _ = try? RevisionTree(encoded: mutated)  // must not crash
        }
    }
}
