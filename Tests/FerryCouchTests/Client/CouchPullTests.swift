import FerryCore
import FerryStore
@testable import FerrySync
import Foundation
import Logging
import Testing

@testable import FerryCouch
@testable import FerryCouchClient
@testable import FerryCouchDocuments


/// Helpers shared by the CouchDB-protocol client's end-to-end tests.
enum CouchClientTesting {
    static var quiet: Logger {
        var l = Logger(label: "ferry.test.couch.client")
        l.logLevel = .critical
        return l
    }

    /// A CouchDB-form revision ID: generation and 32 hex digits made of `digit`.
    static func rev(_ generation: Int, _ digit: Character) -> String { "\(generation)-" + String(repeating: digit, count: 32) }

    /// `_revisions` for a chain of CouchDB-form revisions, newest first.
    static func revisions(_ chain: [String]) -> JSON {
        let start = Int(chain[0].split(separator: "-")[0])!
        return ["start": .int(Int64(start)), "ids": .array(chain.map { .string(String($0.split(separator: "-")[1])) })]
    }

    /// Writes documents as they are (`new_edits: false`) through the server's CouchDB API.
    static func seed(_ server: CouchTestServer, _ docs: [JSON]) async throws {
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        try await seed(http, docs)
    }

    /// Writes documents as they are (`new_edits: false`) through any CouchDB-protocol server.
    static func seed(_ http: CouchHTTP, _ docs: [JSON]) async throws {
        let failures = try await http.json(.POST, http.databasePath("_bulk_docs"), body: ["docs": .array(docs), "new_edits": false])
        #expect(failures == [], "seeding failed: \(failures)")
    }

    /// Runs a one-shot pull from `server` into `store` and returns the finished replicator.
    static func pull(
        _ server: CouchTestServer, into store: DocumentStore, _ configure: (inout ReplicatorConfiguration) -> Void = { _ in }
    ) async throws -> Replicator {
        var configuration = ReplicatorConfiguration()
        configuration.direction = .pull
        configuration.maxAttempts = 1
        configure(&configuration)
        let replication = CouchReplication(endpoint: server.endpoint, logger: quiet)
        let replicator = replication.replicator(store: store, configuration: configuration, logger: quiet)
        await replicator.run()
        await replication.shutdown()
        return replicator
    }

