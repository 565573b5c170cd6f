import Testing
@testable import FerryCore

/// A direct transcription of how CouchDB orders revisions, kept deliberately naive and
/// independent of `RevisionID`: a revision is `{Pos, RevId}` where RevId is a binary (a
/// 32-character hash read as hex into 16 bytes, any other hash its text bytes), leaves sort
/// by `{not Deleted, {Pos, RevId}}` with Erlang's term order, and the greatest wins.
enum CouchOrder {
    struct Rev: Equatable {
        let pos: Int
        let id: [UInt8]
    }

    static func parse(_ text: String) -> Rev {
        let bytes = Array(text.utf8)
        let dash = bytes.firstIndex(of: UInt8(ascii: "-"))!
        let pos = Int(String(decoding: bytes[..<dash], as: UTF8.self))!
        let hash = Array(bytes[(dash + 1)...])
        if hash.count == 32 {
            var raw: [UInt8] = []
            for i in stride(from: 0, to: 32, by: 2) {
                raw.append(UInt8(String(decoding: hash[i..<i + 2], as: UTF8.self), radix: 16)!)
            }
            return Rev(pos: pos, id: raw)
        }
        return Rev(pos: pos, id: hash)
    }

    /// Erlang binary order: bytewise, and a proper prefix first.
    static func binaryLess(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var i = 0
        while i < a.count && i < b.count {
            if a[i] != b[i] { return a[i] < b[i] }
            i += 1
        }
        return a.count < b.count
    }

    /// `{Pos, RevId}` tuples: position first, then the binary.
    static func revLess(_ a: Rev, _ b: Rev) -> Bool {
        if a.pos != b.pos { return a.pos < b.pos }
        return binaryLess(a.id, b.id)
    }

    /// `{not DeletedA, RevA} > {not DeletedB, RevB}` (`true` sorts above `false` in Erlang).
    static func leafGreater(_ a: (deleted: Bool, rev: Rev), _ b: (deleted: Bool, rev: Rev)) -> Bool {
        let liveA = !a.deleted
        let liveB = !b.deleted
        if liveA != liveB { return liveA }
        return revLess(b.rev, a.rev)
    }
}

/// Random revision ID texts of every accepted form, drawn from small alphabets so that
/// equal generations, shared prefixes and equal bytes across forms are common.
struct RevisionTextGenerator {
    var rng: SeededGenerator

    mutating func pick(_ alphabet: String, _ count: Int) -> String {
        let chars = Array(alphabet)
        return String((0..<count).map { _ in chars[Int.random(in: 0..<chars.count, using: &rng)] })
    }

    mutating func hash() -> String {
        switch Int.random(in: 0..<8, using: &rng) {
        case 0: return pick("0f9a", 64)  // Ferry's form
        case 1: return pick("0f9a", 32)  // CouchDB's, lowercase
        case 2: return pick("0F9aA", 32)  // CouchDB's, mixed case as a client may send it
        case 3: return pick("aA~9-.", Int.random(in: 1...4, using: &rng))  // short text, many prefixes
        case 4: return pick("ab", 16)  // 16 bytes: the same binary as some 32-hex hash
        case 5: return Hex.encode(Array(pick("ab", 16).utf8))  // … and that 32-hex hash
        case 6: return pick("0F9A", 64)  // uppercase 64 hex: text, not Ferry's
        default:
            // Any length but 32, which CouchDB (and so Ferry) reads only as hex.
            let n = Int.random(in: 1...128, using: &rng)
            return pick("abcXYZ019_~+/=", n == 32 ? 33 : n)
        }
    }

    mutating func text(generation: Int) -> String { "\(generation)-\(hash())" }

    mutating func text() -> String { text(generation: Int.random(in: 1...3, using: &rng)) }
}

