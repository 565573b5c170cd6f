import FerryCore
import FerryStore
import FerrySync
import Foundation
import Testing

@testable import FerryCouch
@testable import FerryCouchClient
@testable import FerryCouchDocuments

/// How a local revision is rendered for a CouchDB target's `_bulk_docs` with `new_edits: false`.
@Suite struct CouchOutgoingDocumentTests {
    /// The full wire form of a held revision, as the Pusher makes it for this remote.
    static func wire(_ store: DocumentStore, _ id: String, _ rev: RevisionID) throws -> (WireRevision, RevisionTree) {
        let docID = try DocumentID(id, allowReserved: true)
        let tree = try #require(try store.revisionTree(docID))
        let (wire, usedDelta) = try #require(
            WireRevision.make(id: docID, revision: rev, tree: tree, receiverHas: [], useDeltas: true, maxHistory: 100))
        #expect(!usedDelta)
        return (wire, tree)
    }

    /// A body with one attachment of `bytes`, first attached at `revpos`.
    static func withAttachment(
        _ fields: [String: JSON], name: String, bytes: [UInt8], revpos: Int, store: DocumentStore, contentType: String = "text/plain"
    ) throws -> JSON {
        _ = try store.blobs.put(bytes)
        var f = fields
        f[StoredAttachment.bodyKey] = [name: StoredAttachment(bytes: bytes, contentType: contentType, revpos: revpos).json]
        return .object(f)
    }

    @Test func aRevisionBecomesACouchDocumentWithItsHistoryAndOnlyTheUsersMembers() throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("doc")
        let r1 = try store.put(id, body: ["n": 1])
        let r2 = try store.put(id, body: ["n": 2], parent: r1)
        let r3 = try store.put(id, body: ["n": 3, "name": "x"], parent: r2)
        let (wire, tree) = try Self.wire(store, "doc", r3)
        let out = try CouchOutgoingDocument(wire, targetHolds: [], tree: tree, blobs: store.blobs)
        #expect(out.json == [
            "_id": "doc", "_rev": .string(r3.description), "n": 3, "name": "x",
            "_revisions": ["start": 3, "ids": [.string(r3.hashText), .string(r2.hashText), .string(r1.hashText)]],
        ])
        #expect(out.bytes == out.json.canonicalBytes)
        #expect(out.inlineAttachments.isEmpty && out.stubAttachments.isEmpty)
    }

    @Test func aTombstoneSaysDeletedAndKeepsItsProperties() throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("gone")
        let r1 = try store.put(id, body: ["type": "note"])
        let r2 = try store.delete(id, revision: r1, keepProperties: true)
        let (wire, tree) = try Self.wire(store, "gone", r2)
        let out = try CouchOutgoingDocument(wire, targetHolds: [r1], tree: tree, blobs: store.blobs)
        #expect(out.json["_deleted"] == true)
        #expect(out.json["type"] == "note")
        #expect(out.json["_revisions"] == ["start": 2, "ids": [.string(r2.hashText), .string(r1.hashText)]])
    }

    @Test func aRevisionMadeByCouchDBKeepsItsIDAndHashes() throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("couch")
        let r1 = try RevisionID("1-" + String(repeating: "a", count: 32))
        let r2 = try RevisionID("2-" + String(repeating: "b", count: 32))
        _ = try store.insertRevisions([
            IncomingRevision(id: id, revision: r1, history: [], deleted: false, body: ["v": 1]),
            IncomingRevision(id: id, revision: r2, history: [r1], deleted: false, body: ["v": 2]),
        ])
        let (wire, tree) = try Self.wire(store, "couch", r2)
        let out = try CouchOutgoingDocument(wire, targetHolds: [], tree: tree, blobs: store.blobs)
        #expect(out.json["_rev"] == .string(r2.description))
        #expect(out.json["_revisions"] == ["start": 2, "ids": [.string(String(repeating: "b", count: 32)), .string(String(repeating: "a", count: 32))]])
    }

    @Test func anAttachmentGoesInlineWhenTheTargetHoldsNoAncestor() throws {
        let store = try DocumentStore.inMemory()
        let bytes = Array("hello attachment".utf8)
        let r1 = try store.put(try DocumentID("a"), body: try Self.withAttachment(["t": 1], name: "note.txt", bytes: bytes, revpos: 1, store: store))
        let (wire, tree) = try Self.wire(store, "a", r1)
        let out = try CouchOutgoingDocument(wire, targetHolds: [], tree: tree, blobs: store.blobs)
        let att = try #require(out.json["_attachments"]?["note.txt"])
        #expect(att["data"] == .string(Data(bytes).base64EncodedString()))
        #expect(att["digest"] == .string(StoredAttachment.md5Digest(bytes)))
        #expect(att["length"] == .int(Int64(bytes.count)))
        #expect(att["content_type"] == "text/plain")
        #expect(att["revpos"] == 1)
        #expect(att["stub"] == nil)
        #expect(out.json[StoredAttachment.bodyKey] == nil)
        #expect(out.inlineAttachments == ["note.txt"])
    }

    @Test func anAttachmentTheTargetHoldsThroughAnAncestorGoesAsAStubAndANewOneInline() throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("a")
        let old = Array("old".utf8)
        let new = Array("new".utf8)
        let body1 = try Self.withAttachment(["t": 1], name: "old.txt", bytes: old, revpos: 1, store: store)
        let r1 = try store.put(id, body: body1)
        _ = try store.blobs.put(new)
        var f = try #require(body1.objectValue)
        var atts = try #require(f[StoredAttachment.bodyKey]?.objectValue)
        atts["new.txt"] = StoredAttachment(bytes: new, contentType: "text/plain", revpos: 2).json
        f[StoredAttachment.bodyKey] = .object(atts)
        f["t"] = 2
        let r2 = try store.put(id, body: .object(f), parent: r1)
        let (wire, tree) = try Self.wire(store, "a", r2)
        let out = try CouchOutgoingDocument(wire, targetHolds: [r1], tree: tree, blobs: store.blobs)
        #expect(out.json["_attachments"]?["old.txt"]?["stub"] == true)
        #expect(out.json["_attachments"]?["old.txt"]?["data"] == nil)
        #expect(out.json["_attachments"]?["old.txt"]?["revpos"] == 1)
        #expect(out.json["_attachments"]?["new.txt"]?["data"] == .string(Data(new).base64EncodedString()))
        #expect(out.stubAttachments == ["old.txt"] && out.inlineAttachments == ["new.txt"])

        // Told to send every content (the target could not match a stub), nothing is a stub.
        let full = try CouchOutgoingDocument(wire, targetHolds: [r1], tree: tree, blobs: store.blobs, stubs: false)
        #expect(full.stubAttachments.isEmpty && Set(full.inlineAttachments) == ["old.txt", "new.txt"])
    }

    @Test func aPossibleAncestorOnAnotherBranchDoesNotMakeAStub() throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("a")
        let bytes = Array("shared".utf8)
        let body1 = try Self.withAttachment(["t": 1], name: "s.txt", bytes: bytes, revpos: 1, store: store)
        let r1 = try store.put(id, body: body1)
        var f = try #require(body1.objectValue)
        f["t"] = 2
        let r2a = try store.put(id, body: .object(f), parent: r1)
        f["t"] = 3
        let bodyB = JSON.object(f)
        let r2b = RevisionID.compute(parent: r1, deleted: false, canonicalBody: bodyB.canonicalBytes)
        _ = try store.insertRevisions([IncomingRevision(id: id, revision: r2b, history: [r1], deleted: false, body: bodyB)])
        let (wire, tree) = try Self.wire(store, "a", r2a)
        // The target names its other leaf r2b, which is not on r2a's path.
        let out = try CouchOutgoingDocument(wire, targetHolds: [r2b], tree: tree, blobs: store.blobs)
        #expect(out.inlineAttachments == ["s.txt"])
        let onPath = try CouchOutgoingDocument(wire, targetHolds: [r2b, r1], tree: tree, blobs: store.blobs)
        #expect(onPath.stubAttachments == ["s.txt"])
    }

    @Test func aBlobReferenceTravelsAsAnAttachmentNamedByItsDigestWithTheRevposOfItsFirstReference() throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("b")
        let ref = try store.blobs.put(Array("blob bytes".utf8), contentType: "image/png")
        let r1 = try store.put(id, body: ["photo": ref.json, "v": 1])
        let r2 = try store.put(id, body: ["photo": ref.json, "v": 2], parent: r1)
        let name = ref.digest.description

        let (wire1, tree1) = try Self.wire(store, "b", r1)
        let first = try CouchOutgoingDocument(wire1, targetHolds: [], tree: tree1, blobs: store.blobs)
        #expect(first.json["_attachments"]?[name]?["data"] == .string(Data("blob bytes".utf8).base64EncodedString()))
        #expect(first.json["_attachments"]?[name]?["revpos"] == 1)
        #expect(first.json["photo"] == ref.json)

        let (wire2, tree2) = try Self.wire(store, "b", r2)
        let second = try CouchOutgoingDocument(wire2, targetHolds: [r1], tree: tree2, blobs: store.blobs)
        #expect(second.json["_attachments"]?[name]?["stub"] == true)
        #expect(second.json["_attachments"]?[name]?["revpos"] == 1)
        let unheld = try CouchOutgoingDocument(wire2, targetHolds: [], tree: tree2, blobs: store.blobs)
        #expect(unheld.json["_attachments"]?[name]?["revpos"] == 1)
        #expect(unheld.inlineAttachments == [name])
    }

    @Test func aDeltaAnUnreadableBodyOrAMissingAttachmentIsRefusedWithAReason() throws {
        let store = try DocumentStore.inMemory()
        let delta = WireRevision(id: "d", rev: "2-" + String(repeating: "c", count: 64), history: [], deleted: false, hlc: 0, content: Array("{}".utf8), deltaBase: "1-x")
        #expect(throws: CouchOutgoingDocument.Failure.self) { try CouchOutgoingDocument(delta, targetHolds: [], tree: nil, blobs: store.blobs) }
        let notJSON = WireRevision(id: "d", rev: "1-" + String(repeating: "c", count: 32), history: [], deleted: false, hlc: 0, content: Array("[1]".utf8), deltaBase: nil)
        #expect(throws: CouchOutgoingDocument.Failure.self) { try CouchOutgoingDocument(notJSON, targetHolds: [], tree: nil, blobs: store.blobs) }
        let lost = StoredAttachment(bytes: Array("never stored".utf8), contentType: "text/plain", revpos: 1)
        let body: JSON = [StoredAttachment.bodyKey: ["x.txt": lost.json]]
        let noBlob = WireRevision(id: "d", rev: "1-" + String(repeating: "c", count: 32), history: [], deleted: false, hlc: 0, content: body.canonicalBytes, deltaBase: nil)
        do {
            _ = try CouchOutgoingDocument(noBlob, targetHolds: [], tree: nil, blobs: store.blobs)
            Issue.record("a missing attachment was rendered")
        } catch {
            #expect(error.reason.contains("x.txt"))
        }
    }
}