    /// Waits (polling) until `condition` holds, failing after `limit`.
    static func waitUntil(_ what: String, limit: Duration = .seconds(30), _ condition: () throws -> Bool) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now + limit
        while try !condition() {
            guard clock.now < deadline else {
                Issue.record("timed out waiting until \(what)")
                return
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Whether both stores hold the document with the same current revision, deletion and conflicts.
    static func same(_ id: String, _ a: DocumentStore, _ b: DocumentStore) throws -> Bool {
        let docID = try DocumentID(id, allowReserved: true)
        guard let x = try a.document(docID), let y = try b.document(docID) else { return false }
        return x.revision == y.revision && x.deleted == y.deleted && Set(x.conflicts) == Set(y.conflicts) && x.body == y.body
    }
}

@Suite struct CouchPullTests {
    typealias T = CouchClientTesting

    @Test func aOneShotPullCopiesDocumentsConflictsAndDeletesWithTheSameWinner() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let r1 = T.rev(1, "a")
        try await T.seed(
            server,
            [
                ["_id": "plain", "_rev": .string(r1), "v": 1],
                ["_id": "conflicted", "_rev": .string(r1), "v": 1],
                ["_id": "conflicted", "_rev": .string(T.rev(2, "b")), "_revisions": T.revisions([T.rev(2, "b"), r1]), "v": "b"],
                ["_id": "conflicted", "_rev": .string(T.rev(2, "c")), "_revisions": T.revisions([T.rev(2, "c"), r1]), "v": "c"],
                ["_id": "gone", "_rev": .string(r1), "v": 1],
                ["_id": "gone", "_rev": .string(T.rev(2, "d")), "_revisions": T.revisions([T.rev(2, "d"), r1]), "_deleted": true],
                ["_id": "_design/app", "_rev": .string(r1), "language": "query"],
            ])
        // And one made by Ferry itself (a Ferry-form revision ID, digest-checked on arrival).
        _ = try server.store.put(DocumentID("native"), body: ["made": "here"])
        let local = try DocumentStore.inMemory()
        let replicator = try await T.pull(server, into: local)
        #expect(replicator.status.error == nil)
        for id in ["plain", "conflicted", "gone", "native", "_design/app"] {
            #expect(try T.same(id, local, server.store), "\(id) differs")
        }
        let conflicted = try #require(try local.document(DocumentID("conflicted")))
        #expect(conflicted.revision.description == T.rev(2, "c"))
        #expect(conflicted.conflicts.map(\.description) == [T.rev(2, "b")])
        #expect(try local.document(DocumentID("gone"))?.deleted == true)
    }

    @Test func attachmentsArriveVerifiedIntoTheBlobStoreAndASecondPullTransfersNothing() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let bytes = Array("hello, attachment".utf8) + (0..<200).map { UInt8($0) }
        try await T.seed(
            server,
            [
                [
                    "_id": "with-file", "_rev": .string(T.rev(1, "e")), "title": "x",
                    "_attachments": ["a.bin": ["content_type": "application/x-test", "data": .string(Data(bytes).base64EncodedString())]],
                ]
            ])
        let local = try DocumentStore.inMemory()
        let first = try await T.pull(server, into: local)
        #expect(first.status.error == nil)
        #expect(try T.same("with-file", local, server.store))
        let body = try #require(try local.document(DocumentID("with-file"))?.body)
        let entry = try #require(StoredAttachment(json: body["@attachments"]?["a.bin"] ?? .null))
        #expect(try local.blobs.get(entry.blob) == bytes)
        #expect(entry.md5 == StoredAttachment.md5Digest(bytes))
        #expect(entry.length == Int64(bytes.count))
        #expect(first.summary.pulled == 1)

        let second = try await T.pull(server, into: local)
        #expect(second.status.error == nil)
        #expect(second.summary.pulled == 0)
    }

