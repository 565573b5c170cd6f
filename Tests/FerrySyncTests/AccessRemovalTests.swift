import FerryCore
import FerryQuery
import FerryStore
import Testing

@testable import FerrySync

/// Removal notices: a reader that may no longer read a document it held learns so from the
/// changes feed or from a push, and purges it; a notice never names what it never held,
/// never costs it an edit of its own, and gives a sender no power it lacks.
@Suite(.timeLimit(.minutes(2))) struct AccessRemovalTests {
    /// Read and write `{"ward": "a"}` documents only (a group grant).
    static let wardA: PeerPolicy = {
        let clause = try! AccessClause(selector: ["ward": "a"])
        let grant = AccessGrant(clauses: [clause])
        return PeerPolicy(read: AccessRule.all.restricted(by: grant), write: AccessRule.all.restricted(by: grant), mayDelete: false)
    }()

    @Test func aGrantWithASelectorJudgesBodiesAndAnAllAdmittingGrantRestrictsNothing() throws {
        #expect(Self.wardA.read.needsBodies)
        #expect(Self.wardA.read.admits(id: docID("p"), body: ["ward": "a"]))
        #expect(!Self.wardA.read.admits(id: docID("p"), body: ["ward": "b"]))
        #expect(!Self.wardA.read.admits(id: docID("p"), body: nil))
        let everything = AccessGrant(clauses: [try AccessClause()])
        #expect(AccessRule.all.restricted(by: everything).admitsEverything)
        #expect(AccessRule.all.restricted(by: .nothing).admitsNoApplicationDocument)
    }

    @Test func aPullerPurgesADocumentThatMovedOutOfItsReachAndKeepsTheRest() async throws {
        let sender = try DocumentStore.inMemory()
        let reader = try DocumentStore.inMemory()
        let moved = try sender.put(docID("p1"), body: ["ward": "a"])
        try sender.put(docID("p2"), body: ["ward": "a"])
        try sender.put(docID("p3"), body: ["ward": "b"])
        var options = ReplicationResponder.Options()
        options.defaultPolicy = Self.wardA
        await sync(reader, sender, direction: .pull, responder: options)
        #expect(try reader.document(docID("p1")) != nil && reader.document(docID("p3")) == nil)
        try sender.put(docID("p1"), body: ["ward": "b"], parent: moved)
        let r = await sync(reader, sender, direction: .pull, configure: { $0.remotePolicy = .trusted }, responder: options)
        #expect(r.status.error == nil)
        #expect(try reader.document(docID("p1")) == nil, "the moved document is purged")
        #expect(try reader.document(docID("p2")) != nil)
        #expect(try reader.accessRemovals().removals.map(\.id) == ["p1"])
        // Its purged revision does not come back.
        #expect(try reader.accessRemovals().total == 1)
    }

    @Test func aPusherTellsTheResponderOfADocumentItMayNoLongerRead() async throws {
        let pusher = try DocumentStore.inMemory()
        let reader = try DocumentStore.inMemory()
        let rev = try pusher.put(docID("p1"), body: ["ward": "a"])
        await sync(pusher, reader, direction: .push) { $0.remotePolicy = Self.wardA }
        #expect(try reader.document(docID("p1")) != nil)
        try pusher.put(docID("p1"), body: ["ward": "b"], parent: rev)
        let r = await sync(pusher, reader, direction: .push) { $0.remotePolicy = Self.wardA }
        #expect(r.status.error == nil)
        #expect(try reader.document(docID("p1")) == nil)
    }

    @Test func aNoticeIsNotSentForADocumentTheReaderNeverCouldReadNorAppliedOverAnOwnEdit() throws {
        let store = try DocumentStore.inMemory()
        let first = try store.put(docID("secret"), body: ["ward": "b"])
        try store.put(docID("secret"), body: ["ward": "c"], parent: first)
        let tree = try #require(try store.revisionTree(docID("secret")))
        #expect(DocumentAccess(Self.wardA).removalNotice(docID("secret"), tree: tree) == nil)

        // The reader edited its copy after what the sender saw: the notice leaves it alone.
        let reader = try DocumentStore.inMemory()
        let base = try reader.put(docID("p"), body: ["ward": "a"])
        try reader.put(docID("p"), body: ["ward": "a", "note": "mine"], parent: base)
        let notice = RemovalNotice(id: "p", revisions: [base.description])
        #expect(try AccessRemovalApplier.apply([notice], writer: .trusted, store: reader).isEmpty)
        #expect(try reader.document(docID("p")) != nil)
        // A sender that may not write the document cannot make the reader purge it.
        let only = try DocumentStore.inMemory()
        let held = try only.put(docID("q"), body: ["ward": "a"])
        let noWrite = PeerPolicy(read: .all, write: .none, mayDelete: false)
        #expect(try AccessRemovalApplier.apply([RemovalNotice(id: "q", revisions: [held.description])], writer: noWrite, store: only).isEmpty)
        #expect(try AccessRemovalApplier.apply([RemovalNotice(id: "q", revisions: [held.description])], writer: .trusted, store: only).count == 1)
    }
}
