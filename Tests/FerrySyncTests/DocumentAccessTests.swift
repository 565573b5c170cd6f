import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing

@testable import FerrySync

/// A restricted peer's session with a responder, driven by hand as a hostile peer would.
struct RestrictedSession {
    let session: ResponderSession
    var number: UInt64 = 1

    init(session: ResponderSession) { self.session = session }

    init(store: DocumentStore, policy: PeerPolicy, peer: String = "peer-b") async throws {
        var options = ReplicationResponder.Options()
        options.policies[peer] = policy
        session = ResponderSession(responder: ReplicationResponder(store: store, options: options), authenticatedPeer: peer)
        let hello: JSON = ["nodeID": .string(peer), "protocol": [1]]
        _ = try await send("hello", hello)
    }

    mutating func send(_ profile: String, _ body: [UInt8], properties: [(String, String)] = []) async throws -> Message {
        let reply = await session.handle(
            Message(kind: .request, number: number, properties: [("Profile", profile)] + properties, body: body))
        number += 1
        return try #require(reply)
    }

    mutating func send(_ profile: String, _ body: JSON, properties: [(String, String)] = []) async throws -> Message {
        try await send(profile, body.canonicalBytes, properties: properties)
    }

    /// Pushes revisions made in `origin`; returns each one's status text.
    mutating func push(_ revs: [(DocumentID, RevisionID)], from origin: DocumentStore) async throws -> [String] {
        var wires: [WireRevision] = []
        for (id, rev) in revs {
            let tree = try #require(try origin.revisionTree(id))
            let (wire, _) = try #require(
                WireRevision.make(id: id, revision: rev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 20))
            wires.append(wire)
        }
        let reply = try await send("putRevs", WireRevision.encodeBatch(wires))
        guard case .array(let results)? = try reply.json()["results"] else { return [] }
        return results.map { $0["status"]?.stringValue ?? "?" }
    }

    /// The revisions `getRevs` returns (missing ones left out).
    mutating func getRevs(_ revs: [(DocumentID, RevisionID)], ancestors: [RevisionID] = []) async throws -> [WireRevision] {
        let asked: JSON = [
            "revs": .array(
                revs.map { ["id": .string($0.0.rawValue), "rev": .string($0.1.description), "ancestors": .array(ancestors.map { .string($0.description) })] }),
            "deltas": true, "maxHistory": 20,
        ]
        let reply = try await send("getRevs", asked)
        return try WireRevision.decodeBatch(reply.body).filter { !$0.missing }
    }
}

/// A secret document in `store`, plus a copy of it in `attacker` (the attacker learned its
/// revision, for example from an earlier read rule), so the attacker can build on it.
private func secretPatient(in store: DocumentStore, copiedTo attacker: DocumentStore) throws -> RevisionID {
    let rev = try store.put(docID("patients/2"), body: ["type": "secret", "pin": "4711"])
    let tree = try #require(try store.revisionTree(docID("patients/2")))
    let (wire, _) = try #require(
        WireRevision.make(id: docID("patients/2"), revision: rev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 5))
    let incoming = try #require(
        IncomingRevision.verified(
            id: docID("patients/2"), revision: rev, history: [], deleted: false, body: try JSON.parse(wire.content), hlc: .zero,
            canonicalBody: wire.content))
    _ = try attacker.insertRevisions([incoming])
    return rev
}

private let noteWriter = PeerPolicy(
    read: AccessRule(types: ["note"]), write: AccessRule(types: ["note"]), mayDelete: false)

@Suite struct DocumentAccessRuleTests {
    @Test func aDocumentIsReadableOnlyWhenEveryLiveLeafIs() throws {
        var tree = RevisionTree()
        let a = RevisionID.compute(parent: nil, deleted: false, canonicalBody: (["type": "note"] as JSON).canonicalBytes)
        try tree.addChild(a, of: nil, deleted: false, body: (["type": "note"] as JSON).canonicalBytes, hlc: .zero)
        let access = DocumentAccess(noteWriter)
        #expect(access.mayRead(docID("d"), tree: tree))
        let b = try RevisionID("1-" + String(repeating: "f", count: 64))
        try tree.insert(b, history: [], deleted: false, body: (["type": "secret"] as JSON).canonicalBytes, hlc: .zero)
        #expect(!access.mayRead(docID("d"), tree: tree))
        #expect(!access.mayRead(docID("d"), revision: a, in: tree))
    }