    @Test func aNewRevisionsAttachmentStubsAreResolvedFromRevisionsHeldHere() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let bytes = Array(repeating: UInt8(7), count: 5000)
        let r1 = T.rev(1, "f")
        let r2 = T.rev(2, "f")
        try await T.seed(
            server,
            [["_id": "doc", "_rev": .string(r1), "_attachments": ["x": ["content_type": "text/plain", "data": .string(Data(bytes).base64EncodedString())]]]])
        let local = try DocumentStore.inMemory()
        #expect(try await T.pull(server, into: local).status.error == nil)
        // Revision 2 keeps the attachment (a stub with revpos 1) and changes a field.
        try await T.seed(
            server,
            [[
                "_id": "doc", "_rev": .string(r2), "_revisions": T.revisions([r2, r1]), "n": 2,
                "_attachments": ["x": ["stub": true, "revpos": 1, "digest": .string(StoredAttachment.md5Digest(bytes)), "length": 5000]],
            ]])
        // Retried as a replication retries: a connect that timed out beside the other suites
        // (its 10 s ran out once, the client's event loops busy) is transient.
        let again = try await T.pull(server, into: local) {
            $0.maxAttempts = 3
            $0.initialAttemptWait = .milliseconds(10)
        }
        #expect(again.status.error == nil)
        #expect(again.summary.pulled == 1)
        #expect(try T.same("doc", local, server.store))
    }

    @Test func aDocIDsFilteredPullBringsOnlyThoseDocuments() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        for id in ["a", "b", "c"] { _ = try server.store.put(DocumentID(id), body: ["id": .string(id)]) }
        let local = try DocumentStore.inMemory()
        let replicator = try await T.pull(server, into: local) { $0.documentIDs = [try! DocumentID("a"), try! DocumentID("c")] }
        #expect(replicator.status.error == nil)
        #expect(try local.document(DocumentID("a")) != nil)
        #expect(try local.document(DocumentID("b")) == nil)
        #expect(try local.document(DocumentID("c")) != nil)
    }

    @Test func aSelectorFilteredPullBringsOnlyMatchingDocuments() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        _ = try server.store.put(DocumentID("keep1"), body: ["type": "keep"])
        _ = try server.store.put(DocumentID("drop"), body: ["type": "other"])
        _ = try server.store.put(DocumentID("keep2"), body: ["type": "keep"])
        let local = try DocumentStore.inMemory()
        let replicator = try await T.pull(server, into: local) { $0.remoteSelector = ["type": "keep"] }
        #expect(replicator.status.error == nil)
        #expect(try local.document(DocumentID("keep1")) != nil)
        #expect(try local.document(DocumentID("keep2")) != nil)
        #expect(try local.document(DocumentID("drop")) == nil)
    }

    @Test func aRevisionThePullFilterRefusesIsReportedAndTheRestArrives() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        for id in ["ok1", "secret", "ok2"] { _ = try server.store.put(DocumentID(id), body: ["n": 1]) }
        let local = try DocumentStore.inMemory()
        let replicator = try await T.pull(server, into: local) {
            $0.pullFilter = RevisionFilter(name: "no-secrets") { $0.id.rawValue != "secret" }
        }
        #expect(replicator.status.error == nil)
        #expect(replicator.summary.rejected == 1)
        #expect(try local.document(DocumentID("secret")) == nil)
        #expect(try local.document(DocumentID("ok1")) != nil)
        #expect(try local.document(DocumentID("ok2")) != nil)
    }

    @Test func aContinuousPullSeesALaterWrite() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        _ = try server.store.put(DocumentID("early"), body: ["n": 1])
        let local = try DocumentStore.inMemory()
        var configuration = ReplicatorConfiguration()
        configuration.direction = .pull
        configuration.continuous = true
        configuration.heartbeat = .seconds(2)
        let replication = CouchReplication(endpoint: server.endpoint, logger: T.quiet)
        let replicator = replication.replicator(store: local, configuration: configuration, logger: T.quiet)
        replicator.start()
        try await T.waitUntil("the early document arrives") { try local.document(DocumentID("early")) != nil }
        _ = try server.store.put(DocumentID("later"), body: ["n": 2])
        try await T.waitUntil("the later document arrives") { try local.document(DocumentID("later")) != nil }
        replicator.stop()
        await replicator.waitUntilStopped()
        await replication.shutdown()
        #expect(try T.same("later", local, server.store))
    }

    @Test func anOldServerWithoutBulkGetIsReadRevisionByRevision() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let r1 = T.rev(1, "a")
        try await T.seed(
            server,
            [
                ["_id": "c", "_rev": .string(r1)],
                ["_id": "c", "_rev": .string(T.rev(2, "b")), "_revisions": T.revisions([T.rev(2, "b"), r1]), "v": "b"],
                ["_id": "c", "_rev": .string(T.rev(2, "c")), "_revisions": T.revisions([T.rev(2, "c"), r1]), "v": "c"],
            ])
        let local = try DocumentStore.inMemory()
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        remote.pullState.withLock { $0.bulkGet = false }
        let requests = try [T.rev(2, "b"), T.rev(2, "c")].map { RevisionRequest(id: try DocumentID("c"), rev: try RevisionID($0), ancestors: []) }
        let wires = try await remote.fetchRevisions(requests, deltas: false, maxHistory: 10)
        #expect(wires.map(\.rev) == [T.rev(2, "b"), T.rev(2, "c")])
        #expect(wires.allSatisfy { $0.history == [r1] && !$0.missing })
        let missing = try await remote.fetchRevisions(
            [RevisionRequest(id: try DocumentID("c"), rev: try RevisionID(T.rev(9, "9")), ancestors: [])], deltas: false, maxHistory: 10)
        #expect(missing.first?.missing == true)
    }

    @Test func aMissingRevisionComesBackMissingFromBulkGet() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        _ = try server.store.put(DocumentID("here"), body: ["n": 1])
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let remote = try await CouchRemote.open(http: http, store: try DocumentStore.inMemory(), logger: T.quiet)
        let wires = try await remote.fetchRevisions(
            [
                RevisionRequest(id: try DocumentID("nothere"), rev: try RevisionID(T.rev(1, "1")), ancestors: []),
                RevisionRequest(id: try DocumentID("here"), rev: try RevisionID(T.rev(5, "5")), ancestors: []),
            ], deltas: false, maxHistory: 10)
        #expect(wires.count == 2)
        #expect(wires.allSatisfy { $0.missing })
    }
}

