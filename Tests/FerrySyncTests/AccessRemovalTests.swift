import FerryCore
import FerryQuery
import FerryStore
import Testing

@testable import FerrySync

/// Removal notices: a reader that may no longer read a document it held learns so from the
/// changes feed or from a push, and purges it; a notice never names what it never held,
/// never costs it an edit of its own, and gives a sender no power it lacks: a node whose
/// roles read everything, or a sender that may not delete, purges nothing, and no answer
/// names a revision the asker may not read.
@Suite(.timeLimit(.minutes(2))) struct AccessRemovalTests {
    /// Read and write `{"ward": "a"}` documents only (a group grant).
    static let wardA: PeerPolicy = {
        let clause = try! AccessClause(selector: ["ward": "a"])
        let grant = AccessGrant(clauses: [clause])
        return PeerPolicy(read: AccessRule.all.restricted(by: grant), write: AccessRule.all.restricted(by: grant), mayDelete: false)
    }()
    /// What a ward-a station's own roles let it hold.
    static let ownWardA: @Sendable () -> AccessRule = { wardA.read }
    /// A responder serving a ward-a station, and one that is the station.
    static var servingWardA: ReplicationResponder.Options {
        var o = ReplicationResponder.Options()
        o.defaultPolicy = wardA
        return o
    }
    static var asWardAStation: ReplicationResponder.Options {
        var o = ReplicationResponder.Options()
        o.ownRead = ownWardA
        return o
    }

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
        let r = await sync(reader, sender, direction: .pull, configure: { $0.remotePolicy = .trusted; $0.ownRead = Self.ownWardA }, responder: options)
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
        let r = await sync(pusher, reader, direction: .push, configure: { $0.remotePolicy = Self.wardA }, responder: Self.asWardAStation)
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
        #expect(try AccessRemovalApplier.apply([notice], writer: .trusted, own: Self.wardA.read, store: reader).isEmpty)
        #expect(try reader.document(docID("p")) != nil)
        // A sender that may not write the document cannot make the reader purge it.
        let only = try DocumentStore.inMemory()
        let held = try only.put(docID("q"), body: ["ward": "a"])
        let noWrite = PeerPolicy(read: .all, write: .none, mayDelete: false)
        let notice2 = RemovalNotice(id: "q", revisions: [held.description])
        #expect(try AccessRemovalApplier.apply([notice2], writer: noWrite, own: Self.wardA.read, store: only).isEmpty)
        #expect(try AccessRemovalApplier.apply([notice2], writer: .trusted, own: Self.wardA.read, store: only).count == 1)
    }

    @Test func aPeerBehindTheReaderIsNoJudgeOfWhatItHolds() async throws {
        // The supervisor moved p into ward a; a peer still holds it in ward b.
        let supervisor = try DocumentStore.inMemory()
        let first = try supervisor.put(docID("p"), body: ["ward": "b"])
        let stale = try DocumentStore.inMemory()
        await sync(supervisor, stale, direction: .push)
        let moved = try supervisor.put(docID("p"), body: ["ward": "a"], parent: first)
        let reader = try DocumentStore.inMemory()
        var options = ReplicationResponder.Options()
        options.defaultPolicy = Self.wardA
        await sync(reader, supervisor, direction: .pull, configure: { $0.remotePolicy = .trusted }, responder: options)
        #expect(try reader.document(docID("p"))?.revision == moved)
        // The stale peer, asked at the start of a pull session, finds p unreadable as it holds
        // it; its leaf is the reader's ancestor, so the reader keeps its copy.
        let r = await sync(
            reader, stale, direction: .pull, configure: { $0.remotePolicy = .trusted; $0.checksHeldAccess = true; $0.ownRead = Self.ownWardA },
            responder: options)
        #expect(r.status.error == nil)
        #expect(try reader.document(docID("p"))?.revision == moved)
        #expect(try reader.accessRemovals().total == 0)
        // It cannot tell the reader is ahead: its leaf is lower than the reader's, which it lacks.
        let staleTree = try #require(try stale.revisionTree(docID("p")))
        #expect(!DocumentAccess.holdsRevisionBeyond([moved], in: staleTree))
        #expect(DocumentAccess.holdsRevisionBeyond([first], in: try #require(try supervisor.revisionTree(docID("p")))))
        // A notice in the older form whose sender's leaves the reader all knows counts for nothing.
        let behind = RemovalNotice(id: "p", revisions: [moved.description], senderLeaves: [first.description])
        #expect(try AccessRemovalApplier.apply([behind], writer: .trusted, own: Self.wardA.read, store: reader).isEmpty)
    }

    /// A station edits p while the supervisor moves it to ward b: every node holding the move
    /// refuses the edit, and the station learns it (and purges its copy) whichever side dials.
    @Test(arguments: [true, false])
    func aRefusedEditOfADocumentMovedMeanwhileLeavesItsWriter(stationDials: Bool) async throws {
        let supervisor = try DocumentStore.inMemory()
        let station = try DocumentStore.inMemory()
        let base = try supervisor.put(docID("p"), body: ["ward": "a"])
        try supervisor.put(docID("kept"), body: ["ward": "a"])
        var asStation = ReplicationResponder.Options()
        asStation.defaultPolicy = Self.wardA
        await sync(station, supervisor, direction: .pull, configure: { $0.remotePolicy = .trusted }, responder: asStation)
        try supervisor.put(docID("p"), body: ["ward": "b"], parent: base)
        try station.put(docID("p"), body: ["ward": "a", "note": "edited"], parent: base)
        let r: Replicator
        if stationDials {
            // Its push is refused; it asks whether it may still read p, and purges it.
            r = await sync(
                station, supervisor, configure: { $0.remotePolicy = .trusted; $0.checksHeldAccess = true; $0.ownRead = Self.ownWardA },
                responder: asStation)
        } else {
            // The supervisor's pull refuses the edit and tells the station.
            r = await sync(supervisor, station, configure: { $0.remotePolicy = Self.wardA }, responder: Self.asWardAStation)
        }
        #expect(r.status.error == nil)
        #expect(try station.document(docID("p")) == nil)
        #expect(try station.document(docID("kept")) != nil)
        #expect(try station.accessRemovals().removals.map(\.id) == ["p"])
        #expect(try supervisor.revisionTree(docID("p"))?.leaves.count == 1)
    }

    @Test func aPurgedDocumentComesBackWhenAPeerOffersARevisionItNeverKnew() async throws {
        // p is in ward a; a conflicting ward-b leaf makes it unreadable for the reader, which
        // purges it; the supervisor then deletes that leaf, and p is the reader's again.
        let supervisor = try DocumentStore.inMemory()
        let mine = try supervisor.put(docID("p"), body: ["ward": "a"])
        var asReader = ReplicationResponder.Options()
        asReader.defaultPolicy = Self.wardA
        let reader = try DocumentStore.inMemory()
        await sync(reader, supervisor, direction: .pull, configure: { $0.remotePolicy = .trusted; $0.ownRead = Self.ownWardA }, responder: asReader)
        let stale = try DocumentStore.inMemory()
        await sync(supervisor, stale, direction: .push)
        let other = try DocumentStore.inMemory()
        let theirs = try other.put(docID("p"), body: ["ward": "b"])
        await sync(other, supervisor, direction: .push)
        await sync(reader, supervisor, direction: .pull, configure: { $0.remotePolicy = .trusted; $0.ownRead = Self.ownWardA }, responder: asReader)
        #expect(try reader.document(docID("p")) == nil)
        // Offered again as it stood, by a peer that knows no more, it is still refused.
        await sync(reader, stale, direction: .pull, configure: { $0.remotePolicy = .trusted; $0.ownRead = Self.ownWardA }, responder: asReader)
        #expect(try reader.document(docID("p")) == nil)
        try supervisor.delete(docID("p"), revision: theirs)
        let r = await sync(reader, supervisor, direction: .pull, configure: { $0.remotePolicy = .trusted; $0.ownRead = Self.ownWardA }, responder: asReader)
        #expect(r.status.error == nil)
        #expect(try reader.document(docID("p"))?.revision == mine)
    }

    /// A hand-driven session with `link`'s responder, as a peer named "ward-a".
    static func open(_ link: Link) async throws -> (FerryRemote, Connection) {
        let connection = Connection(endpoint: try await link.connector())
        connection.start()
        let remote = try await FerryRemote.open(connection, nodeID: "ward-a", localDatabase: "ward-a-db", inlineWanted: false)
        return (remote, connection)
    }

    /// A ward-a station without the right to delete tells the supervisor and another ward-a
    /// station that patient-1 is gone, naming their own leaves and a newer revision it made up.
    @Test func aNoticeFromAPeerThatMayNotDeleteOrToANodeThatReadsEverythingPurgesNothing() async throws {
        let made = "2-" + String(repeating: "f", count: 64)
        for own in [AccessRule.all, Self.wardA.read] {
            let receiver = try DocumentStore.inMemory()
            let rev = try receiver.put(docID("patient-1"), body: ["ward": "a"])
            let forged = RemovalNotice(id: "patient-1", revisions: [rev.description], senderLeaves: [made])
            let plain = RemovalNotice(id: "patient-1", revisions: [rev.description])
            // Over the wire, to a responder that is the receiver, from a pusher with ward a's rights.
            var options = ReplicationResponder.Options()
            options.ownRead = { own }
            options.defaultPolicy = Self.wardA
            let (remote, connection) = try await Self.open(Link(to: receiver, options: options))
            try await remote.tellAccessRemoved([forged, plain])
            await connection.close()
            #expect(try receiver.document(docID("patient-1"))?.revision == rev, "own: \(own.admitsEverything ? "all" : "ward a")")
            #expect(try receiver.accessRemovals().total == 0)
            // Even a peer that may delete everything cannot make a node that reads everything drop it.
            if own.admitsEverything {
                #expect(try AccessRemovalApplier.apply([plain], writer: .trusted, own: own, store: receiver).isEmpty)
            }
        }
    }

    /// ward-a names ward-b's patient-4 with made-up leaves in an access check, and writes it:
    /// neither answer names a revision of it.
    @Test func anAccessCheckAnswerAndAWriteRefusalNameNoRevisionTheAskerMayNotRead() async throws {
        let supervisor = try DocumentStore.inMemory()
        let secret = try supervisor.put(docID("patient-4"), body: ["ward": "b", "secret": "SECRET-patient-4"])
        let (remote, connection) = try await Self.open(Link(to: supervisor, options: Self.servingWardA))
        let madeUp = "1-" + String(repeating: "0", count: 64)
        let notices = try await remote.checkAccess([.init(id: "patient-4", leaves: [madeUp])])
        await connection.close()
        #expect(notices.allSatisfy { $0.senderLeaves == nil && !$0.revisions.contains(secret.description) })
        let tree = try #require(try supervisor.revisionTree(docID("patient-4")))
        let refusal = try #require(
            DocumentAccess(Self.wardA).writeRefusal(id: docID("patient-4"), body: ["ward": "a"], deleted: false, ancestors: [], existing: tree))
        #expect(!refusal.contains(secret.description) && !refusal.contains(secret.description.dropFirst(2).prefix(8)))
    }

    @Test func aNoticeWhoseSenderLeavesAreMalformedIsDropped() throws {
        let rev = "1-" + String(repeating: "a", count: 64)
        #expect(RemovalNotice(.array(["p", .array([.string(rev)]), .array([.string(rev)])]))?.senderLeaves == [rev])
        #expect(RemovalNotice(.array(["p", .array([.string(rev)])]))?.senderLeaves == nil)
        #expect(RemovalNotice(.array(["p", .array([.string(rev)]), "leaves"])) == nil)
        // No valid leaf left: the notice could never pass the receiver's check; dropped.
        #expect(RemovalNotice(.array(["p", .array([.string(rev)]), .array(["not a revision"])])) == nil)
        #expect(RemovalNotice(.array(["p", .array([.string(rev)]), .array([.string(rev)]), .array([])])) == nil)
    }
}