    @Test func aBareTombstoneIsJudgedByWhatItDeleted() throws {
        var tree = RevisionTree()
        let body = (["type": "note"] as JSON).canonicalBytes
        let a = RevisionID.compute(parent: nil, deleted: false, canonicalBody: body)
        try tree.addChild(a, of: nil, deleted: false, body: body, hlc: .zero)
        let t = RevisionID.compute(parent: a, deleted: true, canonicalBody: Array("{}".utf8))
        try tree.addChild(t, of: a, deleted: true, body: Array("{}".utf8), hlc: .zero)
        #expect(DocumentAccess(noteWriter).mayRead(docID("d"), tree: tree))
        #expect(!DocumentAccess(PeerPolicy(read: AccessRule(types: ["secret"]))).mayRead(docID("d"), tree: tree))
    }

    @Test func aWriteIsJudgedByEveryLeafItCouldReplaceAndEveryHeldAncestor() throws {
        var tree = RevisionTree()
        let secret = (["type": "secret"] as JSON).canonicalBytes
        let a = RevisionID.compute(parent: nil, deleted: false, canonicalBody: secret)
        try tree.addChild(a, of: nil, deleted: false, body: secret, hlc: .zero)
        let access = DocumentAccess(noteWriter)
        let note: JSON = ["type": "note"]
        #expect(access.writeRefusal(id: docID("d"), body: note, deleted: false, ancestors: [a], existing: tree) != nil)
        #expect(access.writeRefusal(id: docID("d"), body: note, deleted: false, ancestors: [], existing: tree) != nil)
        #expect(access.writeRefusal(id: docID("d"), body: note, deleted: false, ancestors: [], existing: nil) == nil)
        #expect(access.writeRefusal(id: docID("d"), body: ["type": "secret"], deleted: false, ancestors: [], existing: nil) != nil)
        // By ID, a rule needs no bodies: a bare tombstone is judged by its ID.
        let byID = DocumentAccess(PeerPolicy(write: AccessRule(idPrefixes: ["inbox/"])))
        #expect(byID.writeRefusal(id: docID("d"), body: [:], deleted: true, ancestors: [a], existing: tree) != nil)
        #expect(byID.writeRefusal(id: docID("inbox/d"), body: [:], deleted: true, ancestors: [], existing: nil) == nil)
    }
}

