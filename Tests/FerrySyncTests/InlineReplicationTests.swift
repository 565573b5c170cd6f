import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing
@testable import FerrySync

/// A client endpoint that reports the profile of every request it sends.
final class RequestRecorder: MessageEndpoint {
    let inner: any MessageEndpoint
    let profiles: AsyncStream<String>
    private let continuation: AsyncStream<String>.Continuation
    var transport: EndpointTransport { inner.transport }
    var incoming: AsyncThrowingStream<[UInt8], any Error> { inner.incoming }

    init(_ inner: any MessageEndpoint) {
        self.inner = inner
        (profiles, continuation) = AsyncStream.makeStream(of: String.self)
    }

    func send(_ message: [UInt8]) async throws(SyncError) {
        // Heartbeats are the connection's own, not the workers' round trips.
        if let m = try? Message(decoding: message), m.kind == .request, m.profile != SyncProtocol.Profile.heartbeat {
            continuation.yield(m.profile ?? "?")
        }
        try await inner.send(message)
    }

    func close(error: SyncError?) async {
        continuation.finish()
        await inner.close(error: error)
    }
}

/// A continuous replicator from `local` to a responder on `remote`, whose requests are recorded.
struct RecordedReplication {
    let replicator: Replicator
    let requests: AsyncStream<String>

    /// `rewrite` changes each message the responder sends, as a hostile peer would.
    init(
        _ local: DocumentStore, _ remote: DocumentStore, clock: any Clock<Duration> = ContinuousClock(),
        rewrite: (@Sendable ([UInt8]) -> [UInt8])? = nil, _ configure: (inout ReplicatorConfiguration) -> Void
    ) {
        var config = ReplicatorConfiguration()
        config.continuous = true
        config.heartbeat = .seconds(60)
        configure(&config)
        var link = Link(to: remote, quiet: rewrite != nil)
        if let rewrite { link.faults = { _ in (.init(), .init(deliver: { [rewrite($0)] })) } }
        let (stream, continuation) = AsyncStream.makeStream(of: String.self)
        requests = stream
        let connect = link.connector
        replicator = Replicator(
            store: local,
            connector: {
                let recorder = RequestRecorder(try await connect())
                // One connection per test: its end ends the record.
                Task {
                    for await p in recorder.profiles { continuation.yield(p) }
                    continuation.finish()
                }
                return recorder
            }, configuration: config, clock: clock)
    }

    /// The next requests sent, through the `n`th `profile` request.
    func requests(through profile: String, _ n: Int = 1) async -> [String] {
        var seen: [String] = []
        var matched = 0
        for await p in requests {
            seen.append(p)
            if p == profile { matched += 1 }
            if matched == n { break }
        }
        return seen
    }

    /// Returns once the replicator reports idle.
    func idle(_ statuses: AsyncStream<ReplicatorStatus>) async {
        for await s in statuses where s.activity == .idle { return }
    }
}