/// A document purged because this node's own roles stopped admitting it comes back once they
/// admit it again, though the node had recorded that it held the sender's whole feed.
@Suite(.timeLimit(.minutes(2))) struct AccessReadmissionTests {
    @Test func aDocumentPurgedForTheNodesOwnRolesComesBackWhenTheyAdmitItAgainDespiteCoverage() async throws {
        let supervisor = try DocumentStore.inMemory()
        let station = try DocumentStore.inMemory()
        let rev = try supervisor.put(docID("patient-3"), body: ["ward": "a"])
        // Before any rule: both ways unrestricted, so the station records it covers the supervisor's feed.
        await sync(station, supervisor, direction: .pull)
        #expect(try Coverage.of(supervisor.uuid, in: station) != nil)
        // The first rule leaves the station no role: it purges what it held (not refusing its return).
        let purged = try station.purgeForAccess([docID("patient-3")], reason: "no role", refusingReturn: false) { _, _ in true }
        #expect(purged.count == 1)
        #expect(try Coverage.of(supervisor.uuid, in: station) == nil, "a purge voids what the station claimed to hold")
        // Its role is given: a pull (new checkpoints, as a change of its own read grant makes) brings it back.
        let r = await sync(station, supervisor, direction: .pull, configure: { $0.ownReadFingerprint = "ward-a" })
        #expect(r.status.error == nil)
        #expect(try station.document(docID("patient-3"))?.revision == rev)
        // And so does the supervisor pushing to it.
        _ = try station.purgeForAccess([docID("patient-3")], reason: "no role", refusingReturn: false) { _, _ in true }
        await sync(supervisor, station, direction: .push)
        #expect(try station.document(docID("patient-3"))?.revision == rev)
    }
}