/// Pulls from a real CouchDB-protocol server named by `FERRY_COUCH_REFERENCE_URL`
/// (`http://user:pass@host:port/db`: a fresh database beside `db` is made, seeded as
/// `seedReference` describes and dropped), or else from a Ferry node's CouchDB API seeded
/// the same way.
@Suite struct CouchReferencePullTests {
    typealias T = CouchClientTesting
    static let referenceURL = ProcessInfo.processInfo.environment["FERRY_COUCH_REFERENCE_URL"]

    /// The server to pull from; `stop` ends it when it was started here.
    static func reference() async throws -> (url: String, isReference: Bool, stop: @Sendable () async -> Void) {
        if let referenceURL, let cut = referenceURL.lastIndex(of: "/") {
            let url = String(referenceURL[..<cut]) + "/ferry_pull_" + String(UUID().uuidString.lowercased().prefix(8))
            let http = CouchHTTP(endpoint: try CouchEndpoint.parse(url), tls: nil, logger: T.quiet)
            _ = try await http.json(.PUT, http.databasePath())
            try await seedReference(http)
            return (url, true, {
                _ = try? await http.send(.DELETE, http.databasePath())
                await http.shutdown()
            })
        }
        let server = try await CouchTestServer.start()
        let http = server.adminHTTP()
        try await seedReference(http)
        await http.shutdown()
        return (server.url, false, { await server.stop() })
    }

    /// What the reference database holds: plain documents, a conflict, a deletion, a design
    /// document, and a document with two attachments in its second revision.
    static func seedReference(_ server: CouchHTTP) async throws {
        let r1 = T.rev(1, "1")
        let text = Array(repeating: Array("hello ".utf8), count: 8).flatMap { $0 }
        let binary = (0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        func data(_ bytes: [UInt8]) -> JSON { .string(Data(bytes).base64EncodedString()) }
        try await T.seed(
            server,
            [
                ["_id": "a", "_rev": .string(r1), "v": 1, "type": "keep"],
                ["_id": "a", "_rev": .string(T.rev(2, "1")), "_revisions": T.revisions([T.rev(2, "1"), r1]), "v": "x"],
                ["_id": "a", "_rev": .string(T.rev(2, "2")), "_revisions": T.revisions([T.rev(2, "2"), r1]), "v": "y"],
                ["_id": "b", "_rev": .string(r1), "v": 2, "type": "other"],
                ["_id": "b", "_rev": .string(T.rev(2, "3")), "_revisions": T.revisions([T.rev(2, "3"), r1]), "_deleted": true],
                ["_id": "_design/x", "_rev": .string(r1), "views": [:]],
                [
                    "_id": "att", "_rev": .string(T.rev(2, "4")), "_revisions": T.revisions([T.rev(2, "4"), T.rev(1, "4")]),
                    "_attachments": [
                        "hello.txt": ["content_type": "text/plain", "revpos": 1, "data": data(text)],
                        "data.bin": ["content_type": "application/octet-stream", "revpos": 2, "data": data(binary)],
                    ],
                ],
            ])
    }

    @Test func aPullFromAReferenceServerAgreesOnEveryWinnerLeafAndAttachment() async throws {
        let (url, _, stop) = try await Self.reference()
        defer { Task { await stop() } }
        let endpoint = try CouchEndpoint.parse(url)
        let local = try DocumentStore.inMemory()
        var configuration = ReplicatorConfiguration()
        configuration.direction = .pull
        configuration.maxAttempts = 1
        let replication = CouchReplication(endpoint: endpoint, logger: T.quiet)
        let replicator = replication.replicator(store: local, configuration: configuration, logger: T.quiet)
        await replicator.run()
        await replication.shutdown()
        #expect(replicator.status.error == nil, "\(String(describing: replicator.status.error))")

        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: T.quiet)
        defer { Task { await http.shutdown() } }
        let changes = try await http.json(.GET, http.databasePath("_changes"), query: [("style", "all_docs")])
        guard case .array(let results)? = changes["results"] else {
            Issue.record("no results")
            return
        }
        for result in results {
            let rawID = try #require(result["id"]?.stringValue)
            let id = try DocumentID(rawID, allowReserved: true)
            guard case .array(let revs)? = result["changes"] else { continue }
            let theirs = Set(revs.compactMap { $0["rev"]?.stringValue })
            let tree = try #require(try local.revisionTrees([id])[id], "\(rawID) did not arrive")
            #expect(Set(tree.leaves.map(\.id.description)) == theirs, "\(rawID): leaves differ")
            let doc = try await http.send(.GET, http.databasePath(CouchRemote.documentSuffix(rawID)))
            let winner = try #require(tree.winner)
            if doc.status == 200, let rev = doc.json?["_rev"]?.stringValue {
                #expect(winner.id.description == rev, "\(rawID): winner differs")
                for (name, att) in doc.json?["_attachments"]?.objectValue ?? [:] {
                    let bytes = try await http.send(
                        .GET, http.databasePath(CouchRemote.documentSuffix(rawID) + "/" + CouchEndpoint.escapeDatabase(name)))
                    let body = try #require(try local.document(id)?.body)
                    let entry = try #require(StoredAttachment(json: body["@attachments"]?[name] ?? .null), "\(rawID)/\(name) missing")
                    #expect(try local.blobs.get(entry.blob) == bytes.body, "\(rawID)/\(name): bytes differ")
                    #expect(entry.md5 == att["digest"]?.stringValue, "\(rawID)/\(name): digest differs")
                }
            } else {
                #expect(winner.deleted, "\(rawID): deleted there, not here")
            }
        }
    }
}

