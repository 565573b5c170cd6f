import FerryCore
import Testing
@testable import FerryStore

@Suite struct ForeignRevisionStoreTests {
    let md5a = "9c65296036141e575d32ba9c034dd3ee"
    let md5b = "4a7fd0f46a4c0a0ba4d2c2e4c5e1d9b0"

    func rev(_ text: String) -> RevisionID { try! RevisionID(text) }

    @Test func aCouchDBHistoryIsStoredAndServedUnchangedAcrossAReopen() throws {
        let dir = TemporaryDirectory()
        let id = docID("couch")
        do {
            let store = try DocumentStore.open(directory: dir.path)
            let outcomes = try store.insertRevisions([
                IncomingRevision(
                    id: id, revision: rev("2-" + md5b.uppercased()), history: [rev("1-" + md5a)], deleted: false,
                    body: ["from": "couchdb"])
            ])
            #expect(outcomes == [.inserted(sequence: 1, branched: false)])
        }
        let store = try DocumentStore.openExisting(directory: dir.path)
        let doc = try #require(try store.document(id))
        #expect(doc.revision.description == "2-" + md5b)
        #expect(doc.body == ["from": "couchdb"])
        #expect(try store.revisionTree(id)!.history(of: doc.revision).map(\.description) == ["2-" + md5b, "1-" + md5a])
    }

