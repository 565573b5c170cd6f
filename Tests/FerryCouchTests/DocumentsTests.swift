import FerryCore
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import HTTPTypes
import Testing

@testable import FerryCouch

/// The Ferry-form revision a body gets as a child of `parent`.
func ferryRev(_ body: JSON, parent: String? = nil, deleted: Bool = false) -> String {
    RevisionID.compute(parent: parent.map { try! RevisionID($0) }, deleted: deleted, canonicalBody: body.canonicalBytes)
        .description
}

func hashPart(_ rev: String) -> String { String(rev.split(separator: "-", maxSplits: 1)[1]) }

/// A CouchDB-style document of an existing revision with its `_revisions`.
func replicated(_ id: String, _ rev: String, history: [String], _ fields: [String: JSON], deleted: Bool = false) -> JSON {
    var f = fields
    f["_id"] = .string(id)
    f["_rev"] = .string(rev)
    if deleted { f["_deleted"] = true }
    f["_revisions"] = [
        "start": .int(Int64(rev.split(separator: "-")[0])!),
        "ids": .array(([rev] + history).map { .string(hashPart($0)) }),
    ]
    return .object(f)
}

@Suite struct DocumentsTests {
    @Test func putThenGetReturnsTheFieldsWithIdAndRev() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["name": "ada", "n": 1])
            let reply = try await c.get("/ferry/a")
            #expect(reply.status == .ok)
            #expect(reply.json == .object(["_id": "a", "_rev": .string(rev), "name": "ada", "n": 1]))
            #expect(reply.headers[.eTag] == "\"\(rev)\"")
            let head = try await c.send(.head, "/ferry/a")
            #expect(head.status == .ok && head.bytes.isEmpty && head.headers[.eTag] == "\"\(rev)\"")
            let cached = try await c.get("/ferry/a", headers: [.ifNoneMatch: "\"\(rev)\""])
            #expect(cached.status == .notModified && cached.bytes.isEmpty)
        }
    }

    @Test func updateWithoutTheCurrentRevisionIsAConflict() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1])
            let noRev = try await c.send(.put, "/ferry/a", json: ["v": 2])
            #expect(noRev.status == .conflict)
            #expect(noRev.json == ["error": "conflict", "reason": "Document update conflict."])
            let rev2 = try await c.put("a", ["v": 2, "_rev": .string(rev)])
            let stale = try await c.send(.put, "/ferry/a?rev=\(rev)", json: ["v": 3])
            #expect(stale.status == .conflict)
            let viaIfMatch = try await c.send(.put, "/ferry/a", json: ["v": 3], headers: [.ifMatch: "\"\(rev2)\""])
            #expect(viaIfMatch.status == .created)
        }
    }

    @Test func revisionsInQueryAndBodyMustAgree() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1])
            let other = ferryRev(["x": 1])
            let reply = try await c.send(.put, "/ferry/a?rev=\(rev)", json: ["v": 2, "_rev": .string(other)])
            #expect(reply.status == .badRequest)
        }
    }

    @Test func postStoresADocumentWithAGeneratedIDWhenItNamesNone() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let reply = try await c.send(.post, "/ferry", json: ["v": 1])
            #expect(reply.status == .created)
            let id = reply.json["id"]!.stringValue!
            #expect(id.count == 32)
            #expect(try await c.get("/ferry/\(id)").json["v"] == 1)
            let named = try await c.send(.post, "/ferry", json: ["_id": "given", "v": 2])
            #expect(named.json["id"] == "given")
            let notJSON = try await c.send(.post, "/ferry", headers: [.contentType: "text/plain"], bytes: Array("{}".utf8))
            #expect(notJSON.status == .unsupportedMediaType)
        }
    }

    @Test func deletedDocumentIsNotFoundDeletedUnlessRevNamesIt() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1])
            let del = try await c.send(.delete, "/ferry/a?rev=\(rev)")
            #expect(del.status == .ok || del.status == .created)
            let tombstone = del.json["rev"]!.stringValue!
            let gone = try await c.get("/ferry/a")
            #expect(gone.status == .notFound)
            #expect(gone.json == ["error": "not_found", "reason": "deleted"])
            let named = try await c.get("/ferry/a?rev=\(tombstone)")
            #expect(named.status == .ok)
            #expect(named.json == .object(["_id": "a", "_rev": .string(tombstone), "_deleted": true]))
            let missing = try await c.get("/ferry/nope")
            #expect(missing.json == ["error": "not_found", "reason": "missing"])
        }
    }

    @Test func deleteWithoutRevisionIsAConflict() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            _ = try await c.put("a", ["v": 1])
            #expect(try await c.send(.delete, "/ferry/a").status == .conflict)
        }
    }

    @Test func unknownSpecialMemberIsRefusedAndNothingIsStored() async throws {
        let f = try CouchFixture()
        let before = try storeSnapshot(f.store)
        try await f.run { c in
            let reply = try await c.send(.put, "/ferry/a", json: ["_foo": 1, "v": 1])
            #expect(reply.status == .badRequest)
            #expect(reply.json == ["error": "doc_validation", "reason": "Bad special document member: _foo"])
            let internalName = try await c.send(.put, "/ferry/a", json: ["@attachments": [:]])
            #expect(internalName.status == .badRequest)
            let malformed = try await c.send(.put, "/ferry/a", headers: [.contentType: "application/json"], bytes: Array("{".utf8))
            #expect(malformed.json["error"] == "bad_request")
            let badRev = try await c.send(.put, "/ferry/a?rev=banana", json: ["v": 1])
            #expect(badRev.json == ["error": "bad_request", "reason": "Invalid rev format"])
        }
        #expect(try storeSnapshot(f.store) == before)
    }

    @Test func ignoredSpecialMembersAreNotStored() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let rev = try await c.put("a", ["v": 1, "_conflicts": [], "_revs_info": [], "_local_seq": 3])
            #expect(try await c.get("/ferry/a").json == .object(["_id": "a", "_rev": .string(rev), "v": 1]))
        }
        #expect(try f.store.document(DocumentID("a"))?.body == ["v": 1])
    }

    @Test func designDocumentsAreOrdinaryDocuments() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            // Replication between Ferry peers admits them as it admits Ferry's own IDs.
            #expect(try DocumentID("_design/app", allowReserved: true).rawValue == "_design/app")
            let rev = try await c.put("_design/app", ["views": [:]])
            #expect(try await c.get("/ferry/_design/app").json["_rev"] == .string(rev))
            let reserved = try await c.send(.post, "/ferry/_bulk_docs", json: ["docs": [["_id": "_other"], ["_id": "_ferry/x"]]])
            #expect(reserved.json.arrayItems.map { $0["error"] } == ["illegal_docid", "illegal_docid"])
        }
    }

    @Test func revsAndRevsInfoDescribeTheHistoryNewestFirst() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let r1 = try await c.put("a", ["v": 1])
            let r2 = try await c.put("a", ["v": 2, "_rev": .string(r1)])
            let reply = try await c.get("/ferry/a?revs=true&revs_info=true&local_seq=true")
            #expect(reply.json["_revisions"] == ["start": 2, "ids": [.string(hashPart(r2)), .string(hashPart(r1))]])
            #expect(
                reply.json["_revs_info"]
                    == [["rev": .string(r2), "status": "available"], ["rev": .string(r1), "status": "available"]])
            #expect(reply.json["_local_seq"] == 2)
            let old = try await c.get("/ferry/a?rev=\(r1)")
            #expect(old.json["v"] == 1)
        }
    }

    @Test func conflictsAndDeletedConflictsListTheOtherLeaves() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let r1 = try await c.put("a", ["v": 1])
            let b2: JSON = ["v": "b"]
            let c2: JSON = ["v": "c"]
            let d2: JSON = [:]
            let rb = ferryRev(b2, parent: r1)
            let rc = ferryRev(c2, parent: r1)
            let rd = ferryRev(d2, parent: r1, deleted: true)
            let reply = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: [
                    "new_edits": false,
                    "docs": [
                        replicated("a", rb, history: [r1], ["v": "b"]), replicated("a", rc, history: [r1], ["v": "c"]),
                        replicated("a", rd, history: [r1], [:], deleted: true),
                    ],
                ])
            #expect(reply.status == .created)
            #expect(reply.json == [])
            let winner = max(rb, rc)
            let loser = min(rb, rc)
            let doc = try await c.get("/ferry/a?conflicts=true&deleted_conflicts=true")
            #expect(doc.json["_rev"] == .string(winner))
            #expect(doc.json["_conflicts"] == [.string(loser)])
            #expect(doc.json["_deleted_conflicts"] == [.string(rd)])
        }
    }

    @Test func openRevsAllListsEveryLeafAndAListNamesMissingOnes() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let r1 = try await c.put("a", ["v": 1])
            let r2 = try await c.put("a", ["v": 2, "_rev": .string(r1)])
            let rb = ferryRev(["v": "b"], parent: r1)
            _ = try await c.send(
                .post, "/ferry/_bulk_docs", json: ["new_edits": false, "docs": [replicated("a", rb, history: [r1], ["v": "b"])]])
            let all = try await c.get("/ferry/a?open_revs=all")
            guard case .array(let items) = all.json else { Issue.record("not an array: \(all.text)"); return }
            #expect(Set(items.compactMap { $0["ok"]?["_rev"]?.stringValue }) == [rb, r2])
            let unknown = "9-" + String(repeating: "ab", count: 32)
            let listed = try await c.get("/ferry/a?open_revs=" + "[\"\(r1)\",\"\(unknown)\"]".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)
            #expect(listed.json == [["ok": .object(["_id": "a", "_rev": .string(r1), "v": 1])], ["missing": .string(unknown)]])
            let latest = try await c.get("/ferry/a?latest=true&revs=true&open_revs=" + "[\"\(r1)\"]".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)
            guard case .array(let leaves) = latest.json else { Issue.record("not an array"); return }
            #expect(Set(leaves.compactMap { $0["ok"]?["_rev"]?.stringValue }) == [rb, r2])
            #expect(leaves.first?["ok"]?["_revisions"]?["ids"]?.arrayCount == 2)
            let revLatest = try await c.get("/ferry/a?rev=\(r1)&latest=true")
            #expect(revLatest.json["_rev"] == .string(max(rb, r2)))
        }
    }

    @Test func newEditsFalseOnPutStoresTheGivenRevision() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let r1 = ferryRev(["v": 1])
            let reply = try await c.send(.put, "/ferry/a?new_edits=false", json: ["_rev": .string(r1), "v": 1])
            #expect(reply.status == .created)
            #expect(reply.json["rev"] == .string(r1))
            let forged = try await c.send(.put, "/ferry/b?new_edits=false", json: ["_rev": .string(r1), "v": 2])
            #expect(forged.status == .badRequest)
            #expect(try await c.get("/ferry/b").status == .notFound)
        }
    }

    @Test func writePolicyForbidsAndReadPolicyHides() async throws {
        let f = try CouchFixture()
        _ = try f.store.put(DocumentID("secret"), body: ["v": 1])
        _ = try f.store.put(DocumentID("pub-1"), body: ["v": 1])
        let policy = PeerPolicy(read: AccessRule(idPrefixes: ["pub-"]), write: AccessRule(idPrefixes: ["pub-"]), mayDelete: false)
        try await f.run(as: .user(name: "u", policy: policy)) { c in
            #expect(try await c.get("/ferry/secret").status == .notFound)
            #expect(try await c.get("/ferry/pub-1").status == .ok)
            let denied = try await c.send(.put, "/ferry/other", json: ["v": 1])
            #expect(denied.status == .forbidden)
            #expect(denied.json["error"] == "forbidden")
            let rev = try await c.get("/ferry/pub-1").json["_rev"]!.stringValue!
            #expect(try await c.send(.delete, "/ferry/pub-1?rev=\(rev)").status == .forbidden)
            let bulk = try await c.send(.post, "/ferry/_bulk_docs", json: ["docs": [["_id": "pub-2"], ["_id": "x"]]])
            #expect(bulk.json.arrayItems.map { $0["error"] } == [nil, "forbidden"])
        }
        let anonymous = try await f.run(as: nil) { c in try await c.get("/ferry/pub-1") }
        #expect(anonymous.status == .unauthorized)
    }

    @Test func pullFilterRefusesReplicatedRevisions() async throws {
        let filter = RevisionFilter(name: "no-b") { !$0.id.rawValue.hasPrefix("b") }
        let f = try CouchFixture(pullFilter: filter)
        try await f.run { c in
            let ra = ferryRev(["v": 1])
            let reply = try await c.send(
                .post, "/ferry/_bulk_docs",
                json: ["new_edits": false, "docs": [replicated("a", ra, history: [], ["v": 1]), replicated("b", ra, history: [], ["v": 1])]])
            #expect(reply.json.arrayItems.count == 1)
            #expect(reply.json.arrayItems.first?["id"] == "b")
            #expect(reply.json.arrayItems.first?["error"] == "forbidden")
            #expect(try await c.get("/ferry/a").status == .ok)
            #expect(try await c.get("/ferry/b").status == .notFound)
        }
    }

    @Test func invalidQueryValuesAndOversizedBodiesAreRefused() async throws {
        let f = try CouchFixture(maxRequestBytes: 64)
        try await f.run { c in
            _ = try await c.put("a", ["v": 1])
            let badBool = try await c.get("/ferry/a?revs=yes")
            #expect(badBool.status == .badRequest)
            let badList = try await c.get("/ferry/a?open_revs=nope")
            #expect(badList.status == .badRequest)
            let big = try await c.send(.put, "/ferry/b", json: ["v": .string(String(repeating: "x", count: 100))])
            #expect(big.status == .contentTooLarge)
            #expect(big.json["error"] == "too_large")
            #expect(try await c.get("/ferry/b").status == .notFound)
        }
    }

    @Test func copyIsNotSupported() async throws {
        let f = try CouchFixture()
        try await f.run { c in
            let reply = try await c.send(HTTPRequest.Method("COPY")!, "/ferry/a", headers: [HTTPField.Name("Destination")!: "b"])
            #expect(reply.status == .methodNotAllowed)
            #expect(reply.json["error"] == "method_not_allowed")
        }
    }
}

extension JSON {
    var arrayItems: [JSON] {
        if case .array(let a) = self { return a }
        return []
    }
    var arrayCount: Int { arrayItems.count }
}