extension CouchReferencePullTests {
    /// Resume, live changes and filters against the named server (it gains a few documents).
    @Test func aReferenceServerIsPulledIncrementallyLiveAndFiltered() async throws {
        let (url, _, stop) = try await Self.reference()
        defer { Task { await stop() } }
        let endpoint = try CouchEndpoint.parse(url)
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: T.quiet)
        defer { Task { await http.shutdown() } }
        let local = try DocumentStore.inMemory()
        func pull(_ configure: (inout ReplicatorConfiguration) -> Void = { _ in }) async -> Replicator {
            var configuration = ReplicatorConfiguration()
            configuration.direction = .pull
            configuration.maxAttempts = 1
            configure(&configuration)
            let replication = CouchReplication(endpoint: endpoint, logger: T.quiet)
            let replicator = replication.replicator(store: local, configuration: configuration, logger: T.quiet)
            await replicator.run()
            await replication.shutdown()
            return replicator
        }
        let first = await pull()
        #expect(first.status.error == nil)
        let again = await pull()
        #expect(again.status.error == nil)
        #expect(again.summary.pulled == 0 && again.status.total == 0, "a second run starts from the checkpoint")

        let stamp = UUID().uuidString.lowercased()
        _ = try await http.json(.PUT, http.databasePath("live-" + stamp), body: ["kind": "live"])
        let third = await pull()
        #expect(third.summary.pulled == 1)