@Suite(.timeLimit(.minutes(5))) struct ResponderAccessTests {
    @Test func aTypeRestrictedPeerCannotOverwriteADocumentOfAnotherType() async throws {
        let node = try DocumentStore.inMemory()
        let attacker = try DocumentStore.inMemory()
        let secret = try secretPatient(in: node, copiedTo: attacker)
        // A child of the secret revision, typed as a note, then edited twice more (a higher
        // generation, which would win).
        var rev = try attacker.put(docID("patients/2"), body: ["type": "note"], parent: secret)
        rev = try attacker.put(docID("patients/2"), body: ["type": "note", "n": 2], parent: rev)
        var peer = try await RestrictedSession(store: node, policy: noteWriter)
        let statuses = try await peer.push([(docID("patients/2"), rev)], from: attacker)
        #expect(statuses == ["rejected"])
        let stored = try #require(try node.document(docID("patients/2")))
        #expect(stored.revision == secret)
        #expect(try node.revisionTree(docID("patients/2"))?.leaves.count == 1)
    }

    @Test func aNewBranchCannotOutrankAnUnwritableLeaf() async throws {
        let node = try DocumentStore.inMemory()
        let attacker = try DocumentStore.inMemory()
        _ = try secretPatient(in: node, copiedTo: try DocumentStore.inMemory())
        // A branch of its own (generation 3 from nothing the node holds), typed as a note.
        var rev = try attacker.put(docID("patients/2"), body: ["type": "note"])
        rev = try attacker.put(docID("patients/2"), body: ["type": "note", "n": 2], parent: rev)
        rev = try attacker.put(docID("patients/2"), body: ["type": "note", "n": 3], parent: rev)
        var peer = try await RestrictedSession(store: node, policy: noteWriter)
        #expect(try await peer.push([(docID("patients/2"), rev)], from: attacker) == ["rejected"])
        #expect(try node.document(docID("patients/2"))?.body["type"] == "secret")
    }

    @Test func aRestrictedReaderGetsNoRevisionOfADocumentWithAnUnreadableLeaf() async throws {
        let node = try DocumentStore.inMemory()
        let secret = try node.put(docID("patients/2"), body: ["type": "secret", "pin": "4711"])
        // A conflicting note leaf that wins (written by someone allowed to).
        let other = try DocumentStore.inMemory()
        var rev = try other.put(docID("patients/2"), body: ["type": "note"])
        rev = try other.put(docID("patients/2"), body: ["type": "note", "n": 2], parent: rev)
        let tree = try #require(try other.revisionTree(docID("patients/2")))
        let (wire, _) = try #require(
            WireRevision.make(id: docID("patients/2"), revision: rev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 5))
        let incoming = try #require(
            IncomingRevision.verified(
                id: docID("patients/2"), revision: rev, history: wire.history.map { try! RevisionID($0) }, deleted: false,
                body: try JSON.parse(wire.content), hlc: .zero, canonicalBody: wire.content))
        _ = try node.insertRevisions([incoming])
        #expect(try node.document(docID("patients/2"))?.revision == rev)  // the note wins
        var peer = try await RestrictedSession(store: node, policy: noteWriter)
        #expect(try await peer.getRevs([(docID("patients/2"), secret)]).isEmpty)
        #expect(try await peer.getRevs([(docID("patients/2"), rev)]).isEmpty)
        let changes = try await peer.send("changes", ["since": 0] as JSON).json()
        #expect(changes["changes"] == .array([]))
    }

    @Test func revsDiffTellsARestrictedPeerNothingOfADocumentItMayNotRead() async throws {
        let node = try DocumentStore.inMemory()
        let secret = try node.put(docID("patients/2"), body: ["type": "secret", "pin": "4711"])
        let guess = try RevisionID("2-" + String(repeating: "a", count: 64))
        var peer = try await RestrictedSession(store: node, policy: noteWriter)
        let asked: JSON = ["docs": ["patients/2": [.string(secret.description), .string(guess.description)]]]
        let answer = try await peer.send("revsDiff", asked).json()
        #expect(answer["patients/2"]?["missing"] == .array([.string(secret.description), .string(guess.description)]))
        #expect(answer["patients/2"]?["ancestors"] == .array([]))
        // A peer that may read everything gets the truth.
        var trusted = try await RestrictedSession(store: node, policy: .trusted)
        let truth = try await trusted.send("revsDiff", asked).json()
        #expect(truth["patients/2"]?["missing"] == .array([.string(guess.description)]))
        #expect(truth["patients/2"]?["ancestors"] == .array([.string(secret.description)]))
    }

    @Test func aBlobIsServedToARestrictedPeerOnlyThroughARevisionItWasSent() async throws {
        let node = try DocumentStore.inMemory()
        let content = Array("x-ray of patient 2".utf8)
        let ref = try node.blobs.put(content)
        try node.put(docID("patients/2"), body: ["type": "secret", "scan": ref.json])
        var peer = try await RestrictedSession(store: node, policy: noteWriter)
        let asked = try await peer.send("getBlob", [UInt8](), properties: [("Digest", ref.digest.description)])
        #expect(asked.kind == .error)
        #expect(asked.carriedError.code == "not_found")
        // A readable note referring to the same content: the blob comes through it.
        let note = try node.put(docID("notes/1"), body: ["type": "note", "scan": ref.json])
        #expect(try await peer.getRevs([(docID("notes/1"), note)]).count == 1)
        let served = try await peer.send("getBlob", [UInt8](), properties: [("Digest", ref.digest.description)])
        #expect(served.kind == .response)
        #expect(served.body == content)
    }

    @Test func aRestrictedPeerCannotReferToABlobItKnowsOnlyByDigest() async throws {
        let node = try DocumentStore.inMemory()
        let attacker = try DocumentStore.inMemory()
        let ref = try node.blobs.put(Array("x-ray of patient 2".utf8))
        try node.put(docID("patients/2"), body: ["type": "secret", "scan": ref.json])
        // The attacker writes a note referring to the digest (it fakes the blob locally with
        // the same digest and length only in its own store's eyes: here it simply has it).
        _ = try attacker.blobs.put(Array("x-ray of patient 2".utf8))
        let rev = try attacker.put(docID("notes/steal"), body: ["type": "note", "scan": ref.json])
        var peer = try await RestrictedSession(store: node, policy: noteWriter)
        let has = try await peer.send("hasBlobs", ["digests": [.string(ref.digest.description)]] as JSON).json()
        #expect(has["missing"] == .array([.string(ref.digest.description)]))  // it must send the content
        #expect(try await peer.push([(docID("notes/steal"), rev)], from: attacker) == ["rejected"])
        // Having sent the content, it may.
        let put = try await peer.send("putBlob", Array("x-ray of patient 2".utf8), properties: [("Digest", ref.digest.description)])
        #expect(put.kind == .response)
        #expect(try await peer.push([(docID("notes/steal"), rev)], from: attacker) == ["ok"])
    }

    @Test func aPeerThatMayWriteNothingMayNotSendBlobs() async throws {
        let node = try DocumentStore.inMemory()
        var peer = try await RestrictedSession(store: node, policy: PeerPolicy(read: .all, write: .none, mayDelete: false))
        let content = Array(repeating: UInt8(7), count: 1000)
        let reply = try await peer.send("putBlob", content, properties: [("Digest", BlobDigest.of(content).description)])
        #expect(reply.kind == .error)
        #expect(reply.carriedError.code == "forbidden")
        #expect(!node.blobs.has(BlobDigest.of(content)))
    }

    @Test func checkpointsArBoundedPerPeerInCountAndSize() async throws {
        let node = try DocumentStore.inMemory()
        var peer = try await RestrictedSession(store: node, policy: PeerPolicy(read: .all, write: .none, mayDelete: false))
        for i in 0..<CheckpointQuota.maxCheckpointsPerPeer {
            let ok = try await peer.send("setCheckpoint", ["id": .string("k\(i)"), "value": ["seq": 1]] as JSON)
            #expect(ok.kind == .response)
        }
        let over = try await peer.send("setCheckpoint", ["id": "one-more", "value": ["seq": 1]] as JSON)
        #expect(over.kind == .error)
        #expect(over.carriedError.code == "forbidden")
        // Rewriting one it has is fine; an oversized value is not.
        let again = try await peer.send("setCheckpoint", ["id": "k0", "value": ["seq": 2]] as JSON)
        #expect(again.kind == .response)
        let big = String(repeating: "x", count: CheckpointQuota.maxCheckpointBytes)
        let huge = try await peer.send("setCheckpoint", ["id": "k1", "value": ["pad": .string(big)]] as JSON)
        #expect(huge.kind == .error)
    }

    @Test func nothingComesInUnderTheReservedNamespaceButGroupEntries() async throws {
        let node = try DocumentStore.inMemory()
        let attacker = try DocumentStore.inMemory()
        let rev = try attacker.put(try DocumentID("_ferry/hidden", allowReserved: true), body: ["x": 1])
        var peer = try await RestrictedSession(store: node, policy: .trusted)
        #expect(try await peer.push([(try DocumentID("_ferry/hidden", allowReserved: true), rev)], from: attacker) == ["rejected"])
        #expect(try node.document(try DocumentID("_ferry/hidden", allowReserved: true)) == nil)
    }
}

