import FerryCore
import FerryQuery
import Testing

@testable import FerrySync

/// A read rule's verdicts decode only the body members the rule names; they must agree with
/// verdicts on whole bodies.
@Suite struct AccessMemberDecodingTests {
    func tree(_ bodies: [(JSON, deleted: Bool)]) throws -> RevisionTree {
        var tree = RevisionTree()
        var parent: RevisionID?
        for (body, deleted) in bodies {
            let bytes = body.canonicalBytes
            let rev = RevisionID.compute(parent: parent, deleted: deleted, canonicalBody: bytes)
            try tree.addChild(rev, of: parent, deleted: deleted, body: bytes, hlc: .zero)
            parent = rev
        }
        return tree
    }

    func grant(_ selectors: [JSON]) throws -> PeerPolicy {
        PeerPolicy(read: AccessRule(grant: AccessGrant(clauses: try selectors.map { try AccessClause(selector: $0) })))
    }

    @Test func theMembersARuleReadsAreTheFirstComponentsOfEveryPathItsSelectorsName() throws {
        let policy = try grant([
            ["ward": "a", "meta.owner": "x"], ["$or": [["team": "blue"], ["$not": ["tags": ["$elemMatch": ["$eq": "z"]]]]]],
        ])
        #expect(policy.read.bodyMembers == ["ward", "meta", "team", "tags"])
        #expect(AccessRule(types: ["note"]).bodyMembers == ["type"])
        #expect(AccessRule(idPrefixes: ["p/"]).bodyMembers == [])
    }

    @Test func verdictsOnNamedMembersAgreeWithVerdictsOnWholeBodies() throws {
        let selectors: [JSON] = [
            ["ward": "a"], ["meta.owner": "x"], ["n": ["$gt": 3]], ["tags": ["$all": ["t1"]]], ["ward": ["$exists": false]],
            ["$or": [["ward": "b"], ["n": ["$lt": 2]]]], ["$nor": [["ward": "a"]]], ["text": ["$regex": "^al"]],
        ]
        var random = SeededGenerator(seed: 7)
        let wards: [JSON] = ["a", "b", 1, .null]
        for _ in 0..<300 {
            var body: [String: JSON] = ["text": .string(["alpha", "beta", "al\"q"].randomElement(using: &random)!)]
            if Bool.random(using: &random) { body["ward"] = wards.randomElement(using: &random)! }
            if Bool.random(using: &random) { body["n"] = .int(Int64.random(in: 0..<6, using: &random)) }
            if Bool.random(using: &random) { body["meta"] = ["owner": Bool.random(using: &random) ? "x" : "y", "deep": [[1], ["k": "v"]]] }
            if Bool.random(using: &random) { body["tags"] = .array([Bool.random(using: &random) ? "t1" : "t2", "t3"]) }
            let deleted = Int.random(in: 0..<4, using: &random) == 0
            let t = try tree([(["ward": "a", "n": 5, "meta": ["owner": "x"]], false), (.object(body), deleted)])
            let policy = try grant([selectors.randomElement(using: &random)!, selectors.randomElement(using: &random)!])
            let partial = DocumentAccess(policy)
            #expect(partial.readMembers != nil)
            let whole = DocumentAccess.admitsDocument(policy.read, try DocumentID("d"), tree: t)
            #expect(partial.mayRead(try DocumentID("d"), tree: t) == whole, "body \(JSON.object(body).canonicalString), deleted \(deleted)")
        }
    }

    @Test func aTombstoneWithFieldsButNoneTheRuleNamesIsJudgedByItselfNotByWhatItDeleted() throws {
        let t = try tree([(["type": "note"], false), (["reason": "moved"], true)])
        let notes = DocumentAccess(PeerPolicy(read: AccessRule(types: ["note"])))
        #expect(notes.readMembers == ["type"])
        #expect(!notes.mayRead(try DocumentID("d"), tree: t))
        let bare = try tree([(["type": "note"], false), ([:], true)])
        #expect(notes.mayRead(try DocumentID("d"), tree: bare))
    }
}