        // An attachment pulled once; the next revision brings it as a stub (atts_since).
        let bytes = (0..<4000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let made = try await http.json(
            .PUT, http.databasePath("att-" + stamp),
            body: ["_attachments": ["f.bin": ["content_type": "application/octet-stream", "data": .string(Data(bytes).base64EncodedString())]]])
        #expect(await pull().summary.pulled == 1)
        var current = try await http.json(.GET, http.databasePath("att-" + stamp))
        #expect(current["_rev"] == made["rev"])
        if case .object(var fields) = current {
            fields["n"] = 2
            current = .object(fields)
        }
        _ = try await http.json(.PUT, http.databasePath("att-" + stamp), body: current)
        let withStub = await pull()
        #expect(withStub.status.error == nil)
        #expect(withStub.summary.pulled == 1)
        let pulledBody = try #require(try local.document(DocumentID("att-" + stamp))?.body)
        #expect(pulledBody["n"] == 2)
        let entry = try #require(StoredAttachment(json: pulledBody["@attachments"]?["f.bin"] ?? .null))
        #expect(try local.blobs.get(entry.blob) == bytes)

        // Filtered pulls into fresh stores.
        let filteredStore = try DocumentStore.inMemory()
        _ = try await http.json(.PUT, http.databasePath("sel-" + stamp), body: ["kind": "selected"])
        var configuration = ReplicatorConfiguration()
        configuration.direction = .pull
        configuration.maxAttempts = 1
        configuration.remoteSelector = ["kind": "selected"]
        var replication = CouchReplication(endpoint: endpoint, logger: T.quiet)
        var replicator = replication.replicator(store: filteredStore, configuration: configuration, logger: T.quiet)
        await replicator.run()
        await replication.shutdown()
        #expect(replicator.status.error == nil)
        #expect(try filteredStore.document(DocumentID("sel-" + stamp)) != nil)
        #expect(try filteredStore.document(DocumentID("live-" + stamp)) == nil)

        configuration.remoteSelector = nil
        configuration.documentIDs = [try DocumentID("live-" + stamp)]
        replication = CouchReplication(endpoint: endpoint, logger: T.quiet)
        replicator = replication.replicator(store: filteredStore, configuration: configuration, logger: T.quiet)
        await replicator.run()
        await replication.shutdown()
        #expect(replicator.status.error == nil)
        #expect(try filteredStore.document(DocumentID("live-" + stamp)) != nil)

        // Continuous: a write on the server arrives.
        var live = ReplicatorConfiguration()
        live.direction = .pull
        live.continuous = true
        live.heartbeat = .seconds(2)
        replication = CouchReplication(endpoint: endpoint, logger: T.quiet)
        replicator = replication.replicator(store: local, configuration: live, logger: T.quiet)
        replicator.start()
        try await T.waitUntil("caught up") { try local.document(DocumentID("sel-" + stamp)) != nil }
        _ = try await http.json(.PUT, http.databasePath("later-" + stamp), body: ["kind": "later"])
        try await T.waitUntil("the later document arrives") { try local.document(DocumentID("later-" + stamp)) != nil }
        replicator.stop()
        await replicator.waitUntilStopped()
        await replication.shutdown()
    }

    /// `GET /{db}/{id}?open_revs=…` against the named server, as used without `_bulk_get`.
    @Test func aReferenceServerIsReadWithOpenRevs() async throws {
        let (url, _, stop) = try await Self.reference()
        defer { Task { await stop() } }
        let endpoint = try CouchEndpoint.parse(url)
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: T.quiet)
        defer { Task { await http.shutdown() } }
        let local = try DocumentStore.inMemory()
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        remote.pullState.withLock { $0.bulkGet = false }
        let page = try await remote.changes(RemoteChangesRequest(since: .start, limit: 1000))
        let requests = page.changes.flatMap { c in c.leaves.map { RevisionRequest(id: c.id, rev: $0, ancestors: []) } }
        let wires = try await remote.fetchRevisions(requests, deltas: false, maxHistory: 20)
        #expect(wires.count == requests.count)
        #expect(wires.allSatisfy { !$0.missing && (try? JSON.parse($0.content).objectValue) != nil })
    }
}