@Suite struct WinnerRulePropertyTests {
    // The loops yield now and then: a long synchronous test would hold one of the few
    // cooperative threads that the other tests, run in parallel, need.
    @Test(arguments: [1, 2, 3, 4] as [UInt64])
    func revisionOrderIsCouchDBsForEveryMixOfForms(seed: UInt64) async throws {
        var gen = RevisionTextGenerator(rng: SeededGenerator(seed: seed))
        for i in 0..<2000 {
            if i % 100 == 0 { await Task.yield() }
            let (ta, tb) = (gen.text(), gen.text())
            let a = try RevisionID(ta)
            let b = try RevisionID(tb)
            let (ca, cb) = (CouchOrder.parse(ta), CouchOrder.parse(tb))
            #expect((a < b) == CouchOrder.revLess(ca, cb), "\(ta) vs \(tb)")
            #expect((b < a) == CouchOrder.revLess(cb, ca), "\(tb) vs \(ta)")
            #expect((a == b) == (ca == cb), "\(ta) vs \(tb)")
            // What is served reads back as the same revision, in CouchDB's eyes too.
            #expect(CouchOrder.parse(a.description) == ca)
        }
    }

    @Test func ferryOnlyIDsKeepTheirTextOrder() async throws {
        var gen = RevisionTextGenerator(rng: SeededGenerator(seed: 11))
        for i in 0..<2000 {
            if i % 100 == 0 { await Task.yield() }
            let g = Int.random(in: 1...2, using: &gen.rng)
            let a = try RevisionID("\(g)-" + gen.pick("0123456789abcdef", 64))
            let b = try RevisionID("\(Int.random(in: 1...2, using: &gen.rng))-" + gen.pick("0123456789abcdef", 64))
            let textOrder = a.generation != b.generation ? a.generation < b.generation : a.hashText < b.hashText
            #expect((a < b) == textOrder)
        }
    }

    @Test(arguments: Array(1...8) as [UInt64])
    func winnerAndConflictsOfRandomTreesAreCouchDBs(seed: UInt64) async throws {
        var gen = RevisionTextGenerator(rng: SeededGenerator(seed: seed * 7919))
        for i in 0..<150 {
            if i % 10 == 0 { await Task.yield() }
            let tree = try randomTree(&gen)
            let leaves = tree.revisions.filter(\.isLeaf).map {
                (deleted: $0.deleted, rev: CouchOrder.parse($0.id.description), id: $0.id)
            }
            let sorted = leaves.sorted { CouchOrder.leafGreater(($0.deleted, $0.rev), ($1.deleted, $1.rev)) }
            let couchWinner = try #require(sorted.first)
            #expect(tree.winner?.id == couchWinner.id)
            let couchConflicts = sorted.dropFirst().filter { !$0.deleted }.map(\.id)
            #expect(tree.conflicts == couchConflicts)
            // The encoding keeps every form, and stays version 1 for Ferry-only trees.
            let bytes = tree.encoded()
            #expect(try RevisionTree(encoded: bytes) == tree)
            #expect(bytes[0] == (tree.revisions.allSatisfy(\.id.isFerryDigest) ? 1 : 2))
        }
    }

    /// A trunk of 0–2 revisions and 1–5 branches off it (or new roots), each 1–3 long,
    /// with random ID forms and some deleted leaves.
    func randomTree(_ gen: inout RevisionTextGenerator) throws -> RevisionTree {
        var tree = RevisionTree()
        var trunk: [RevisionID] = []
        for g in 0..<Int.random(in: 0...2, using: &gen.rng) { trunk.append(try RevisionID(gen.text(generation: g + 1))) }
        if let last = trunk.last {
            try tree.insert(last, history: trunk.dropLast().reversed(), deleted: false, body: nil, hlc: .zero)
        }
        for _ in 0..<Int.random(in: 1...5, using: &gen.rng) {
            let start = Int.random(in: 0...trunk.count, using: &gen.rng)
            var chain = Array(trunk[..<start])
            for _ in 0..<Int.random(in: 1...3, using: &gen.rng) {
                chain.append(try RevisionID(gen.text(generation: chain.count + 1)))
            }
            let deleted = Int.random(in: 0..<5, using: &gen.rng) == 0
            try tree.insert(
                chain.last!, history: chain.dropLast().reversed(), deleted: deleted, body: Array("{}".utf8), hlc: .zero)
        }
        return tree
    }
}
