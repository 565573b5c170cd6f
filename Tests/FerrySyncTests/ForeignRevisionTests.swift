import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// Revisions whose IDs were made elsewhere (CouchDB's `N-<32 hex>`, other hashes) at the
/// trust boundary and in replication between Ferry nodes.
@Suite(.timeLimit(.minutes(10))) struct ForeignRevisionTests {
    static let md5a = "9c65296036141e575d32ba9c034dd3ee"
    static let md5b = "4a7fd0f46a4c0a0ba4d2c2e4c5e1d9b0"

    func rev(_ text: String) -> RevisionID { try! RevisionID(text) }

    func wire(
        _ id: String, _ rev: String, history: [String] = [], deleted: Bool = false, body: String = #"{"v":1}"#,
        deltaBase: String? = nil
    ) -> WireRevision {
        WireRevision(
            id: id, rev: rev, history: history, deleted: deleted, hlc: 0, content: Array(body.utf8), deltaBase: deltaBase)
    }

    func stage(_ outcome: IncomingPipeline.Outcome) -> Rejection.Stage? {
        if case .rejected(_, _, let r) = outcome { return r.stage }
        return nil
    }

    var pipeline: IncomingPipeline {
        IncomingPipeline(
            policy: PeerPolicy(write: AccessRule(idPrefixes: ["public/"]), mayDelete: false),
            filter: RevisionFilter(name: "unblocked") { $0.body["blocked"] != true }, maxBodyBytes: 1000)
    }

    @Test func aForeignRevisionSkipsOnlyTheDigestStage() throws {
        let p = pipeline
        let noBase: (DocumentID, RevisionID) -> [String: JSON]? = { _, _ in nil }
        guard case .accepted(let accepted) = p.check(wire("public/1", "1-" + Self.md5a), baseBody: noBase) else {
            Issue.record("a foreign revision within policy and filter is accepted")
            return
        }
        #expect(accepted.isUnverifiable)
        #expect(accepted.revision.description == "1-" + Self.md5a)
        // Structure, the peer's policy and the pull filter still apply.
        #expect(stage(p.check(wire("admin/1", "1-" + Self.md5a), baseBody: noBase)) == .policy)
        #expect(stage(p.check(wire("public/2", "1-" + Self.md5a, deleted: true), baseBody: noBase)) == .policy)
        #expect(stage(p.check(wire("public/3", "1-" + Self.md5a, body: #"{"blocked":true}"#), baseBody: noBase)) == .filter)
        #expect(stage(p.check(wire("public/4", "3-" + Self.md5a, history: ["1-" + Self.md5b]), baseBody: noBase)) == .structure)
        #expect(stage(p.check(wire("public/5", "1-" + Self.md5a, body: "[1]"), baseBody: noBase)) == .structure)
        #expect(stage(p.check(wire("public/6", "1-" + Self.md5a, body: "{\"v\":\"" + String(repeating: "x", count: 1000) + "\"}"), baseBody: noBase)) == .structure)
        #expect(stage(p.check(wire("public/7", "1-nöt"), baseBody: noBase)) == .structure)
    }

    @Test func aFerryFormRevisionIsDigestCheckedWhateverItsSpelling() throws {
        let p = pipeline
        let noBase: (DocumentID, RevisionID) -> [String: JSON]? = { _, _ in nil }
        let real = RevisionID.compute(parent: nil, deleted: false, canonicalBody: Array(#"{"v":1}"#.utf8))
        guard case .accepted(let accepted) = p.check(wire("public/1", real.description), baseBody: noBase) else {
            Issue.record("the real body is accepted")
            return
        }
        #expect(!accepted.isUnverifiable)
        #expect(stage(p.check(wire("public/1", real.description, body: #"{"v":2}"#), baseBody: noBase)) == .digest)
        // A zero-padded generation is the same ID, so it is checked the same.
        #expect(stage(p.check(wire("public/1", "0001-" + real.hashText, body: #"{"v":2}"#), baseBody: noBase)) == .digest)
        // The uppercase spelling is another revision: accepted unverified, never as the Ferry one.
        guard case .accepted(let upper) = p.check(wire("public/1", "1-" + real.hashText.uppercased(), body: #"{"v":2}"#), baseBody: noBase)
        else {
            Issue.record("the uppercase spelling is a foreign ID")
            return
        }
        #expect(upper.isUnverifiable)
        #expect(upper.revision != real)
    }

    @Test func aForeignRevisionsBodyIsReencodedAndNeverTakenAsADelta() throws {
        let p = pipeline
        let base: (DocumentID, RevisionID) -> [String: JSON]? = { _, _ in ["v": 1] }
        guard case .accepted(let r) = p.check(wire("public/1", "1-" + Self.md5a, body: #"{ "b":1 , "a":2 }"#), baseBody: base) else {
            Issue.record("a non-canonical foreign body is accepted")
            return
        }
        #expect(r.canonicalBody == Array(#"{"a":2,"b":1}"#.utf8))
        let delta = wire("public/1", "2-" + Self.md5b, history: ["1-" + Self.md5a], body: #"{"v":2}"#, deltaBase: "1-" + Self.md5a)
        guard case .needFull = p.check(delta, baseBody: base) else {
            Issue.record("a delta for a foreign revision is asked again in full")
            return
        }
        // Senders never delta-encode one either.
        var tree = RevisionTree()
        let big = JSON.object(["text": .string(String(repeating: "lorem ", count: 200)), "n": 1]).canonicalBytes
        let bigger = JSON.object(["text": .string(String(repeating: "lorem ", count: 200)), "n": 2]).canonicalBytes
        try tree.insert(rev("1-" + Self.md5a), history: [], deleted: false, body: big, hlc: .zero)
        try tree.insert(rev("2-" + Self.md5b), history: [rev("1-" + Self.md5a)], deleted: false, body: bigger, hlc: .zero)
        let made = try #require(
            WireRevision.make(
                id: docID("d"), revision: rev("2-" + Self.md5b), tree: tree, receiverHas: [rev("1-" + Self.md5a)],
                useDeltas: true, maxHistory: 10))
        #expect(!made.usedDelta)
        #expect(made.0.content == bigger)
    }

    @Test func aMixedHistoryReplicatesBetweenFerryNodesAndBothAgreeOnWinnerAndLeaves() async throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let metricsA = CountingMetrics()
        let metricsB = CountingMetrics()
        var responderB = ReplicationResponder.Options()
        responderB.metrics = metricsB.sync
        let id = docID("d")
        let text = String(repeating: "lorem ipsum ", count: 300)
        // A history that came from CouchDB: 1-<32 hex>, 2-<32 hex>.
        let couch1 = rev("1-" + Self.md5a)
        let couch2 = rev("2-" + Self.md5b)
        _ = try a.insertRevisions([
            IncomingRevision(id: id, revision: couch2, history: [couch1], deleted: false, body: ["text": .string(text), "n": 2])
        ])
        await sync(a, b, configure: { $0.wiring.metrics = metricsA.sync }, responder: responderB)
        #expect(try b.document(id)?.revision == couch2)
        #expect(try b.revisionTree(id)?.history(of: couch2) == [couch2, couch1])
        #expect(metricsB["ferry_sync_unverifiable_revisions_total"] == 1)

        // A local edit on the foreign revision travels as a delta against it.
        let ferry3 = try a.put(id, body: ["text": .string(text), "n": 3], parent: couch2)
        #expect(ferry3.isFerryDigest)
        let edit = await sync(a, b, direction: .push)
        #expect(edit.summary.deltasSent == 1)
        #expect(try b.document(id)?.revision == ferry3)
        #expect(try b.document(id)?.body["n"] == 3)

        // Conflicts on both sides: a Ferry edit on A; a Ferry edit and a CouchDB-made sibling on B.
        let fromA = try a.put(id, body: ["text": .string(text), "n": 4, "by": "a"], parent: ferry3)
        let fromB = try b.put(id, body: ["text": .string(text), "n": 4, "by": "b"], parent: ferry3)
        let couch4 = rev("4-00" + String(Self.md5a.dropFirst(2)))  // first byte 0x00: below any text
        let couch4High = rev("4-ff" + String(Self.md5a.dropFirst(2)))  // 0xff: above any text
        _ = try b.insertRevisions([
            IncomingRevision(
                id: id, revision: couch4, history: [ferry3, couch2, couch1], deleted: false, body: ["n": 4, "by": "couch"]),
            IncomingRevision(
                id: id, revision: couch4High, history: [ferry3, couch2, couch1], deleted: true, body: [:]),
        ])
        let before = metricsA["ferry_sync_unverifiable_revisions_total"]
        await sync(a, b, configure: { $0.wiring.metrics = metricsA.sync }, responder: responderB)
        #expect(metricsA["ferry_sync_unverifiable_revisions_total"] - before == 2)
        #expect(try digest(a) == digest(b))
        let treeA = try #require(try a.revisionTree(id))
        let treeB = try #require(try b.revisionTree(id))
        #expect(Set(treeA.leaves.map(\.id)) == Set([fromA, fromB, couch4, couch4High]))
        #expect(Set(treeB.leaves.map(\.id)) == Set(treeA.leaves.map(\.id)))
        // CouchDB's rule: the deleted 0xff… leaf loses to every live one; the 0x00… hash loses
        // to both Ferry digests (text bytes 0x30–0x66); the two Ferry digests by their text.
        let ferryLeaves = [fromA, fromB].sorted { $0.hashText > $1.hashText }
        let doc = try #require(try a.document(id))
        #expect(doc.revision == ferryLeaves[0])
        #expect(doc.conflicts == [ferryLeaves[1], couch4])
        #expect(try b.document(id)?.revision == doc.revision)
        #expect(try b.document(id)?.conflicts == doc.conflicts)
    }
}