extension CouchPullTests {
    @Test func anAttachmentWhoseBytesDoNotMatchItsDigestIsRefusedAtTheTrustBoundaryAndNotKept() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let local = try DocumentStore.inMemory()
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        let bytes = Array("not what the digest says".utf8)
        let rev = T.rev(1, "a")
        let doc: JSON = [
            "_id": "bad", "_rev": .string(rev),
            "_attachments": [
                "x": ["content_type": "text/plain", "digest": "md5-AAAAAAAAAAAAAAAAAAAAAA==", "data": .string(Data(bytes).base64EncodedString())]
            ],
        ]
        let request = RevisionRequest(id: try DocumentID("bad"), rev: try RevisionID(rev), ancestors: [])
        guard case .revision(let wire) = remote.convert(["ok": doc], request: request, tree: nil, maxHistory: 10) else {
            Issue.record("not converted")
            return
        }
        #expect(!wire.missing)
        #expect(!local.blobs.has(BlobDigest.of(bytes)))
        let pipeline = IncomingPipeline(policy: .trusted, filter: nil, maxBodyBytes: 1 << 20)
        guard case .rejected = pipeline.check(wire, baseBody: { _, _ in nil }) else {
            Issue.record("the trust boundary accepted a revision whose attachment does not match its digest")
            return
        }
    }

    @Test func aGoodDocumentConvertsToTheBodyTheServerStores() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let local = try DocumentStore.inMemory()
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        let r1 = T.rev(1, "a")
        let r2 = T.rev(2, "b")
        let doc: JSON = ["_id": "good", "_rev": .string(r2), "_revisions": T.revisions([r2, r1]), "n": 1]
        let request = RevisionRequest(id: try DocumentID("good"), rev: try RevisionID(r2), ancestors: [])
        guard case .revision(let wire) = remote.convert(["ok": doc], request: request, tree: nil, maxHistory: 10) else {
            Issue.record("not converted")
            return
        }
        #expect(wire.history == [r1])
        #expect(try JSON.parse(wire.content) == ["n": 1])
        let pipeline = IncomingPipeline(policy: .trusted, filter: nil, maxBodyBytes: 1 << 20)
        guard case .accepted = pipeline.check(wire, baseBody: { _, _ in nil }) else {
            Issue.record("the trust boundary refused a good revision")
            return
        }
    }
}

extension CouchReferencePullTests {
    /// `createTarget` makes a missing database on the named server (and this test removes
    /// it); a Ferry node serves one database only, so there it stays a clear error.
    @Test func aReferenceServerCreatesAMissingDatabaseOnlyWhenAsked() async throws {
        let (url, isReference, stop) = try await Self.reference()
        defer { Task { await stop() } }
        var endpoint = try CouchEndpoint.parse(url)
        endpoint.database = "ferry-created-" + UUID().uuidString.lowercased()
        let http = CouchHTTP(endpoint: endpoint, tls: nil, logger: T.quiet)
        defer { Task { await http.shutdown() } }
        do {
            _ = try await CouchRemote.open(http: http, store: try DocumentStore.inMemory(), logger: T.quiet)
            Issue.record("opened a missing database")
        } catch let e as CouchClientError {
            #expect(e.code == "database_missing")
        }
        var creating = endpoint
        creating.createTarget = true
        let maker = CouchHTTP(endpoint: creating, tls: nil, logger: T.quiet)
        defer { Task { await maker.shutdown() } }
        guard isReference else {
            let refused = await CouchRemoteOpenTests.couchError {
                _ = try await CouchRemote.open(http: maker, store: try DocumentStore.inMemory(), logger: T.quiet)
            }
            #expect(refused?.isTransient == false)
            return
        }
        _ = try await CouchRemote.open(http: maker, store: try DocumentStore.inMemory(), logger: T.quiet)
        #expect(try await http.send(.GET, http.databasePath()).status == 200)
        _ = try await http.send(.DELETE, http.databasePath())
    }
}

extension CouchPullTests {
    @Test func documentIDsAndASelectorTogetherBringOnlyDocumentsMatchingBoth() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        _ = try server.store.put(DocumentID("a"), body: ["type": "keep"])
        _ = try server.store.put(DocumentID("b"), body: ["type": "keep"])
        _ = try server.store.put(DocumentID("c"), body: ["type": "other"])
        let local = try DocumentStore.inMemory()
        let replicator = try await T.pull(server, into: local) {
            $0.remoteSelector = ["type": "keep"]
            $0.documentIDs = [try! DocumentID("a"), try! DocumentID("c")]
        }
        #expect(replicator.status.error == nil)
        #expect(try local.document(DocumentID("a")) != nil)
        #expect(try local.document(DocumentID("b")) == nil)
        #expect(try local.document(DocumentID("c")) == nil)
    }
}

