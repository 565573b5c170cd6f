import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging
import ServiceLifecycle
import Testing

@testable import FerryCouch
@testable import FerryCouchClient
@testable import FerryCouchDocuments


/// Pushing to a CouchDB-protocol target (a Ferry node's CouchDB API on loopback, whose
/// store is the target): `_revs_diff`, `_bulk_docs` with `new_edits: false`, attachments.
@Suite struct CouchPushTests {
    static let logger: Logger = {
        var l = Logger(label: "ferry.test.couch-push")
        l.logLevel = .critical
        return l
    }()

    /// A remote for `server` as `user:password` (the admin key by default), as opened against a CouchDB 3 server.
    static func remote(
        _ server: CouchTestServer, local: DocumentStore, user: String = "admin", password: String = CouchTestServer.adminPassword,
        version: String = "3.4.0"
    ) throws -> CouchRemote {
        let endpoint = try CouchEndpoint.parse("http://\(user):\(password)@127.0.0.1:\(server.port)/ferry")
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: logger)
        var capabilities = CouchServerCapabilities()
        capabilities.vendor = "Ferry"
        capabilities.version = version
        return CouchRemote(
            http: http, store: local,
            identity: RemoteIdentity(databaseID: "target", peerID: "target", allowsPull: true, allowsPush: true, inline: false),
            capabilities: capabilities, logger: logger)
    }

    /// A target whose CouchDB API has user `limited` (password `l-pass`), who may write only
    /// documents under `ok/`, and which reads request bodies of at most `maxRequestBytes`.
    static func restrictedServer(maxRequestBytes: Int = 64 << 20) async throws -> CouchTestServer {
        let store = try DocumentStore.inMemory()
        let database = CouchDatabase(name: "ferry", store: store, maxRequestBytes: maxRequestBytes, serverUUID: String(repeating: "b", count: 32))
        let users = CouchUserTable([
            CouchUser(
                name: "limited", password: try CouchPasswordHash(password: "l-pass", iterations: 10_000),
                policy: PeerPolicy(read: .all, write: AccessRule(idPrefixes: ["ok/"]), mayDelete: true))
        ])
        let access = CouchAccess(
            users: users, sessions: CouchSessionCookies(secret: Array(repeating: 2, count: 32)), cors: CouchCORSPolicy(origins: []),
            adminKey: { $0 == CouchTestServer.adminPassword }, adminKeyFingerprint: "fp",
            throttle: .couch(logger: logger), now: { Date() })
        let door = CouchFrontDoor(database: database, access: access, listener: .loopback)
        let (bound, announce) = AsyncStream.makeStream(of: Int.self)
        let service = try CouchListenerService(frontDoor: door, host: "127.0.0.1", port: 0, logger: logger, onBound: { announce.yield($0) })
        let group = ServiceGroup(configuration: .init(services: [service], logger: logger))
        let run = Task { try await group.run() }
        var ports = bound.makeAsyncIterator()
        let port = try #require(await ports.next())
        return CouchTestServer(store: store, port: port, group: group, run: run)
    }

    /// Runs `body` against `target` (or a fresh server) with a new local store and a
    /// remote for it; the remote's client and the server are shut down however `body` ends.
    static func withTarget(
        _ target: CouchTestServer? = nil, user: String = "admin", password: String = CouchTestServer.adminPassword,
        _ body: (CouchTestServer, DocumentStore, CouchRemote) async throws -> Void
    ) async throws {
        let server: CouchTestServer
        if let target { server = target } else { server = try await CouchTestServer.start() }
        let local: DocumentStore
        let remote: CouchRemote
        do {
            local = try DocumentStore.inMemory()
            remote = try Self.remote(server, local: local, user: user, password: password)
        } catch {
            await server.stop()
            throw error
        }
        var failure: (any Error)?
        do { try await body(server, local, remote) } catch { failure = error }
        await remote.http.shutdown()
        await server.stop()
        if let failure { throw failure }
    }

    /// What the Pusher does for one page: offers every local leaf through `revsDiff`, then
    /// stores the missing revisions, made as it makes them (deltas allowed, bases from the answer).
    @discardableResult
    static func pushAll(_ local: DocumentStore, _ remote: CouchRemote) async throws -> [PutResult] {
        var docs: [DocumentID: [RevisionID]] = [:]
        for (change, leaves) in try local.changesWithLeaves(since: 0, limit: 10_000) { docs[change.id] = leaves }
        let answer = try await remote.revsDiff(docs)
        let trees = try local.revisionTrees(answer.keys)
        var wires: [WireRevision] = []
        for id in answer.keys.sorted() {
            let entry = try #require(answer[id])
            let tree = try #require(trees[id])
            for rev in entry.missing {
                let made = try #require(
                    WireRevision.make(
                        id: id, revision: rev, tree: tree, receiverHas: entry.possibleAncestors, useDeltas: true, maxHistory: 100))
                wires.append(made.0)
            }
        }
        return try await remote.storeRevisions(wires)
    }

    /// Every document of `local` is on `target` with the same leaves, winner and winning body.
    static func expectSameDocuments(_ local: DocumentStore, _ target: DocumentStore, _ ids: [String]) throws {
        for raw in ids {
            let id = try DocumentID(raw, allowReserved: true)
            let mine = try #require(try local.revisionTree(id))
            let theirs = try #require(try target.revisionTree(id), "\(raw) is not on the target")
            #expect(Set(theirs.leaves.map(\.id)) == Set(mine.leaves.map(\.id)), "\(raw)")
            #expect(theirs.winner?.id == mine.winner?.id, "\(raw)")
            #expect(theirs.winner?.deleted == mine.winner?.deleted, "\(raw)")
            let a = try #require(try local.document(id))
            let b = try #require(try target.document(id))
            #expect(a.body == b.body, "\(raw)")
        }
    }

    @Test func newDocumentsArriveWithTheSameRevisionIDsAndBodies() async throws {
        try await Self.withTarget { server, local, remote in
            let r1 = try local.put(try DocumentID("one"), body: ["n": 1, "nested": ["a": [1, 2, "x"]]])
            try local.put(try DocumentID("one"), body: ["n": 2], parent: r1)
            try local.put(try DocumentID("two"), body: ["name": "zwei", "pi": 3.25])
            let results = try await Self.pushAll(local, remote)
            #expect(results.count == 2)
            #expect(results.allSatisfy { $0.status == .stored })
            try Self.expectSameDocuments(local, server.store, ["one", "two"])
            // The whole history arrived: the target's tree has the first revision too.
            #expect(try server.store.revisionTree(try DocumentID("one"))?.contains(r1) == true)

            // Offered again, nothing is missing and nothing is posted.
            let before = remote.pushState.withLock { $0.bulkDocsRequests }
            #expect(try await Self.pushAll(local, remote).isEmpty)
            #expect(remote.pushState.withLock { $0.bulkDocsRequests } == before)
        }
    }

    @Test func bothLeavesOfAConflictArriveAndTheTargetPicksTheSameWinner() async throws {
        try await Self.withTarget { server, local, remote in
            let id = try DocumentID("c")
            let r1 = try local.put(id, body: ["v": 0])
            try local.put(id, body: ["v": "a"], parent: r1)
            // A sibling made elsewhere, in CouchDB's form.
            let other = try RevisionID("2-" + String(repeating: "f", count: 32))
            _ = try local.insertRevisions([IncomingRevision(id: id, revision: other, history: [r1], deleted: false, body: ["v": "b"])])
            #expect(try local.conflicts(of: id).count == 1)
            let results = try await Self.pushAll(local, remote)
            #expect(results.count == 2 && results.allSatisfy { $0.status == .stored })
            try Self.expectSameDocuments(local, server.store, ["c"])
            #expect(try server.store.conflicts(of: id).count == 1)
        }
    }

    @Test func aDeleteArrivesAsATombstoneOnTheSameRevision() async throws {
        try await Self.withTarget { server, local, remote in
            let id = try DocumentID("gone")
            let r1 = try local.put(id, body: ["type": "note"])
            try await Self.pushAll(local, remote)
            let r2 = try local.delete(id, revision: r1, keepProperties: true)
            let results = try await Self.pushAll(local, remote)
            #expect(results.map(\.rev) == [r2.description] && results[0].status == .stored)
            let tree = try #require(try server.store.revisionTree(id))
            #expect(tree.winner?.id == r2 && tree.winner?.deleted == true)
            try Self.expectSameDocuments(local, server.store, ["gone"])
        }
    }

    @Test func attachmentsArriveWithTheirBytesAndOneTheTargetHoldsGoesAsAStub() async throws {
        try await Self.withTarget { server, local, remote in
            let id = try DocumentID("att")
            let bytes = (0..<5000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            let body1 = try CouchOutgoingDocumentTests.withAttachment(["title": "v1"], name: "data.bin", bytes: bytes, revpos: 1, store: local)
            let r1 = try local.put(id, body: body1)
            // A Ferry blob reference outside the attachments travels too.
            let photo = try local.blobs.put(Array("a photo".utf8), contentType: "image/jpeg")
            try local.put(try DocumentID("photo"), body: ["photo": photo.json])
            #expect(try await Self.pushAll(local, remote).allSatisfy { $0.status == .stored })
            let digest = BlobDigest.of(bytes)
            #expect(try server.store.blobs.get(digest) == bytes)
            #expect(try server.store.blobs.get(photo.digest) == Array("a photo".utf8))
            try Self.expectSameDocuments(local, server.store, ["att", "photo"])
            #expect(remote.pushState.withLock { ($0.attachmentsSent, $0.attachmentsStubbed) } == (2, 0))

            // The next revision keeps the attachment: the target holds r1, so only a stub goes.
            var f = try #require(body1.objectValue)
            f["title"] = "v2"
            let r2 = try local.put(id, body: .object(f), parent: r1)
            let results = try await Self.pushAll(local, remote)
            #expect(results.map(\.status) == [.stored])
            #expect(remote.pushState.withLock { ($0.attachmentsSent, $0.attachmentsStubbed) } == (2, 1))
            #expect(try server.store.revisionTree(id)?.winner?.id == r2)
            try Self.expectSameDocuments(local, server.store, ["att"])
        }
    }

    @Test func aStubTheTargetCannotMatchIsSentAgainWithItsContent() async throws {
        try await Self.withTarget { server, local, remote in
            let id = try DocumentID("att")
            let bytes = Array("kept content".utf8)
            let body1 = try CouchOutgoingDocumentTests.withAttachment(["v": 1], name: "k.txt", bytes: bytes, revpos: 1, store: local)
            let r1 = try local.put(id, body: body1)
            var f = try #require(body1.objectValue)
            f["v"] = 2
            let r2 = try local.put(id, body: .object(f), parent: r1)
            // The target claims r1 as a possible ancestor, yet holds no copy of the attachment.
            remote.pushState.withLock { $0.targetHolds = [id: [r1]] }
            let tree = try #require(try local.revisionTree(id))
            let wire = try #require(WireRevision.make(id: id, revision: r2, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 100)).0
            let results = try await remote.storeRevisions([wire])
            #expect(results.map(\.status) == [.stored])
            #expect(remote.pushState.withLock { ($0.attachmentsStubbed, $0.attachmentsSent) } == (1, 1))
            #expect(try server.store.blobs.get(BlobDigest.of(bytes)) == bytes)
            #expect(try server.store.revisionTree(id)?.contains(r2) == true)
        }
    }

    @Test func aRevisionTheTargetRefusesIsRejectedAndTheRestAreStored() async throws {
        try await Self.withTarget(try await Self.restrictedServer(), user: "limited", password: "l-pass") { server, local, remote in
            try local.put(try DocumentID("ok/1"), body: ["v": 1])
            try local.put(try DocumentID("no/1"), body: ["v": 2])
            try local.put(try DocumentID("ok/2"), body: ["v": 3])
            let results = try await Self.pushAll(local, remote)
            let byID = Dictionary(uniqueKeysWithValues: results.map { ($0.id, $0.status) })
            #expect(byID["ok/1"] == .stored && byID["ok/2"] == .stored)
            guard case .rejected(let rejection)? = byID["no/1"] else {
                Issue.record("no/1 was not rejected: \(String(describing: byID["no/1"]))")
                return
            }
            #expect(rejection.stage == .policy)
            #expect(rejection.reason.contains("forbidden"))
            #expect(try server.store.document(try DocumentID("no/1")) == nil)
            try Self.expectSameDocuments(local, server.store, ["ok/1", "ok/2"])
        }
    }

    @Test func aRequestTooLargeForTheTargetIsHalvedUntilOnlyTheDocumentTooLargeAloneIsRefused() async throws {
        try await Self.withTarget(try await Self.restrictedServer(maxRequestBytes: 64 << 10)) { server, local, remote in
            for i in 0..<4 {
                let bytes = (0..<(30 << 10)).map { UInt8(truncatingIfNeeded: $0 &+ i) }
                try local.put(try DocumentID("fits/\(i)"), body: try CouchOutgoingDocumentTests.withAttachment([:], name: "a", bytes: bytes, revpos: 1, store: local))
            }
            let huge = (0..<(100 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            try local.put(try DocumentID("huge"), body: try CouchOutgoingDocumentTests.withAttachment([:], name: "a", bytes: huge, revpos: 1, store: local))
            let results = try await Self.pushAll(local, remote)
            #expect(results.count == 5)
            for r in results {
                if r.id == "huge" {
                    guard case .rejected(let rejection) = r.status else {
                        Issue.record("the document too large was not rejected")
                        continue
                    }
                    #expect(rejection.stage == .peer)
                } else {
                    #expect(r.status == .stored, "\(r.id)")
                }
            }
            try Self.expectSameDocuments(local, server.store, (0..<4).map { "fits/\($0)" })
        }
    }

    @Test func aChunkLargerThanTheRequestBoundGoesInSeveralBulkDocsRequests() async throws {
        try await Self.withTarget { server, local, remote in
            // Twelve 900 KiB attachments (under the streaming threshold, so inline): 1.2 MiB
            // each as base64, past the 8 MiB bound together.
            for i in 0..<12 {
                let bytes = [UInt8](repeating: UInt8(i), count: 900 << 10)
                try local.put(try DocumentID("big/\(i)"), body: try CouchOutgoingDocumentTests.withAttachment([:], name: "a", bytes: bytes, revpos: 1, store: local))
            }
            let results = try await Self.pushAll(local, remote)
            #expect(results.count == 12 && results.allSatisfy { $0.status == .stored })
            #expect(remote.pushState.withLock { $0.bulkDocsRequests } >= 2)
            try Self.expectSameDocuments(local, server.store, (0..<12).map { "big/\($0)" })
        }
    }

    @Test func aDeltaIsAnsweredNeedFullAndRevsDiffNamesNoDeltaBases() async throws {
        try await Self.withTarget { server, local, remote in
            let id = try DocumentID("d")
            let r1 = try local.put(id, body: ["text": .string(String(repeating: "long body ", count: 50))])
            try await Self.pushAll(local, remote)
            let r2 = try local.put(id, body: ["text": .string(String(repeating: "long body ", count: 50)), "more": 1], parent: r1)
            let answer = try await remote.revsDiff([id: [r2]])
            #expect(answer[id] == MissingRevisions(missing: [r2], possibleAncestors: []))
            #expect(remote.pushState.withLock { $0.targetHolds[id] } == [r1])
            let tree = try #require(try local.revisionTree(id))
            let delta = try #require(WireRevision.make(id: id, revision: r2, tree: tree, receiverHas: [r1], useDeltas: true, maxHistory: 100))
            #expect(delta.usedDelta)
            let before = remote.pushState.withLock { $0.bulkDocsRequests }
            #expect(try await remote.storeRevisions([delta.0]).map(\.status) == [.needFull])
            #expect(remote.pushState.withLock { $0.bulkDocsRequests } == before)
            #expect(try await remote.missingBlobs([BlobDigest.of([1, 2, 3])]).isEmpty)
        }
    }

    @Test func onlyAServerOlderThanCouchDB3IsAskedForAFullCommitAfterABatch() async throws {
        try await Self.withTarget { server, local, current in
            let older = try Self.remote(server, local: local, version: "2.3.1")
            try local.put(try DocumentID("a"), body: ["v": 1])
            try await Self.pushAll(local, current)
            #expect(current.pushState.withLock { $0.fullCommitRequests } == 0)
            try local.put(try DocumentID("b"), body: ["v": 1])
            try await Self.pushAll(local, older)
            #expect(older.pushState.withLock { ($0.fullCommitRequests, $0.noFullCommit) } == (1, false))
            // Nothing stored, nothing to commit.
            try await Self.pushAll(local, older)
            #expect(older.pushState.withLock { $0.fullCommitRequests } == 1)
            await older.http.shutdown()
        }
    }

    @Test func aWrongPasswordIsAPermanentErrorThatSaysWhatToFix() async throws {
        try await Self.withTarget(password: "wrong") { server, local, remote in
            let id = try DocumentID("x")
            let r1 = try local.put(id, body: ["v": 1])
            do {
                _ = try await remote.revsDiff([id: [r1]])
                Issue.record("revsDiff with a wrong password succeeded")
            } catch let e as CouchClientError {
                #expect(e.status == 401 && !e.isTransient)
                #expect(e.message.contains("check the user and password"))
                #expect(!e.message.contains("wrong"))
            }
            let tree = try #require(try local.revisionTree(id))
            let wire = try #require(WireRevision.make(id: id, revision: r1, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 100)).0
            do {
                _ = try await remote.storeRevisions([wire])
                Issue.record("_bulk_docs with a wrong password succeeded")
            } catch let e as CouchClientError {
                #expect(e.status == 401 && !e.isTransient)
            }
            #expect(try server.store.document(id) == nil)
        }
    }

    @Test func aPushReplicationThroughTheCouchReplicationCopiesEverything() async throws {
        let server = try await CouchTestServer.start()
        let local = try DocumentStore.inMemory()
        let id = try DocumentID("e2e")
        let r1 = try local.put(id, body: try CouchOutgoingDocumentTests.withAttachment(["v": 1], name: "f.txt", bytes: Array("file".utf8), revpos: 1, store: local))
        try local.put(id, body: ["v": 2], parent: r1)
        let gone = try local.put(try DocumentID("gone"), body: ["v": 1])
        try local.delete(try DocumentID("gone"), revision: gone)
        for i in 0..<20 { try local.put(try DocumentID("n/\(i)"), body: ["i": .int(Int64(i))]) }
        let replication = CouchReplication(endpoint: server.endpoint, logger: Self.logger)
        var configuration = ReplicatorConfiguration()
        configuration.direction = .push
        configuration.maxAttempts = 3
        configuration.initialAttemptWait = .milliseconds(10)
        let replicator = replication.replicator(store: local, configuration: configuration)
        await replicator.run()
        await replication.shutdown()
        await server.stop()
        #expect(replicator.status.error == nil, "\(String(describing: replicator.status.error))")
        try Self.expectSameDocuments(local, server.store, ["e2e", "gone"] + (0..<20).map { "n/\($0)" })
    }

    @Test func theNodesOwnDocumentsNeverLeaveThroughTheCouchDBProtocol() async throws {
        let server = try await CouchTestServer.start()
        let local = try DocumentStore.inMemory()
        for id in ["_ferry/members/abc", "_ferry/addresses/abc", "_ferry/access/rules/r"] {
            try local.put(try DocumentID(id, allowReserved: true), body: ["type": "entry"])
        }
        try local.put(try DocumentID("note"), body: ["v": 1])
        let replication = CouchReplication(endpoint: server.endpoint, logger: Self.logger)
        var configuration = ReplicatorConfiguration()
        configuration.direction = .push
        configuration.maxAttempts = 1
        let replicator = replication.replicator(store: local, configuration: configuration)
        await replicator.run()
        await replication.shutdown()
        await server.stop()
        #expect(replicator.status.error == nil, "\(String(describing: replicator.status.error))")
        #expect(replicator.summary.rejected == 0)
        #expect(try server.store.allDocuments().map(\.id.rawValue) == ["note"])
    }
}

/// Pushing to a real CouchDB-protocol server named by `FERRY_COUCH_REFERENCE_URL`
/// (`http://user:pass@host:port/db`), run by hand: a fresh database beside `db` is made
/// and dropped (kept when `FERRY_COUCH_REFERENCE_KEEP` is set); when it is not set, a Ferry
/// node's CouchDB API in-process is the server.
@Suite struct CouchPushToReferenceServerTests {
    /// An empty database to push to, and what ends it.
    static func freshDatabase() async throws -> (endpoint: CouchEndpoint, end: @Sendable () async -> Void) {
        guard let url = ProcessInfo.processInfo.environment["FERRY_COUCH_REFERENCE_URL"] else {
            let server = try await CouchTestServer.start()
            return (server.endpoint, { await server.stop() })
        }
        var endpoint = try CouchEndpoint.parse(url)
        endpoint.database = "ferry_push_" + UUID().uuidString.lowercased().prefix(8)
        endpoint.createTarget = true
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: CouchPushTests.logger)
        _ = try await http.json(.PUT, http.databasePath())
        let keep = ProcessInfo.processInfo.environment["FERRY_COUCH_REFERENCE_KEEP"] != nil
        return (endpoint, {
            if !keep { _ = try? await http.send(.DELETE, http.databasePath()) }
            await http.shutdown()
        })
    }

    @Test func documentsConflictsDeletesAndAttachmentsArriveAndAnIDTheServerRefusesStallsNothing() async throws {
        let (endpoint, end) = try await Self.freshDatabase()
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: CouchPushTests.logger)
        var failure: (any Error)?
        do { try await Self.push(http) } catch { failure = error }
        await http.shutdown()
        await end()
        if let failure { throw failure }
    }

    @Test func aPushReplicationCopiesEverythingAndASecondRunSendsNothing() async throws {
        let (endpoint, end) = try await Self.freshDatabase()
        let local = try DocumentStore.inMemory()
        let c = try DocumentID("conflict")
        let c1 = try local.put(c, body: ["v": 0])
        try local.put(c, body: ["v": "a"], parent: c1)
        let sibling = try RevisionID("2-" + String(repeating: "0", count: 32))
        _ = try local.insertRevisions([IncomingRevision(id: c, revision: sibling, history: [c1], deleted: false, body: ["v": "b"])])
        let g1 = try local.put(try DocumentID("gone"), body: ["v": 1])
        try local.delete(try DocumentID("gone"), revision: g1)
        try local.put(try DocumentID("att"), body: try CouchOutgoingDocumentTests.withAttachment(["v": 1], name: "a.json", bytes: Array(#"{"x":1}"#.utf8), revpos: 1, store: local))
        for i in 0..<300 { try local.put(try DocumentID("n/\(i)"), body: ["i": .int(Int64(i))]) }

        func push() async -> Replicator {
            var configuration = ReplicatorConfiguration()
            configuration.direction = .push
            configuration.maxAttempts = 1
            configuration.batchSize = 100
            let replication = CouchReplication(endpoint: endpoint, logger: CouchPushTests.logger)
            let replicator = replication.replicator(store: local, configuration: configuration, logger: CouchPushTests.logger)
            await replicator.run()
            await replication.shutdown()
            return replicator
        }
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: CouchPushTests.logger)
        var failure: (any Error)?
        do {
            let first = await push()
            #expect(first.status.error == nil, "\(String(describing: first.status.error))")
            #expect(first.summary.pushed == 304)
            let second = await push()
            #expect(second.status.error == nil, "\(String(describing: second.status.error))")
            #expect(second.summary.pushed == 0)
            let all = try await http.json(.GET, http.databasePath("_all_docs"))
            #expect(all["total_rows"] == 302)
            let conflict = try await http.json(.GET, http.databasePath("conflict"), query: [("conflicts", "true")])
            let tree = try #require(try local.revisionTree(c))
            #expect(conflict["_rev"] == .string(try #require(tree.winner).id.description))
            guard case .array(let others)? = conflict["_conflicts"] else { throw CouchClientError(.noConflicts, message: "no _conflicts", isTransient: false) }
            #expect(others.count == 1)
        } catch { failure = error }
        await http.shutdown()
        await end()
        if let failure { throw failure }
    }

    /// A Ferry-form revision pushed to the server and pulled into another store verifies
    /// there: its attachments come back with the digests it was made with. (A CouchDB server
    /// stores compressible content types gzip-encoded and gives them the MD5 of the encoded
    /// bytes, so the pull side must recover the MD5 the revision was made with.)
    @Test func aRoundTripThroughTheServerKeepsEveryRevisionAndAttachment() async throws {
        let (endpoint, end) = try await Self.freshDatabase()
        let origin = try DocumentStore.inMemory()
        let text = Array(String(repeating: "compressible ", count: 300).utf8)
        try origin.put(
            try DocumentID("text"),
            body: try CouchOutgoingDocumentTests.withAttachment(["v": 1], name: "notes.txt", bytes: text, revpos: 1, store: origin))
        let binary = (0..<999).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        try origin.put(
            try DocumentID("binary"),
            body: try CouchOutgoingDocumentTests.withAttachment(
                ["v": 1], name: "b.bin", bytes: binary, revpos: 1, store: origin, contentType: "application/octet-stream"))
        let copy = try DocumentStore.inMemory()
        func run(_ store: DocumentStore, _ direction: ReplicatorConfiguration.Direction) async -> (Replicator, [String]) {
            var configuration = ReplicatorConfiguration()
            configuration.direction = direction
            configuration.maxAttempts = 1
            let replication = CouchReplication(endpoint: endpoint, logger: CouchPushTests.logger)
            let replicator = replication.replicator(store: store, configuration: configuration, logger: CouchPushTests.logger)
            let events = replicator.documentEvents()
            let refusals = Task {
                var out: [String] = []
                for await e in events { if let r = e.rejection { out.append("\(e.id) \(r)") } }
                return out
            }
            await replicator.run()
            await replication.shutdown()
            refusals.cancel()
            return (replicator, await refusals.value)
        }
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: CouchPushTests.logger)
        var failure: (any Error)?
        do {
            let (pushed, _) = await run(origin, .push)
            #expect(pushed.status.error == nil, "\(String(describing: pushed.status.error))")
            let (pulled, refused) = await run(copy, .pull)
            #expect(pulled.status.error == nil, "\(String(describing: pulled.status.error))")
            #expect(refused.isEmpty, "\(refused)")
            try CouchPushTests.expectSameDocuments(origin, copy, ["binary", "text"])
        } catch { failure = error }
        await http.shutdown()
        await end()
        if let failure { throw failure }
    }

    static func push(_ http: CouchHTTP) async throws {
        let welcome = try await http.json(.GET, "/")
        var capabilities = CouchServerCapabilities()
        capabilities.version = welcome["version"]?.stringValue ?? ""
        let local = try DocumentStore.inMemory()
        let remote = CouchRemote(
            http: http, store: local,
            identity: RemoteIdentity(databaseID: "couchdb", peerID: "couchdb", allowsPull: true, allowsPush: true, inline: false),
            capabilities: capabilities, logger: CouchPushTests.logger)

        let p1 = try local.put(try DocumentID("plain"), body: ["n": 1])
        let p2 = try local.put(try DocumentID("plain"), body: ["n": 2, "list": [1, "two", ["three": 3.5]]], parent: p1)
        let c = try DocumentID("conflict")
        let c1 = try local.put(c, body: ["v": 0])
        let c2a = try local.put(c, body: ["v": "a"], parent: c1)
        let c2b = try RevisionID("2-" + String(repeating: "f", count: 32))
        _ = try local.insertRevisions([IncomingRevision(id: c, revision: c2b, history: [c1], deleted: false, body: ["v": "b"])])
        let g1 = try local.put(try DocumentID("gone"), body: ["v": 1])
        let g2 = try local.delete(try DocumentID("gone"), revision: g1)
        let text = Array(String(repeating: "compressible text ", count: 200).utf8)
        let attBody = try CouchOutgoingDocumentTests.withAttachment(["title": "v1"], name: "notes.txt", bytes: text, revpos: 1, store: local)
        let a1 = try local.put(try DocumentID("att"), body: attBody)
        let photo = try local.blobs.put((0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 13) }, contentType: "image/png")
        let ph1 = try local.put(try DocumentID("photo"), body: ["photo": photo.json])
        // Apache CouchDB refuses `_`-prefixed IDs it does not know (a Ferry node takes them).
        let isCouchDB = ProcessInfo.processInfo.environment["FERRY_COUCH_REFERENCE_URL"] != nil
        if isCouchDB { try local.put(try DocumentID("_ferry/members/n1", allowReserved: true), body: ["node": "n1"]) }

        let first = try await CouchPushTests.pushAll(local, remote)
        let byID = Dictionary(grouping: first, by: \.id)
        #expect(first.count == (isCouchDB ? 7 : 6))
        for r in first where r.id != "_ferry/members/n1" { #expect(r.status == .stored, "\(r.id) \(r.rev)") }
        if isCouchDB {
            guard case .rejected(let rejection)? = byID["_ferry/members/n1"]?.first?.status else {
                Issue.record("CouchDB stored a _ferry/ document")
                return
            }
            #expect(rejection.reason.contains("illegal_docid"))
            // Refused, it is offered again each time: gone here, the next push has no whole request refused.
            try local.purge(try DocumentID("_ferry/members/n1", allowReserved: true))
        }
        var f = try #require(attBody.objectValue)
        f["title"] = "v2"
        let a2 = try local.put(try DocumentID("att"), body: .object(f), parent: a1)
        let ph2 = try local.put(try DocumentID("photo"), body: ["photo": photo.json, "caption": "kept"], parent: ph1)
        let second = try await CouchPushTests.pushAll(local, remote)
        #expect(Set(second.map(\.rev)) == [a2.description, ph2.description])
        #expect(second.allSatisfy { $0.status == .stored })
        #expect(remote.pushState.withLock { $0.attachmentsStubbed } == 2)

        let db = http.databasePath()
        let plain = try await http.json(.GET, db + "/plain", query: [("revs", "true")])
        #expect(plain["_rev"] == .string(p2.description))
        #expect(plain["list"] == [1, "two", ["three": 3.5]])
        #expect(plain["_revisions"]?["ids"] == [.string(p2.hashText), .string(p1.hashText)])
        let conflict = try await http.json(.GET, db + "/conflict", query: [("conflicts", "true")])
        let winner = try #require(try local.revisionTree(c)?.winner?.id)
        #expect(conflict["_rev"] == .string(winner.description))
        #expect(conflict["_conflicts"] == [.string((winner == c2a ? c2b : c2a).description)])
        #expect(try await http.send(.GET, db + "/gone").status == 404)
        let tomb = try await http.json(.GET, db + "/gone", query: [("rev", g2.description)])
        #expect(tomb["_deleted"] == true)
        let att = try await http.json(.GET, db + "/att")
        #expect(att["_rev"] == .string(a2.description) && att["title"] == "v2")
        #expect(att["_attachments"]?["notes.txt"]?["revpos"] == 1)
        #expect(try await http.send(.GET, db + "/att/notes.txt").body == text)
        #expect(try await http.send(.GET, db + "/photo/" + photo.digest.description).body == (0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 13) })
        #expect(try await http.json(.GET, db + "/photo")["photo"] == photo.json)

        // A stub the server cannot match (it lacks the ancestor it is said to hold): CouchDB
        // fails the whole request, and the revision goes again with its content.
        let st = try DocumentID("stub")
        let stubBody = try CouchOutgoingDocumentTests.withAttachment(["v": 1], name: "s.txt", bytes: Array("stub me".utf8), revpos: 1, store: local)
        let s1 = try local.put(st, body: stubBody)
        var sf = try #require(stubBody.objectValue)
        sf["v"] = 2
        let s2 = try local.put(st, body: .object(sf), parent: s1)
        remote.pushState.withLock { $0.targetHolds = [st: [s1]] }
        let stubTree = try #require(try local.revisionTree(st))
        let stubWire = try #require(WireRevision.make(id: st, revision: s2, tree: stubTree, receiverHas: [], useDeltas: false, maxHistory: 100)).0
        #expect(try await remote.storeRevisions([stubWire]).map(\.status) == [.stored])
        #expect(try await http.send(.GET, db + "/stub/s.txt").body == Array("stub me".utf8))
    }
}
