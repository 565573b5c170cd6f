import FerryCore
import FerryStore
import Testing

@testable import FerrySync

/// The trees a responder keeps from its changes replies for the getRevs that follow them.
@Suite struct ResponderTreeCacheTests {
    func changesThenGetRevs(_ store: DocumentStore, between: () throws -> Void, asking: [(DocumentID, RevisionID)]) async throws
        -> (kept: Int, sent: [WireRevision])
    {
        var peer = try await RestrictedSession(store: store, policy: .trusted)
        _ = try await peer.send("changes", ["since": 0, "limit": 100] as JSON)
        let kept = peer.session.recentTrees.withLock { $0.count }
        try between()
        return (kept, try await peer.getRevs(asking))
    }

    @Test func getRevsAfterChangesSendsTheRevisionsThatReadNamedFromTheSameRead() async throws {
        let store = try DocumentStore.inMemory()
        var revs: [(DocumentID, RevisionID)] = []
        for i in 0..<5 { revs.append((try DocumentID("doc-\(i)"), try store.put(try DocumentID("doc-\(i)"), body: ["n": .int(Int64(i))]))) }
        let (kept, sent) = try await changesThenGetRevs(store, between: {}, asking: revs)
        #expect(kept == 5)
        #expect(sent.map(\.rev) == revs.map(\.1.description))
        #expect(try sent.map { try JSON.parse($0.content) } == (0..<5).map { ["n": .int(Int64($0))] as JSON })
    }

    @Test func aDocumentPurgedAfterTheChangesReadIsNeverSentFromWhatThatReadKept() async throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("secret")
        let rev = try store.put(id, body: ["pin": "4711"])
        let (kept, sent) = try await changesThenGetRevs(store, between: { _ = try store.purge(id) }, asking: [(id, rev)])
        #expect(try store.document(id) == nil)
        #expect(kept == 1)
        #expect(sent.isEmpty)
    }

    @Test func aDocumentEditedAfterTheChangesReadStillServesTheRevisionThatReadNamed() async throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("note")
        let first = try store.put(id, body: ["text": "first"])
        var second: RevisionID?
        let (_, sent) = try await changesThenGetRevs(
            store, between: { second = try store.put(id, body: ["text": "second"], parent: first) }, asking: [(id, first)])
        #expect(sent.map(\.rev) == [first.description])
        // Asked again (the cache gave its copy away), the document is read as it stands now.
        var peer = try await RestrictedSession(store: store, policy: .trusted)
        let now = try await peer.getRevs([(id, try #require(second))])
        #expect(try now.map { try JSON.parse($0.content) } == [["text": "second"]])
    }

    @Test func aLargeDocumentIsReadWhenAskedRatherThanKept() async throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("large")
        let text = String(repeating: "x", count: ResponderTreeCache.maxBodyBytes + 1)
        let rev = try store.put(id, body: ["text": .string(text)])
        let (kept, sent) = try await changesThenGetRevs(store, between: {}, asking: [(id, rev)])
        #expect(kept == 0)
        #expect(try sent.map { try JSON.parse($0.content)["text"]?.stringValue } == [text])
    }

    @Test func theCacheKeepsAFewPagesWithinItsByteBudget() throws {
        let store = try DocumentStore.inMemory()
        let body = JSON.object(["text": .string(String(repeating: "y", count: 10_000))])
        for i in 0..<1000 { try store.put(try DocumentID("d\(i)"), body: body) }
        var cache = ResponderTreeCache()
        let page = try store.changesWithTrees(since: 0, limit: 1000, winnerBodiesUpTo: ResponderTreeCache.maxBodyBytes)
        cache.keep(page, purges: 0)
        #expect(cache.count > 0 && cache.count * 10_000 <= ResponderTreeCache.maxBytesPerPage)
        for _ in 0..<ResponderTreeCache.pagesKept { cache.keep(Array(page.suffix(10)), purges: 0) }
        #expect(cache.count == 10 * ResponderTreeCache.pagesKept)
        #expect(cache.take(try DocumentID("d999"), purges: 0) != nil)
        #expect(cache.take(try DocumentID("d999"), purges: 0) != nil)  // kept by an older page too
        #expect(cache.take(try DocumentID("d998"), purges: 1) == nil)  // a purge empties it
        #expect(cache.count == 0)
    }

    @Test func pendingIsDerivedFromTheLastCountAndCountedAgainPeriodically() async throws {
        let store = try DocumentStore.inMemory()
        for i in 0..<100 { try store.put(try DocumentID("p\(i)"), body: ["i": .int(Int64(i))]) }
        var peer = try await RestrictedSession(store: store, policy: .trusted)
        var since: Int64 = 0
        var pendings: [Int64] = []
        for _ in 0..<3 {
            let reply = try await peer.send("changes", ["since": .int(since), "limit": 10] as JSON).json()
            pendings.append(try #require(reply["pending"]?.intValue))
            since = try #require(reply["lastSeq"]?.intValue)
        }
        #expect(pendings == [90, 80, 70])
        // A write after the count shows once the count is taken again.
        try store.put(try DocumentID("late"), body: [:])
        for _ in 0..<ResponderSession.pendingRecount {
            let reply = try await peer.send("changes", ["since": .int(since), "limit": 1] as JSON).json()
            pendings.append(reply["pending"]?.intValue ?? -1)
            since = try #require(reply["lastSeq"]?.intValue)
        }
        #expect(pendings.last == 70 - Int64(ResponderSession.pendingRecount) + 1)
    }

    @Test func aRuleChangedBetweenChangesAndGetRevsJudgesTheKeptTreeAgain() async throws {
        let store = try DocumentStore.inMemory()
        let id = try DocumentID("p-1")
        let rev = try store.put(id, body: ["ward": "a", "text": "notes"])
        func wardRule(_ ward: String) throws -> PeerPolicy {
            PeerPolicy(read: AccessRule(grant: AccessGrant(clauses: [try AccessClause(selector: ["ward": .string(ward)])])))
        }
        let rule = Locked(try wardRule("a"))
        var options = ReplicationResponder.Options()
        options.policyLookup = { _ in rule.withLock { $0 } }
        let session = ResponderSession(responder: ReplicationResponder(store: store, options: options), authenticatedPeer: "peer-b")
        var peer = RestrictedSession(session: session)
        _ = try await peer.send("hello", ["nodeID": "peer-b", "protocol": [1]] as JSON)
        let changes = try await peer.send("changes", ["since": 0] as JSON).json()
        guard case .array(let entries)? = changes["changes"] else { Issue.record("no changes"); return }
        #expect(entries.count == 1)
        let judged = session.recentTrees.withLock { cache in cache.take(id, purges: 0) }
        #expect(judged?.readableUnder == rule.withLock { $0.read.fingerprint })
        // Kept again as that read left it, then the ward changes: the verdict is not reused.
        _ = try await peer.send("changes", ["since": 0] as JSON)
        try rule.withLock { $0 = try wardRule("b") }
        #expect(try await peer.getRevs([(id, rev)]).isEmpty)
        // Under the rule that judged it, the kept tree is sent without a second verdict.
        try rule.withLock { $0 = try wardRule("a") }
        _ = try await peer.send("changes", ["since": 0] as JSON)
        #expect(try await peer.getRevs([(id, rev)]).map(\.rev) == [rev.description])
    }
}