extension CouchPullTests {
    @Test func aRefusedRevisionLeavesItsAttachmentOutOfTheBlobStore() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let kept = Array("kept attachment".utf8)
        let refused = Array("refused attachment".utf8)
        try await T.seed(
            server,
            [
                ["_id": "ok", "_rev": .string(T.rev(1, "a")), "_attachments": ["f": ["content_type": "text/plain", "data": .string(Data(kept).base64EncodedString())]]],
                ["_id": "secret", "_rev": .string(T.rev(1, "b")), "_attachments": ["f": ["content_type": "text/plain", "data": .string(Data(refused).base64EncodedString())]]],
            ])
        let local = try DocumentStore.inMemory()
        let replicator = try await T.pull(server, into: local) {
            $0.pullFilter = RevisionFilter(name: "no-secrets") { $0.id.rawValue != "secret" }
        }
        #expect(replicator.status.error == nil)
        #expect(replicator.summary.rejected == 1)
        #expect(local.blobs.has(BlobDigest.of(kept)))
        #expect(!local.blobs.has(BlobDigest.of(refused)))
    }

    @Test func anAttachmentWhoseHeldBytesWereLetGoIsFetchedAgainByName() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let bytes = Array("fetched again".utf8)
        let rev = T.rev(1, "c")
        try await T.seed(
            server, [["_id": "doc", "_rev": .string(rev), "_attachments": ["f.txt": ["content_type": "text/plain", "data": .string(Data(bytes).base64EncodedString())]]]])
        let local = try DocumentStore.inMemory()
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        let wires = try await remote.fetchRevisions(
            [RevisionRequest(id: try DocumentID("doc"), rev: try RevisionID(rev), ancestors: [])], deltas: false, maxHistory: 10)
        #expect(wires.count == 1)
        let digest = BlobDigest.of(bytes)
        // Older fetches let their bytes go.
        for _ in 0..<CouchPullState.bytesKeptFetches { remote.pullState.withLock { $0.age() } }
        #expect(remote.pullState.withLock { $0.pendingBlobs[digest]?.bytes } == nil)
        #expect(try await remote.blob(digest) == bytes)
    }
}

extension CouchPullTests {
    @Test func aContinuousPullWhoseServerWentAwayReconnectsAndGoesOn() async throws {
        let store = try DocumentStore.inMemory()
        let first = try await CouchTestServer.start(store: store)
        let port = first.port
        _ = try store.put(DocumentID("before"), body: ["n": 1])
        let local = try DocumentStore.inMemory()
        var configuration = ReplicatorConfiguration()
        configuration.direction = .pull
        configuration.continuous = true
        configuration.heartbeat = .seconds(2)
        configuration.maxAttemptWait = .milliseconds(500)
        let replication = CouchReplication(endpoint: first.endpoint, logger: T.quiet)
        let replicator = replication.replicator(store: local, configuration: configuration, logger: T.quiet)
        replicator.start()
        try await T.waitUntil("the first document arrives") { try local.document(DocumentID("before")) != nil }
        await first.stop()
        _ = try store.put(DocumentID("after"), body: ["n": 2])
        // The port may be a moment in coming free on a loaded machine: bind again until it is.
        var restarted: CouchTestServer?
        for _ in 0..<300 where restarted == nil {
            restarted = try? await CouchTestServer.start(store: store, port: port)
            if restarted == nil { try await Task.sleep(for: .milliseconds(100)) }
        }
        let second = try #require(restarted, "the server could not bind its port again")
        defer { Task { await second.stop() } }
        try await T.waitUntil("the document written while the server was away arrives") {
            try local.document(DocumentID("after")) != nil
        }
        replicator.stop()
        await replicator.waitUntilStopped()
        await replication.shutdown()
        #expect(try T.same("after", local, store))
    }
}