@Suite(.timeLimit(.minutes(5))) struct PusherAccessTests {
    @Test func aPusherSendsAPeerOnlyWhatThePeersReadPolicyAdmits() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        try local.put(docID("public/1"), body: ["v": 1])
        try local.put(docID("private/1"), body: ["v": 2])
        try local.put(docID("mixed"), body: ["type": "note"])
        let r = await sync(local, remote, direction: .push) {
            $0.remotePolicy = PeerPolicy(read: AccessRule(idPrefixes: ["public/"]))
        }
        #expect(r.status.error == nil)
        #expect(try remote.document(docID("public/1")) != nil)
        #expect(try remote.document(docID("private/1")) == nil)
        #expect(try remote.document(docID("mixed")) == nil)
    }

    @Test func widerReadPolicyPushesWhatItNewlyAdmits() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        try local.put(docID("public/1"), body: ["v": 1])
        try local.put(docID("private/1"), body: ["v": 2])
        _ = await sync(local, remote, direction: .push) { $0.remotePolicy = PeerPolicy(read: AccessRule(idPrefixes: ["public/"])) }
        #expect(try remote.document(docID("private/1")) == nil)
        _ = await sync(local, remote, direction: .push) { $0.remotePolicy = PeerPolicy(read: AccessRule(idPrefixes: ["public/", "private/"])) }
        #expect(try remote.document(docID("private/1")) != nil)
    }
}