    @Test func anIncomingRevisionWithAFerryFormIDIsAlwaysVerified() throws {
        let store = try DocumentStore.inMemory()
        let id = docID("d")
        let real = RevisionID.compute(parent: nil, deleted: false, canonicalBody: JSON.object(["v": 1]).canonicalBytes)
        // Whoever built it, a Ferry-form ID with a body that does not hash to it is refused.
        let forged = IncomingRevision(id: id, revision: real, history: [], deleted: false, body: ["v": "forged"])
        #expect(try store.insertRevisions([forged]) == [.rejected(.digestMismatch(id, real))])
        #expect(IncomingRevision.unverifiable(id: id, revision: real, history: [], deleted: false, body: ["v": 1], hlc: .zero) == nil)
        // `verified` vouches only for Ferry digests.
        #expect(
            IncomingRevision.verified(
                id: id, revision: rev("1-" + md5a), history: [], deleted: false, body: ["v": 1], hlc: .zero,
                canonicalBody: JSON.object(["v": 1]).canonicalBytes) == nil)
        #expect(try store.document(id) == nil)
    }

    @Test func otherSpellingsOfAFerryRevisionNeverStandForIt() throws {
        let store = try DocumentStore.inMemory()
        let id = docID("d")
        let real = try store.put(id, body: ["v": "real"])
        // Zero-padded: the same ID, so verified, and the forged body is refused.
        let padded = IncomingRevision(
            id: id, revision: rev("01-" + real.hashText), history: [], deleted: false, body: ["v": "forged"])
        #expect(try store.insertRevisions([padded]) == [.rejected(.digestMismatch(id, real))])
        // Uppercase: another, unverifiable revision beside it; the Ferry revision keeps its body.
        let upper = rev("1-" + real.hashText.uppercased())
        let shadow = IncomingRevision(id: id, revision: upper, history: [], deleted: false, body: ["v": "forged"])
        #expect(try store.insertRevisions([shadow]) == [.inserted(sequence: 2, branched: true)])
        let tree = try #require(try store.revisionTree(id))
        #expect(tree.revisions.count == 2)
        #expect(try store.document(id, revision: real)?.body == ["v": "real"])
        #expect(try store.document(id, revision: upper)?.body == ["v": "forged"])
        #expect(try store.document(id, revision: upper)?.revision != real)
    }

    @Test func aForeignBodyIsStoredInCanonicalFormWhateverBytesCameWithIt() throws {
        let store = try DocumentStore.inMemory()
        let id = docID("d")
        let given = Array(#"{ "b" : 1, "a" : [ 2 ] }"#.utf8)
        let incoming = IncomingRevision(
            id: id, revision: rev("1-" + md5a), history: [], deleted: false, body: ["b": 1, "a": [2]],
            canonicalBody: given)
        #expect(try store.insertRevisions([incoming]) == [.inserted(sequence: 1, branched: false)])
        #expect(try store.revisionTree(id)?.winner?.body == Array(#"{"a":[2],"b":1}"#.utf8))
        // Bytes that disagree with the body are not stored either: the body is.
        let lying = IncomingRevision(
            id: docID("e"), revision: rev("1-" + md5a), history: [], deleted: false, body: ["v": 1],
            canonicalBody: Array(#"{"v":2}"#.utf8))
        _ = try store.insertRevisions([lying])
        #expect(try store.document(docID("e"))?.body == ["v": 1])
    }

    @Test func aForeignRevisionStillFacesStructureAndValidation() throws {
        var options = StoreOptions()
        options.validator = Validator { $0.body["ok"] == false ? "not ok" : nil }
        let store = try DocumentStore.inMemory(options: options)
        let outcomes = try store.insertRevisions([
            IncomingRevision(id: docID("a"), revision: rev("2-" + md5a), history: [], deleted: false, body: [:]),
            IncomingRevision(id: docID("b"), revision: rev("1-" + md5a), history: [], deleted: false, body: ["_x": 1]),
            IncomingRevision(id: docID("c"), revision: rev("1-" + md5a), history: [], deleted: false, body: ["ok": false]),
        ])
        guard case .rejected(.invalidHistory) = outcomes[0] else {
            Issue.record("expected invalid history, got \(outcomes[0])")
            return
        }
        guard case .rejected(.invalidBody) = outcomes[1] else {
            Issue.record("expected invalid body, got \(outcomes[1])")
            return
        }
        #expect(outcomes[2] == .rejected(.rejected(docID("c"), reason: "not ok")))
        #expect(try store.allDocuments(includeDeleted: true).isEmpty)
    }

    @Test func aLocalEditOfAForeignRevisionGetsAFerryChild() throws {
        let store = try DocumentStore.inMemory()
        let id = docID("d")
        let parent = rev("1-" + md5a)
        _ = try store.insertRevisions([
            IncomingRevision(id: id, revision: parent, history: [], deleted: false, body: ["v": 1])
        ])
        let child = try store.put(id, body: ["v": 2], parent: parent)
        #expect(child.generation == 2)
        #expect(child.isFerryDigest)
        #expect(child == RevisionID.compute(parent: parent, deleted: false, canonicalBody: JSON.object(["v": 2]).canonicalBytes))
        let gone = try store.delete(id, revision: child)
        #expect(gone.isFerryDigest)
        #expect(try store.revisionTree(id)!.history(of: gone) == [gone, child, parent])
    }

    @Test func theStoresWinnerAmongMixedFormsIsCouchDBs() throws {
        let store = try DocumentStore.inMemory()
        let id = docID("d")
        let root = try store.put(id, body: ["v": 0])
        // As bytes 0x0a… loses to "0" (0x30); as text "0" would be a prefix of "0a…" and lose.
        let low = rev("2-0a" + String(repeating: "0", count: 30))
        let zero = rev("2-0")
        let high = rev("2-" + md5a)  // 0x9c…: above any text hash
        func add(_ r: RevisionID) throws {
            _ = try store.insertRevisions([
                IncomingRevision(id: id, revision: r, history: [root], deleted: false, body: ["r": .string(r.description)])
            ])
        }
        try add(low)
        try add(zero)
        #expect(try store.document(id)?.revision == zero)
        #expect(try store.conflicts(of: id) == [low])
        try add(high)
        #expect(try store.document(id)?.revision == high)
        #expect(try store.conflicts(of: id) == [zero, low])
        #expect(try store.document(id)?.body == ["r": .string(high.description)])
    }
}
