import FerryCore
import Foundation
import IntegrationHarness
import Testing
@testable import FerryStore

@Suite struct DocumentStoreTests {
    @Test func revisionIDsAreDeterministicAcrossDatabases() throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        #expect(a.uuid != b.uuid)
        let r1a = try a.put(docID("d"), body: ["x": 1, "y": "two"])
        let r1b = try b.put(docID("d"), body: ["y": "two", "x": 1.0])
        #expect(r1a == r1b)
        let r2a = try a.put(docID("d"), body: ["x": 2], parent: r1a)
        let r2b = try b.put(docID("d"), body: ["x": 2], parent: r1b)
        #expect(r2a == r2b)
        let da = try a.delete(docID("d"), revision: r2a)
        let db = try b.delete(docID("d"), revision: r2b)
        #expect(da == db)
    }

    @Test func readReturnsCurrentRevisionWithMetadata() throws {
        let store = try DocumentStore.inMemory()
        let rev = try store.put(docID("doc"), body: ["name": "Ada"])
        let doc = try #require(try store.document(docID("doc")))
        #expect(doc.revision == rev)
        #expect(doc.body == ["name": "Ada"])
        #expect(doc.json() == ["_id": "doc", "_rev": .string(rev.description), "name": "Ada"])
        #expect(try store.document(docID("missing")) == nil)
    }

    @Test func staleOrMissingRevisionIsAConflictThatChangesNothing() throws {
        let store = try DocumentStore.inMemory()
        let r1 = try store.put(docID("d"), body: ["v": 1])
        let r2 = try store.put(docID("d"), body: ["v": 2], parent: r1)
        let before = try snapshot(store)
        #expect(throws: StoreError.conflict(id: docID("d"), given: r1, current: r2)) {
            try store.put(docID("d"), body: ["v": 3], parent: r1)
        }
        #expect(throws: StoreError.conflict(id: docID("d"), given: nil, current: r2)) {
            try store.put(docID("d"), body: ["v": 3])
        }
        #expect(throws: StoreError.self) { try store.delete(docID("d"), revision: r1) }
        #expect(throws: StoreError.conflict(id: docID("new"), given: r1, current: nil)) {
            try store.put(docID("new"), body: ["v": 3], parent: r1)
        }
        #expect(try snapshot(store) == before)
    }

    @Test func aFailedTransactionWritesNothing() throws {
        let store = try DocumentStore.inMemory()
        _ = try store.put(docID("keep"), body: ["v": 1])
        let before = try snapshot(store)
        #expect(throws: StoreError.self) {
            try store.write { txn in
                try txn.put(docID("a"), body: ["v": 1])
                try txn.put(docID("b"), body: ["v": 1])
                try txn.put(docID("keep"), body: ["v": 2])  // conflict: rolls back a and b too
            }
        }
        #expect(try snapshot(store) == before)
    }

    @Test func insertWithHistoryCreatesConflictsWithTheSameWinnerOnBothDatabases() throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let base = try a.put(docID("d"), body: ["v": 0])
        #expect(try b.insertRevisions([try incoming(a, docID("d"), base)]) == [.inserted(sequence: 1, branched: false)])
        let ra = try a.put(docID("d"), body: ["v": "a"], parent: base)
        let rb = try b.put(docID("d"), body: ["v": "b"], parent: base)
        // Exchange both ways.
        let toB = try incoming(a, docID("d"), ra)
        let toA = try incoming(b, docID("d"), rb)
        // Each side now holds two leaves: the insert says so, so that resolvers look at it.
        #expect(try b.insertRevisions([toB]) == [.inserted(sequence: 3, branched: true)])
        #expect(try a.insertRevisions([toA]) == [.inserted(sequence: 3, branched: true)])
        // Idempotent.
        #expect(try a.insertRevisions([toA]) == [.alreadyPresent])
        let docA = try #require(try a.document(docID("d")))
        let docB = try #require(try b.document(docID("d")))
        #expect(docA.revision == docB.revision)
        #expect(docA.conflicts == docB.conflicts)
        #expect(docA.conflicts.count == 1)
        #expect(try a.conflictedDocumentIDs() == [docID("d")])
        // Resolve by tombstoning the loser.
        _ = try a.delete(docID("d"), revision: docA.conflicts[0])
        #expect(try a.conflicts(of: docID("d")).isEmpty)
        #expect(try a.conflictedDocumentIDs().isEmpty)
        let leaves = try a.revisionTree(docID("d"))!.leaves.filter { !$0.deleted }
        #expect(leaves.count == 1)
        #expect(leaves[0].id == docA.revision)
    }

    @Test func onlyABodyThatHashesToItsRevisionIsVerifiedAndAVerifiedOneIsStored() throws {
        let source = try DocumentStore.inMemory()
        let target = try DocumentStore.inMemory()
        let body: JSON = ["v": 1]
        let rev = try source.put(docID("v"), body: body)
        func verify(_ bytes: [UInt8], deleted: Bool = false, history: [RevisionID] = []) -> IncomingRevision? {
            IncomingRevision.verified(
                id: docID("v"), revision: rev, history: history, deleted: deleted, body: body, hlc: .zero, canonicalBody: bytes)
        }
        #expect(verify(Array(#"{"v":2}"#.utf8)) == nil)
        #expect(verify(body.canonicalBytes, deleted: true) == nil)  // the flag is hashed too
        #expect(verify(body.canonicalBytes, history: [rev]) == nil)  // and so is the parent
        let verified = try #require(verify(body.canonicalBytes))
        #expect(try target.insertRevisions([verified]) == [.inserted(sequence: 1, branched: false)])
        #expect(try target.document(docID("v"))?.revision == rev)
    }

    @Test func aSuspendingInsertStoresTheSameAsABlockingOneAndWakesWaiters() async throws {
        let source = try DocumentStore.inMemory()
        let blocking = try DocumentStore.inMemory()
        let suspending = try DocumentStore.inMemory()
        var revisions: [IncomingRevision] = []
        for i in 0..<5 {
            let id = docID("d\(i)")
            revisions.append(try incoming(source, id, try source.put(id, body: ["n": .int(Int64(i))])))
        }
        let woken = Task { try await suspending.waitForCommit(past: 0) }
        let outcomes = try await suspending.insertRevisionsSuspending(revisions)
        try await woken.value
        #expect(outcomes == (try blocking.insertRevisions(revisions)))
        #expect(try await suspending.insertRevisionsSuspending(revisions) == Array(repeating: .alreadyPresent, count: 5))
        #expect(try snapshot(suspending) == snapshot(blocking))
    }

    @Test func incomingRevisionsAreVerifiedAndABadOneDoesNotStopTheBatch() throws {
        let source = try DocumentStore.inMemory()
        let target = try DocumentStore.inMemory()
        let good = try source.put(docID("good"), body: ["v": 1])
        let other = try source.put(docID("other"), body: ["v": 1])
        let forged = IncomingRevision(
            id: docID("other"), revision: other, history: [], deleted: false, body: ["v": "tampered"])
        let orphan = IncomingRevision(
            id: docID("orphan"), revision: try RevisionID("3-" + String(repeating: "a", count: 64)), history: [],
            deleted: false, body: ["v": 1])
        let outcomes = try target.insertRevisions([forged, try incoming(source, docID("good"), good), orphan])
        #expect(outcomes[0] == .rejected(.digestMismatch(docID("other"), other)))
        #expect(outcomes[1] == .inserted(sequence: 1, branched: false))
        guard case .rejected(.invalidHistory) = outcomes[2] else {
            Issue.record("expected invalid history, got \(outcomes[2])")
            return
        }
        #expect(try target.document(docID("other")) == nil)
        #expect(try target.documentCount == 1)
    }

    @Test func deleteKeepsPropertiesWhenAsked() throws {
        let store = try DocumentStore.inMemory()
        let r1 = try store.put(docID("a"), body: ["type": "order", "n": 1])
        let r2 = try store.put(docID("b"), body: ["type": "order", "n": 2])
        let ta = try store.delete(docID("a"), revision: r1, keepProperties: true)
        let tb = try store.delete(docID("b"), revision: r2)
        let a = try #require(try store.document(docID("a")))
        #expect(a.deleted && a.revision == ta && a.body == ["type": "order", "n": 1])
        let b = try #require(try store.document(docID("b")))
        #expect(b.deleted && b.revision == tb && b.body == [:])
        #expect(try store.documentCount == 0)
        #expect(try store.allDocuments().isEmpty)
        #expect(try store.allDocuments(includeDeleted: true).count == 2)
        // Re-creating a deleted document continues its history.
        let r3 = try store.put(docID("b"), body: ["again": true])
        #expect(r3.generation == 3)
    }

    @Test func purgeRemovesAllHistory() throws {
        let store = try DocumentStore.inMemory()
        let r1 = try store.put(docID("p"), body: ["v": 1])
        _ = try store.put(docID("p"), body: ["v": 2], parent: r1)
        _ = try store.put(docID("q"), body: ["v": 1])
        let seq = try store.lastSequence
        #expect(try store.purge(docID("p")))
        #expect(try store.purge(docID("p")) == false)
        #expect(try store.document(docID("p")) == nil)
        #expect(try store.revisionTree(docID("p")) == nil)
        #expect(try store.changes().map(\.id) == [docID("q")])
        // Sequences are never reused after a purge.
        _ = try store.put(docID("p"), body: ["v": 9])
        #expect(try store.lastSequence == seq + 1)
        #expect(try store.document(docID("p"))?.revision.generation == 1)
    }

    @Test func namedRevisionIsReadableWhileItsBodyIsRetained() throws {
        var options = StoreOptions()
        options.retainedAncestorBodies = 1
        let store = try DocumentStore.inMemory(options: options)
        var revs = [try store.put(docID("d"), body: ["v": 0])]
        for i in 1...3 { revs.append(try store.put(docID("d"), body: ["v": .int(Int64(i))], parent: revs.last!)) }
        #expect(try store.document(docID("d"), revision: revs[2])?.body == ["v": 2])
        #expect(throws: StoreError.bodyNotRetained(docID("d"), revs[0])) {
            try store.document(docID("d"), revision: revs[0])
        }
        let unknown = try RevisionID("9-" + String(repeating: "b", count: 64))
        #expect(throws: StoreError.revisionNotFound(docID("d"), unknown)) {
            try store.document(docID("d"), revision: unknown)
        }
    }

    @Test func revsDiffAnswersMissingAndPossibleAncestors() throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let r1 = try a.put(docID("d"), body: ["v": 1])
        _ = try b.insertRevisions([try incoming(a, docID("d"), r1)])
        let r2 = try a.put(docID("d"), body: ["v": 2], parent: r1)
        let r3 = try a.put(docID("d"), body: ["v": 3], parent: r2)
        let n1 = try a.put(docID("new"), body: ["v": 1])
        let diff = try b.revsDiff([docID("d"): [r1, r3], docID("new"): [n1]])
        #expect(diff[docID("d")] == RevsDiffEntry(missing: [r3], possibleAncestors: [r1]))
        #expect(diff[docID("new")] == RevsDiffEntry(missing: [n1], possibleAncestors: []))
        #expect(try b.revsDiff([docID("d"): [r1]]).isEmpty)
    }

    @Test func changesAreOrderedWithOneEntryPerDocument() throws {
        let store = try DocumentStore.inMemory()
        let ra = try store.put(docID("a"), body: ["v": 1])
        _ = try store.put(docID("b"), body: ["v": 1])
        let ra2 = try store.put(docID("a"), body: ["v": 2], parent: ra)
        _ = try store.put(docID("c"), body: ["v": 1])
        let changes = try store.changes()
        #expect(changes.map(\.id) == [docID("b"), docID("a"), docID("c")])
        #expect(changes.map(\.sequence) == [2, 3, 4])
        #expect(changes[1].revision == ra2)
        #expect(try store.changes(since: 2).map(\.id) == [docID("a"), docID("c")])
        #expect(try store.changes(since: 0, limit: 1).map(\.id) == [docID("b")])
        #expect(try store.lastSequence == 4)
    }

    @Test func liveChangesDeliverTheBacklogThenNewCommits() async throws {
        let store = try DocumentStore.inMemory()
        _ = try store.put(docID("old1"), body: ["v": 1])
        _ = try store.put(docID("old2"), body: ["v": 1])
        let reader = Task {
            var seen: [String] = []
            for try await change in store.liveChanges(since: 0, pageSize: 1) {
                seen.append(change.id.rawValue)
                if seen.count == 4 { break }
            }
            return seen
        }
        _ = try store.put(docID("new1"), body: ["v": 1])
        _ = try store.put(docID("new2"), body: ["v": 1])
        let seen = try await reader.value
        #expect(seen == ["old1", "old2", "new1", "new2"])
    }

    @Test func changesByIDPrefixListOnlyThoseDocumentsInSequenceOrder() throws {
        let store = try DocumentStore.inMemory()
        for id in ["g/a/1", "doc-1", "g/b/1", "g/ab", "g/a/2", "doc-2", "g/a0"] { _ = try store.put(docID(id), body: ["v": 1]) }
        _ = try store.put(docID("g/b/1"), body: ["v": 2], parent: try #require(try store.document(docID("g/b/1"))).revision)
        let listed = try store.changes(since: 0, limit: 10, idPrefixes: ["g/a/", "g/b/"])
        #expect(listed.map(\.id.rawValue) == ["g/a/1", "g/a/2", "g/b/1"])
        #expect(listed.map(\.sequence) == listed.map(\.sequence).sorted())
        #expect(try store.changes(since: listed[1].sequence, limit: 10, idPrefixes: ["g/a/", "g/b/"]).map(\.id.rawValue) == ["g/b/1"])
        #expect(try store.changes(since: 0, limit: 1, idPrefixes: ["g/a/"]).map(\.id.rawValue) == ["g/a/1"])
        #expect(DocumentStore.prefixUpperBound("g/a/") == "g/a0")
    }

    @Test func liveChangesByIDPrefixSkipOtherDocumentsThenDeliverNewCommits() async throws {
        let store = try DocumentStore.inMemory()
        _ = try store.put(docID("g/old"), body: ["v": 1])
        for i in 0..<5 { _ = try store.put(docID("doc-\(i)"), body: ["v": 1]) }
        let reader = Task {
            var seen: [String] = []
            for try await change in store.liveChanges(since: 0, pageSize: 2, idPrefixes: ["g/"]) {
                seen.append(change.id.rawValue)
                if seen.count == 2 { break }
            }
            return seen
        }
        for i in 5..<10 { _ = try store.put(docID("doc-\(i)"), body: ["v": 1]) }
        _ = try store.put(docID("g/new"), body: ["v": 1])
        #expect(try await reader.value == ["g/old", "g/new"])
    }

    @Test func liveChangesEndWhenTheTaskIsCancelled() async throws {
        let store = try DocumentStore.inMemory()
        let reader = Task {
            var count = 0
            for try await _ in store.liveChanges() { count += 1 }
            return count
        }
        reader.cancel()
        #expect(try await reader.value == 0)
    }

    @Test func waitForCommitReturnsAtOnceWhenPastAndOnTheNextCommitOtherwise() async throws {
        let store = try DocumentStore.inMemory()
        _ = try store.put(docID("a"), body: ["v": 1])
        try await store.waitForCommit(past: 0)  // already past: no wait
        let waiter = Task {
            try await store.waitForCommit(past: 1)
            return try store.lastSequence
        }
        try store.putLocalDocument("checkpoint/x", body: ["seq": 1])  // not a change: no wake
        _ = try store.put(docID("b"), body: ["v": 1])
        #expect(try await waiter.value == 2)
    }

    @Test func waitForCommitSeesAnotherProcessesCommitByPolling() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ferry-wait-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let waiting = try DocumentStore.open(directory: dir)
        let other = try DocumentStore.open(directory: dir)  // its commits do not reach `waiting`'s notifier
        let waiter = Task { try await waiting.waitForCommit(past: 0, poll: .init(interval: .milliseconds(5), clock: ImmediateClock())) }
        _ = try other.put(docID("elsewhere"), body: ["v": 1])
        try await waiter.value
        #expect(try waiting.lastSequence == 1)
    }

    @Test func oneStorePollSleepServesEveryWaiterAndEndsWhenNoneIsLeft() async throws {
        let dir = TemporaryDirectory()
        let waiting = try DocumentStore.open(directory: dir.path)
        let other = try DocumentStore.open(directory: dir.path)
        let clock = ManualClock()
        let poll = LiveChanges.Poll(interval: .milliseconds(100), clock: clock)
        let waiters = (0..<10).map { _ in Task { try await waiting.waitForCommit(past: 0, poll: poll) } }
        while waiting.commitWaiters < 10 || clock.pendingDeadlines.isEmpty { await Task.yield() }
        #expect(clock.pendingDeadlines == [.milliseconds(100)])  // one timer, not one per wait
        _ = try other.put(docID("elsewhere"), body: ["v": 1])
        clock.advance(by: .milliseconds(100))
        for w in waiters { try await w.value }
        // Nobody waits now: the poller's next round is its last.
        while clock.pendingDeadlines.isEmpty { await Task.yield() }
        clock.advance(by: .milliseconds(100))
        for _ in 0..<1000 where !clock.pendingDeadlines.isEmpty { await Task.yield() }
        #expect(clock.pendingDeadlines.isEmpty)
    }

    @Test func changesWithTreesCarryEachTreeWithTheWinnersBody() throws {
        let store = try DocumentStore.inMemory()
        let first = try store.put(docID("a"), body: ["v": 1])
        let second = try store.put(docID("a"), body: ["v": 2], parent: first)
        try store.put(docID("b"), body: ["w": 1])
        let page = try store.changesWithTrees(since: 0)
        #expect(page.map(\.0.id.rawValue) == ["a", "b"])
        let tree = page[0].1
        #expect(tree.leaves.map(\.id) == [second])
        let expected: JSON = ["v": 2]
        #expect(tree.revision(second)?.body == expected.canonicalBytes)
        #expect(try store.changesWithLeaves(since: 0).map(\.1) == page.map { $0.1.leaves.map(\.id) })
    }

    @Test func localDocumentsAreSeparateFromTheChangesFeed() throws {
        let store = try DocumentStore.inMemory()
        try store.putLocalDocument("checkpoint/peer", body: ["seq": 10])
        #expect(try store.localDocument("checkpoint/peer") == ["seq": 10])
        try store.putLocalDocument("checkpoint/peer", body: ["seq": 11])
        #expect(try store.localDocument("checkpoint/peer") == ["seq": 11])
        #expect(try store.changes().isEmpty)
        #expect(try store.lastSequence == 0)
        #expect(try store.deleteLocalDocument("checkpoint/peer"))
        #expect(try store.localDocument("checkpoint/peer") == nil)
    }

    @Test func pruningKeepsTheWinnerAndConflictLeaves() throws {
        var options = StoreOptions()
        options.maxRevisionDepth = 5
        let a = try DocumentStore.inMemory(options: options)
        let b = try DocumentStore.inMemory(options: options)
        var rev = try a.put(docID("d"), body: ["v": 0])
        _ = try b.insertRevisions([try incoming(a, docID("d"), rev)])
        var brev = rev
        for i in 1...12 { rev = try a.put(docID("d"), body: ["a": .int(Int64(i))], parent: rev) }
        for i in 1...3 { brev = try b.put(docID("d"), body: ["b": .int(Int64(i))], parent: brev) }
        _ = try a.insertRevisions([try incoming(b, docID("d"), brev)])
        let tree = try #require(try a.revisionTree(docID("d")))
        #expect(tree.winner?.id == rev)
        #expect(tree.conflicts == [brev])
        #expect(tree.history(of: rev).count == 5)
        #expect(tree.revisions.count <= 10)
        #expect(try a.document(docID("d"))?.conflicts == [brev])
    }

    @Test func validationRejectionCarriesAReasonAndChangesNothing() throws {
        var options = StoreOptions()
        options.validator = Validator { proposed in
            proposed.body["owner"] == nil && !proposed.deleted ? "an owner is required" : nil
        }
        let store = try DocumentStore.inMemory(options: options)
        let source = try DocumentStore.inMemory()
        #expect(throws: StoreError.rejected(docID("x"), reason: "an owner is required")) {
            try store.put(docID("x"), body: ["v": 1])
        }
        let r = try source.put(docID("y"), body: ["v": 1])
        let outcome = try store.insertRevisions([try incoming(source, docID("y"), r)])
        #expect(outcome == [.rejected(.rejected(docID("y"), reason: "an owner is required"))])
        #expect(try snapshot(store) == ["seq=0"])
        _ = try store.put(docID("x"), body: ["owner": "me"])
        #expect(try store.documentCount == 1)
    }

    @Test func badInputGivesClearErrorsAndLeavesTheStoreUnchanged() throws {
        var options = StoreOptions()
        options.maxBodyBytes = 1024
        let store = try DocumentStore.inMemory(options: options)
        let r = try store.put(docID("keep"), body: ["v": 1])
        let before = try snapshot(store)
        let big = JSON.object(["blob": .string(String(repeating: "x", count: 2000))])
        #expect(throws: StoreError.tooLarge(bytes: big.canonicalBytes.count, limit: 1024)) {
            try store.put(docID("big"), body: big)
        }
        #expect(throws: StoreError.self) { try store.put(docID("arr"), body: [1, 2]) }
        #expect(throws: StoreError.self) { try store.put(docID("res"), body: ["_secret": 1]) }
        let unknown = try RevisionID("2-" + String(repeating: "c", count: 64))
        #expect(throws: StoreError.self) { try store.put(docID("keep"), body: ["v": 2], parent: unknown) }
        #expect(throws: StoreError.self) { try store.delete(docID("nope"), revision: r) }
        #expect(throws: DocumentIDError.self) { try DocumentID("") }
        #expect(try snapshot(store) == before)
        do {
            try store.put(docID("arr"), body: [1, 2])
        } catch {
            #expect(error.description.contains("must be a JSON object"))
            #expect(!error.isTransient)
        }
    }

    @Test func compactingAFileStorePrunesHistoryAndCollectsUnreferencedBlobs() throws {
        let dir = TemporaryDirectory()
        var rev: RevisionID
        do {
            let store = try DocumentStore.open(directory: dir.path)
            rev = try store.put(docID("d"), body: ["v": 0])
            for v in 1...5 { rev = try store.put(docID("d"), body: ["v": .int(Int64(v))], parent: rev) }
            _ = try store.blobs.put(Array("nobody refers to this".utf8))
        }
        var options = StoreOptions()
        options.maxRevisionDepth = 2
        options.retainedAncestorBodies = 0
        let store = try DocumentStore.open(directory: dir.path, options: options)
        #expect(try store.revisionTree(docID("d"))?.revisions.count == 6)
        #expect(try store.compact() == 1)
        #expect(try store.revisionTree(docID("d"))?.revisions.count == 2)
        #expect(try store.document(docID("d"))?.revision == rev)
        #expect(try store.collectBlobs(minimumAge: 0).count == 1)
        #expect(try store.compact() == 0)
        #expect(try store.integrityCheck() == ["ok"])
    }

    @Test func fileStoreKeepsItsUUIDAndDataAcrossReopen() throws {
        let dir = TemporaryDirectory()
        let uuid: String
        let rev: RevisionID
        do {
            let store = try DocumentStore.open(directory: dir.path)
            uuid = store.uuid
            rev = try store.put(docID("d"), body: ["v": 1])
        }
        let again = try DocumentStore.open(directory: dir.path)
        #expect(again.uuid == uuid)
        #expect(try again.document(docID("d"))?.revision == rev)
        #expect(try again.integrityCheck() == ["ok"])
        let next = try again.put(docID("e"), body: ["v": 1])
        #expect(try again.changes().last?.revision == next)
        #expect(try again.lastSequence == 2)
    }

    @Test func onlyCommitsThatMakeRevisionsHereCountAsLocal() throws {
        let source = try DocumentStore.inMemory()
        let rev = try source.put(docID("from-peer"), body: ["v": 1])
        let store = try DocumentStore.inMemory()
        try store.put(docID("mine"), body: ["v": 1])
        #expect(store.lastLocalCommit == 1)
        _ = try store.insertRevisions([try incoming(source, docID("from-peer"), rev)])
        #expect(try store.lastSequence == 2)
        #expect(store.lastLocalCommit == 1)  // a relay of another node's change
        let tree = try #require(try store.revisionTree(docID("mine")))
        try store.delete(docID("mine"), revision: tree.winner!.id)
        #expect(store.lastLocalCommit == 3)
    }

    @Test func aFileStoreCommitsWithTheDurabilityItWasOpenedWithBeforeAndAfterARelaxedWrite() throws {
        // GRDB's pool sets synchronous=NORMAL when it enables WAL; a full store must undo
        // that on its writer, or no commit is fsynced until some relaxed write resets it.
        let dir = TemporaryDirectory()
        let full = try DocumentStore.open(directory: dir.path + "/full")
        #expect(try full.writerSynchronousLevel() == 2)
        let rev = try full.put(docID("d"), body: ["v": 1])
        #expect(try full.writerSynchronousLevel() == 2)
        let other = try DocumentStore.open(directory: dir.path + "/other")
        _ = try other.insertRevisions([try incoming(full, docID("d"), rev)], durability: .normal)
        #expect(try other.writerSynchronousLevel() == 2)

        var options = StoreOptions()
        options.durability = .normal
        let normal = try DocumentStore.open(directory: dir.path + "/normal", options: options)
        #expect(try normal.writerSynchronousLevel() == 1)
        _ = try normal.insertRevisions([try incoming(full, docID("d"), rev)], durability: .normal)
        try normal.put(docID("e"), body: ["v": 1])
        #expect(try normal.writerSynchronousLevel() == 1)
    }

    @Test func openingSomethingThatIsNotADatabaseFailsClearly() throws {
        let dir = TemporaryDirectory()
        let path = dir.path + "/" + DocumentStore.databaseFileName
        FileManager.default.createFile(atPath: path, contents: Data(repeating: 0x41, count: 8192))
        #expect(throws: StoreError.self) { try DocumentStore.open(directory: dir.path) }
        // The file is left as it was.
        #expect(FileManager.default.contents(atPath: path) == Data(repeating: 0x41, count: 8192))
    }
}