@Suite(.timeLimit(.minutes(10))) struct InlineReplicationTests {
    func bigBody(_ marker: String) -> JSON {
        var fields: [String: JSON] = ["marker": .string(marker)]
        for i in 0..<20 { fields["f\(i)"] = .string(String(repeating: "x", count: 100)) }
        return .object(fields)
    }

    @Test func aLiveChangesRequestWaitsPastTheRevisionsThePeerItselfPushed() async throws {
        let source = try DocumentStore.inMemory()
        let pushedRev = try source.put(docID("pushed"), body: ["v": 1])
        let tree = try #require(try source.revisionTree(docID("pushed")))
        let store = try DocumentStore.inMemory()
        let session = ResponderSession(responder: ReplicationResponder(store: store), authenticatedPeer: nil)
        func ask(_ number: UInt64, _ profile: String, _ body: JSON) async throws -> JSON {
            let reply = await session.handle(Message(kind: .request, number: number, properties: [("Profile", profile)], body: body.canonicalBytes))
            return try #require(reply).json()
        }
        _ = try await ask(1, SyncProtocol.Profile.hello, ["nodeID": "peer", "protocol": .array([.int(1)])])
        let made = WireRevision.make(id: docID("pushed"), revision: pushedRev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 20)
        let wire = try #require(made).0
        let put = await session.handle(
            Message(kind: .request, number: 2, properties: [("Profile", SyncProtocol.Profile.putRevs)], body: WireRevision.encodeBatch([wire])))
        guard case .array(let results)? = try #require(put).json()["results"] else {
            Issue.record("putRevs reply lacks results")
            return
        }
        #expect(results.first?["status"] == "ok")
        // The peer's live request: the push is all there is, and it is the peer's own, so
        // the request goes on waiting rather than answering with nothing.
        let answered = Locked(false)
        let waiting = Task {
            defer { answered.withLock { $0 = true } }
            return try await ask(3, SyncProtocol.Profile.changes, ["since": 0, "live": true, "timeoutMs": 60_000])
        }
        while store.commitWaiters == 0 && !answered.withLock({ $0 }) { await Task.yield() }
        try store.put(docID("local"), body: ["v": 2])
        let answer = try await waiting.value
        guard case .array(let entries)? = answer["changes"] else {
            Issue.record("no changes in \(answer)")
            return
        }
        #expect(entries.count == 1)
        guard case .array(let entry)? = entries.first else { return }
        #expect(entry.count > 1 && entry[1] == "local")
        #expect(answer["lastSeq"] == .int(Int64(try store.lastSequence)))
    }

    @Test func aLiveChangesRequestPassesOnRelayedRevisionsAfterTheRelayDelayAndLocalOnesAtOnce() async throws {
        let clock = ManualClock()
        let store = try DocumentStore.inMemory()
        var options = ReplicationResponder.Options()
        options.relayDelay = .milliseconds(10)
        options.pollInterval = .seconds(30)
        let responder = ReplicationResponder(store: store, options: options, clock: clock)
        let puller = ResponderSession(responder: responder, authenticatedPeer: "puller")
        let pusher = ResponderSession(responder: responder, authenticatedPeer: "pusher")
        func ask(_ session: ResponderSession, _ number: UInt64, _ profile: String, _ body: [UInt8]) async throws -> JSON {
            let reply = await session.handle(Message(kind: .request, number: number, properties: [("Profile", profile)], body: body))
            return try #require(reply).json()
        }
        for session in [puller, pusher] {
            _ = try await ask(session, 1, SyncProtocol.Profile.hello, (["nodeID": "x", "protocol": .array([.int(1)])] as JSON).canonicalBytes)
        }
        /// The puller's live request from `since`; `answered` counts its answer.
        func live(since: UInt64, _ answered: Counter) -> Task<JSON, any Error> {
            let body = (["since": .int(Int64(since)), "live": true, "timeoutMs": 60_000] as JSON).canonicalBytes
            return Task {
                defer { answered.increment() }
                return try await ask(puller, since + 2, SyncProtocol.Profile.changes, body)
            }
        }
        func ids(_ answer: JSON) -> [String] {
            guard case .array(let entries)? = answer["changes"] else { return [] }
            return entries.compactMap { if case .array(let e) = $0, e.count > 1 { e[1].stringValue } else { nil } }
        }
        let relayDeadline = { clock.now.offset + .milliseconds(10) }

        // Another peer pushes a revision: the puller gets it one relay delay later.
        let source = try DocumentStore.inMemory()
        let rev = try source.put(docID("relayed"), body: ["v": 1])
        let made = WireRevision.make(
            id: docID("relayed"), revision: rev, tree: try #require(try source.revisionTree(docID("relayed"))), receiverHas: [],
            useDeltas: false, maxHistory: 20)
        let firstAnswered = Counter()
        let first = live(since: 0, firstAnswered)
        while store.commitWaiters == 0 && !(firstAnswered.current > 0) { await Task.yield() }
        let deadline = relayDeadline()
        _ = try await ask(pusher, 2, SyncProtocol.Profile.putRevs, WireRevision.encodeBatch([try #require(made).0]))
        while !clock.pendingDeadlines.contains(deadline) && !(firstAnswered.current > 0) { await Task.yield() }
        #expect(firstAnswered.current == 0)
        clock.advance(by: .milliseconds(10))
        #expect(ids(try await first.value) == ["relayed"])

        // A revision made here goes at once: no relay delay starts.
        let secondAnswered = Counter()
        let second = live(since: try store.lastSequence, secondAnswered)
        while store.commitWaiters == 0 && !(secondAnswered.current > 0) { await Task.yield() }
        let noDeadline = relayDeadline()
        try store.put(docID("local"), body: ["v": 2])
        while !(secondAnswered.current > 0) && !clock.pendingDeadlines.contains(noDeadline) { await Task.yield() }
        #expect(secondAnswered.current > 0)
        clock.advance(by: .milliseconds(10))  // so that a wrongly delayed answer still comes
        #expect(ids(try await second.value) == ["local"])
    }

    @Test func aCaughtUpPullReceivesASmallChangeInlineWithoutGetRevs() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let first = try remote.put(docID("doc"), body: bigBody("one"))
        let r = RecordedReplication(local, remote) { $0.direction = .pull }
        r.replicator.start()
        // The first body travels the usual way; the page ended the feed, so the next
        // changes request is live.
        let catchUp = await r.requests(through: "changes", 2)
        #expect(catchUp == ["hello", "getCheckpoint", "changes", "getRevs", "setCheckpoint", "changes"])
        try remote.put(docID("doc"), body: bigBody("two"), parent: first)
        // The change arrives in the live reply: the next request is the next live one.
        let afterChange = await r.requests(through: "changes")
        #expect(afterChange == ["changes"])
        #expect(try local.document(docID("doc"))?.body == bigBody("two"))
        #expect(r.replicator.summary.deltasReceived == 1)
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
    }

    @Test func anInlineDeltaWhoseBaseIsGoneFallsBackToTheFullBody() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let first = try remote.put(docID("doc"), body: bigBody("one"))
        let r = RecordedReplication(local, remote) { $0.direction = .pull }
        r.replicator.start()
        _ = await r.requests(through: "changes", 2)
        try local.purge(docID("doc"))
        try remote.put(docID("doc"), body: bigBody("two"), parent: first)
        let afterChange = await r.requests(through: "changes")
        #expect(afterChange == ["getRevs", "changes"])  // the full body, asked for without deltas
        #expect(try local.document(docID("doc"))?.body == bigBody("two"))
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
    }

    /// Rewrites `from` to `to` in the changes replies whose entries carry `member` inline.
    static func tampering(_ member: String, _ from: String, _ to: String) -> @Sendable ([UInt8]) -> [UInt8] {
        { bytes in
            guard var m = try? Message(decoding: bytes), contains("\"\(member)\":", in: m.body) else { return bytes }
            m.body = replacing(from, with: to, in: m.body)
            return m.encoded()
        }
    }

    @Test func aTamperedInlineDeltaIsFetchedAgainInFull() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let first = try remote.put(docID("doc"), body: bigBody("one"))
        let r = RecordedReplication(local, remote, rewrite: Self.tampering("delta", "\"two\"", "\"evil\"")) { $0.direction = .pull }
        r.replicator.start()
        _ = await r.requests(through: "changes", 2)
        try remote.put(docID("doc"), body: bigBody("two"), parent: first)
        let afterChange = await r.requests(through: "changes")
        #expect(afterChange == ["getRevs", "changes"])  // the digest check refused the delta's result
        #expect(try local.document(docID("doc"))?.body == bigBody("two"))
        #expect(r.replicator.summary.rejected == 0)
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
    }

    @Test func aTamperedInlineBodyIsRejectedAndNothingIsStored() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        try local.put(docID("mine"), body: ["kept": true])
        let r = RecordedReplication(local, remote, rewrite: Self.tampering("body", "\"v\":1", "\"v\":9")) { $0.direction = .pull }
        let events = r.replicator.documentEvents()
        r.replicator.start()
        _ = await r.requests(through: "changes", 2)  // an empty feed, then the live request
        try remote.put(docID("new"), body: ["v": 1])
        var rejection: String?
        for await e in events where e.id == "new" {
            rejection = e.rejection
            break
        }
        #expect(rejection?.hasPrefix("digest") == true)
        #expect(try local.document(docID("new")) == nil)
        #expect(try local.document(docID("mine"))?.body == ["kept": true])
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
    }

    @Test func aCaughtUpPushSendsASmallNewDocumentWithoutRevsDiff() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let r = RecordedReplication(local, remote) { $0.direction = .push }
        let statuses = r.replicator.statusChanges()
        let events = r.replicator.documentEvents()
        r.replicator.start()
        await r.idle(statuses)  // the first, empty page: caught up
        try local.put(docID("new"), body: ["v": 2])
        let afterChange = await r.requests(through: "putRevs")
        #expect(afterChange == ["hello", "getCheckpoint", "putRevs"])
        for await e in events where e.direction == .push { break }
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
        #expect(try remote.document(docID("new"))?.body == ["v": 2])
        #expect(r.replicator.summary.pushed == 1)
    }

    @Test func aCaughtUpPushPassesOnARelayedRevisionOnlyAfterTheRelayDelay() async throws {
        let clock = ManualClock()
        let source = try DocumentStore.inMemory()
        let rev = try source.put(docID("relayed"), body: ["v": 1])
        let tree = try #require(try source.revisionTree(docID("relayed")))
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let r = RecordedReplication(local, remote, clock: clock) {
            $0.direction = .push
            $0.relayDelay = .milliseconds(10)
        }
        let statuses = r.replicator.statusChanges()
        let events = r.replicator.documentEvents()
        r.replicator.start()
        await r.idle(statuses)  // the first, empty page: caught up
        while local.commitWaiters == 0 { await Task.yield() }
        let deadline = clock.now.offset + .milliseconds(10)
        // Another timer may already be due then: wait for one more sleeper at the deadline.
        let sleepersBefore = clock.pendingDeadlines.filter { $0 == deadline }.count
        let incoming = IncomingRevision(id: docID("relayed"), revision: rev, history: [], deleted: false, body: ["v": 1], hlc: tree.revision(rev)!.hlc)
        _ = try local.insertRevisions([incoming])  // as if pulled from a third node
        while clock.pendingDeadlines.filter({ $0 == deadline }).count <= sleepersBefore, try remote.document(docID("relayed")) == nil {
            await Task.yield()
        }
        #expect(try remote.document(docID("relayed")) == nil)
        // Past the delay it goes. On a loaded machine the relay's timer may register only after
        // an advance, so time moves on in delay-sized steps until the push is seen.
        clock.advance(by: .milliseconds(10))
        while try remote.document(docID("relayed")) == nil {
            for _ in 0..<100 { await Task.yield() }
            if try remote.document(docID("relayed")) == nil { clock.advance(by: .milliseconds(10)) }
        }
        _ = events
        #expect(try remote.document(docID("relayed"))?.revision == rev)
        r.replicator.stop()
        clock.advance(by: .seconds(60))  // ends the deferred checkpoint's wait
        await r.replicator.waitUntilStopped()
    }

    @Test func aDisabledInlineLimitKeepsTheRoundTrips() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let r = RecordedReplication(local, remote) {
            $0.direction = .push
            $0.inlineLimit = 0
        }
        let statuses = r.replicator.statusChanges()
        r.replicator.start()
        await r.idle(statuses)
        try local.put(docID("new"), body: ["v": 2])
        let afterChange = await r.requests(through: "putRevs")
        #expect(afterChange == ["hello", "getCheckpoint", "revsDiff", "putRevs"])
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
        #expect(try remote.document(docID("new"))?.body == ["v": 2])
    }

    @Test func onceCaughtUpThePeersCheckpointCopyWaitsForItsDelay() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let first = try remote.put(docID("doc"), body: bigBody("one"))
        let r = RecordedReplication(local, remote) {
            $0.direction = .pull
            $0.remoteCheckpointDelay = .seconds(3600)
        }
        r.replicator.start()
        _ = await r.requests(through: "changes", 2)  // caught up: written at once
        let key = r.replicator.checkpointKey(remoteDB: remote.uuid, direction: .pull, remoteEpoch: nil)
        let peerCopy = { try remote.localDocument("checkpoint/peer/anonymous/\(key)")?["seq"]?.intValue }
        #expect(try peerCopy() == 1)
        try remote.put(docID("doc"), body: bigBody("two"), parent: first)
        let afterChange = await r.requests(through: "changes")
        #expect(afterChange == ["changes"])
        #expect(try r.replicator.localCheckpoint(key) == 2)
        #expect(try peerCopy() == 1)
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
    }

    @Test func aDeferredPushCheckpointStillReportsNothingPendingAndIsSavedLocallyOnStop() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let r = RecordedReplication(local, remote) {
            $0.direction = .push
            $0.remoteCheckpointDelay = .seconds(3600)
        }
        let statuses = r.replicator.statusChanges()
        let events = r.replicator.documentEvents()
        r.replicator.start()
        await r.idle(statuses)
        try local.put(docID("new"), body: ["v": 1])
        for await e in events where e.direction == .push { break }
        let key = r.replicator.checkpointKey(remoteDB: remote.uuid, direction: .push, remoteEpoch: nil)
        #expect(try r.replicator.localCheckpoint(key) == nil)  // deferred
        #expect(try r.replicator.pendingDocumentIDs().isEmpty)  // yet nothing is pending
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
        #expect(try r.replicator.localCheckpoint(key) == 1)  // written on the way out
    }

    @Test func aDueCheckpointIsWrittenBeforeTheNextLiveRequest() async throws {
        let local = try DocumentStore.inMemory()
        let remote = try DocumentStore.inMemory()
        let first = try remote.put(docID("doc"), body: bigBody("one"))
        let r = RecordedReplication(local, remote, clock: ImmediateClock()) {
            $0.direction = .pull
            $0.remoteCheckpointDelay = .zero
        }
        r.replicator.start()
        _ = await r.requests(through: "changes", 2)
        try remote.put(docID("doc"), body: bigBody("two"), parent: first)
        let afterChange = await r.requests(through: "changes")
        #expect(afterChange == ["setCheckpoint", "changes"])
        let key = r.replicator.checkpointKey(remoteDB: remote.uuid, direction: .pull, remoteEpoch: nil)
        #expect(try remote.localDocument("checkpoint/peer/anonymous/\(key)")?["seq"]?.intValue == 2)
        r.replicator.stop()
        await r.replicator.waitUntilStopped()
    }

    @Test func aRevisionIsNotAnnouncedBackToThePeerThatPushedIt() async throws {
        let origin = try DocumentStore.inMemory()
        let here = try DocumentStore.inMemory()
        let rev = try origin.put(docID("pushed"), body: ["v": 1])
        try here.put(docID("local"), body: ["v": 2])
        let session = ResponderSession(responder: ReplicationResponder(store: here), authenticatedPeer: nil)
        func send(_ profile: String, _ body: [UInt8], _ n: UInt64) async throws -> Message {
            let reply = await session.handle(Message(kind: .request, number: n, properties: [("Profile", profile)], body: body))
            return try #require(reply)
        }
        let hello: JSON = ["nodeID": "origin", "protocol": [1]]
        _ = try await send("hello", hello.canonicalBytes, 1)
        let tree = try #require(try origin.revisionTree(docID("pushed")))
        let (wire, _) = try #require(
            WireRevision.make(id: docID("pushed"), revision: rev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 10))
        let put = try await send("putRevs", WireRevision.encodeBatch([wire]), 2).json()
        guard case .array(let results)? = put["results"] else { Issue.record("no results"); return }
        #expect(results.first?["status"] == "ok")
        let since: JSON = ["since": 0]
        let changes = try await send("changes", since.canonicalBytes, 3).json()
        guard case .array(let entries)? = changes["changes"] else { Issue.record("no changes"); return }
        let ids = entries.map { entry -> String? in
            guard case .array(let fields) = entry, fields.count > 1 else { return nil }
            return fields[1].stringValue
        }
        #expect(ids == ["local"])  // not "pushed"
        #expect(changes["lastSeq"] == 2)  // yet the feed moves past it
    }
}
