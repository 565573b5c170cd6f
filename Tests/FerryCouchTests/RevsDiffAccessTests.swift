import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import Testing

/// `_revs_diff` tells a principal nothing about documents it may not read: such a document
/// is answered as if it did not exist, so its revision IDs (which hash the body) cannot be
/// listed or confirmed and then used to guess its content offline.
@Suite struct RevsDiffAccessTests {
    static let reader = CouchPrincipal.user(
        name: "reader", policy: PeerPolicy(read: AccessRule(idPrefixes: ["public/"], types: ["note"])))

    static func invented(_ generation: Int) -> String { "\(generation)-" + String(repeating: "e", count: 64) }

    @Test func aDocumentTheReaderMayNotReadIsAnsweredAsIfItDidNotExist() async throws {
        let f = try DatabaseFixture()
        let r1 = try f.put("secret", ["pin": "4711"])
        let r2 = try f.put("secret", ["pin": "0815"], parent: r1)
        try await f.test(as: Self.reader) { c async throws in
            let guess = Self.invented(3)
            let a = try await c.post("/ferry/_revs_diff", #"{"secret":["\#(guess)","\#(r2)","\#(r1)"]}"#)
            #expect(a.status == 200)
            #expect(a["secret"]?["missing"] == [.string(guess), .string(r2.description), .string(r1.description)])
            #expect(a["secret"]?["possible_ancestors"] == nil)
        }
        // The admin still sees the revisions.
        try await f.test { c async throws in
            let a = try await c.post("/ferry/_revs_diff", #"{"secret":["\#(Self.invented(3))","\#(r2)"]}"#)
            #expect(a["secret"]?["missing"] == [.string(Self.invented(3))])
            #expect(a["secret"]?["possible_ancestors"] == [.string(r2.description)])
        }
    }

    @Test func aDocumentWithAnyLeafTheReaderMayNotReadIsHiddenWhole() async throws {
        let f = try DatabaseFixture()
        let root = try f.put("shared", ["type": "note", "n": 0])
        // Two replicated branches: one the rule admits (by type), one it does not.
        var leaves: [RevisionID] = []
        for body: JSON in [["type": "note", "n": 1], ["type": "diary", "pin": "1234"]] {
            let rev = RevisionID.compute(parent: root, deleted: false, canonicalBody: body.canonicalBytes)
            _ = try f.store.insertRevisions([IncomingRevision(id: DocumentID(unchecked: "shared"), revision: rev, history: [root], deleted: false, body: body)])
            leaves.append(rev)
        }
        let branches = leaves
        try await f.test(as: Self.reader) { c async throws in
            let leaves = branches
            let a = try await c.post("/ferry/_revs_diff", #"{"shared":["\#(Self.invented(3))","\#(leaves[0])","\#(leaves[1])"]}"#)
            #expect(a["shared"]?["missing"] == [.string(Self.invented(3)), .string(leaves[0].description), .string(leaves[1].description)])
            #expect(a["shared"]?["possible_ancestors"] == nil)
        }
    }

    @Test func aReadableDocumentIsAnsweredAsBefore() async throws {
        let f = try DatabaseFixture()
        let r1 = try f.put("public/a", ["n": 1])
        let n1 = try f.put("b", ["type": "note"])
        try await f.test(as: Self.reader) { c async throws in
            let a = try await c.post("/ferry/_revs_diff", #"{"public/a":["\#(r1)","\#(Self.invented(2))"],"b":["\#(Self.invented(2))"]}"#)
            #expect(a["public/a"]?["missing"] == [.string(Self.invented(2))])
            #expect(a["public/a"]?["possible_ancestors"] == [.string(r1.description)])
            #expect(a["b"]?["possible_ancestors"] == [.string(n1.description)])
        }
    }

    @Test func manyRevisionsOfOneDocumentAreAnsweredOnceEach() async throws {
        let f = try DatabaseFixture()
        let r1 = try f.put("public/many", ["n": 1])
        let asked = (0..<20_000).map { "2-" + String(repeating: "0", count: 56) + String(format8: $0) }
        let list = (asked + asked.prefix(100) + [r1.description]).map { "\"\($0)\"" }.joined(separator: ",")
        try await f.test { c async throws in
            let a = try await c.post("/ferry/_revs_diff", #"{"public/many":[\#(list)]}"#)
            guard case .array(let missing)? = a["public/many"]?["missing"] else {
                Issue.record("no missing list")
                return
            }
            #expect(missing.count == 20_000)
            #expect(a["public/many"]?["possible_ancestors"] == [.string(r1.description)])
        }
    }
}

extension String {
    /// Eight lowercase hex digits of `value`.
    init(format8 value: Int) {
        let hex = String(value, radix: 16)
        self = String(repeating: "0", count: 8 - hex.count) + hex
    }
}