@Suite struct ContentDigestTests {
    @Test func digestIsEqualIffDocumentsRevisionsAndConflictsAreEqual() throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        #expect(try a.contentDigest() == b.contentDigest())
        let r1 = try a.put(try DocumentID("x"), body: ["v": 1])
        #expect(try a.contentDigest() != b.contentDigest())
        _ = try b.put(try DocumentID("x"), body: ["v": 1])
        // Same edit, same revision ID: equal although written separately.
        #expect(try a.contentDigest() == b.contentDigest())
        // A conflicting leaf makes them differ; the same leaf on both makes them equal again.
        let other: JSON = ["v": 2]
        let c1 = IncomingRevision(
            id: try DocumentID("x"), revision: RevisionID.compute(parent: nil, deleted: false, canonicalBody: other.canonicalBytes),
            history: [], deleted: false, body: other)
        _ = try a.insertRevisions([c1])
        #expect(try a.contentDigest() != b.contentDigest())
        _ = try b.insertRevisions([c1])
        #expect(try a.contentDigest() == b.contentDigest())
        // Deleting changes the current revision.
        _ = try a.delete(try DocumentID("x"), revision: r1)
        #expect(try a.contentDigest() != b.contentDigest())
    }

    @Test func aPurgeChangesTheContentVersionThoughItTakesNoSequence() throws {
        let store = try DocumentStore.inMemory()
        try store.put(try DocumentID("x"), body: ["v": 1])
        let before = store.contentVersion
        #expect(try store.purge(try DocumentID("x")))
        #expect(store.contentVersion != before)
        #expect(store.contentVersion.sequence == before.sequence)
        // Purging nothing changes nothing.
        let after = store.contentVersion
        #expect(try !store.purge(try DocumentID("x")))
        #expect(store.contentVersion == after)
    }

    @Test func aViewDigestCoversOnlyTheDocumentsItAdmitsJudgedByTheirCurrentBodies() throws {
        let a = try DocumentStore.inMemory()
        let b = try DocumentStore.inMemory()
        let wardA = ContentView { _, tree in
            guard let t = try? tree(), let w = t.winnerIndex, let body = t.revisions[w].body else { return false }
            return (try? JSON.parse(body))?["ward"]?.stringValue == "a"
        }
        try a.put(try DocumentID("p1"), body: ["ward": "a"])
        try b.put(try DocumentID("p1"), body: ["ward": "a"])
        try a.put(try DocumentID("p2"), body: ["ward": "b"])
        let da = try a.contentDigests(views: [wardA])
        let db = try b.contentDigests(views: [wardA])
        #expect(da.full != db.full)
        #expect(da.views == db.views)
        #expect(da.full == (try a.contentDigest()))
    }
}
