import FerryCore
import FerryStore
import FerrySync
import Foundation
import Testing

@testable import FerryCouch
@testable import FerryCouchClient
@testable import FerryCouchDocuments


@Suite struct CouchCheckpointTests {
    typealias T = CouchClientTesting

    /// The pull checkpoint's key (the replication ID), read from this store's own copy.
    static func checkpointKey(_ store: DocumentStore) throws -> String {
        let copies = try store.localDocuments(prefix: "checkpoint/")
        try #require(copies.count == 1)
        return String(copies[0].id.dropFirst("checkpoint/".count))
    }

    static func serverCopy(_ server: CouchTestServer, key: String) async throws -> JSON {
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        return try await http.json(.GET, http.databasePath("_local/" + key))
    }

    @Test func aPullWritesItsCheckpointOnTheServerAsALocalDocumentWithHistory() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        for id in ["a", "b", "c"] { _ = try server.store.put(DocumentID(id), body: ["n": 1]) }
        let local = try DocumentStore.inMemory()
        #expect(try await T.pull(server, into: local).status.error == nil)
        let key = try Self.checkpointKey(local)
        #expect(key.count == 64)
        let doc = try await Self.serverCopy(server, key: key)
        let localSeq = try #require(try local.localDocument("checkpoint/" + key)?["seq"])
        #expect(doc["source_last_seq"] == localSeq)
        #expect(doc["session_id"]?.stringValue?.isEmpty == false)
        #expect(doc["replication_id_version"] != nil)
        guard case .array(let history)? = doc["history"] else {
            Issue.record("no history in \(doc)")
            return
        }
        #expect(history.count == 1)
        #expect(history.first?["session_id"] == doc["session_id"])
        #expect(history.first?["recorded_seq"] == localSeq)
        #expect(history.first?["end_last_seq"] == localSeq)
        #expect(history.first?["start_last_seq"] == 0)
        #expect(history.first?["docs_read"] == 3)
        #expect(history.first?["start_time"]?.stringValue?.hasSuffix("GMT") == true)
    }

    @Test func aRestartedReplicationResumesFromItsCheckpoint() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        for id in ["a", "b"] { _ = try server.store.put(DocumentID(id), body: ["n": 1]) }
        let local = try DocumentStore.inMemory()
        let first = try await T.pull(server, into: local)
        #expect(first.summary.pulled == 2)
        let second = try await T.pull(server, into: local)
        #expect(second.status.error == nil)
        #expect(second.summary.pulled == 0)
        #expect(second.status.total == 0, "the second run re-read changes it had")

        _ = try server.store.put(DocumentID("c"), body: ["n": 1])
        let third = try await T.pull(server, into: local)
        #expect(third.summary.pulled == 1)
        let doc = try await Self.serverCopy(server, key: try Self.checkpointKey(local))
        guard case .array(let history)? = doc["history"] else {
            Issue.record("no history in \(doc)")
            return
        }
        #expect(history.count == 2)
        #expect(history[0]["session_id"] == doc["session_id"])
        #expect(history[0]["session_id"] != history[1]["session_id"])
        #expect(history[0]["start_last_seq"] == history[1]["recorded_seq"])
    }

    @Test func theServersCopyIsReadBackAsTheSequenceItRecorded() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let remote = try await CouchRemote.open(http: http, store: try DocumentStore.inMemory(), logger: T.quiet)
        #expect(try await remote.checkpoint("k1", direction: .pull).value == nil)
        try await remote.putCheckpoint("k1", value: ["seq": "12-opaque"], direction: .pull, caughtUp: false)
        try await remote.putCheckpoint("k1", value: ["seq": "13-opaque"], direction: .pull, caughtUp: false)
        #expect(try await remote.checkpoint("k1", direction: .pull).value == ["seq": "13-opaque"])
        // One session keeps one history entry, updated.
        let doc = try await Self.serverCopy(server, key: "k1")
        guard case .array(let history)? = doc["history"] else {
            Issue.record("no history")
            return
        }
        #expect(history.count == 1)
        #expect(history[0]["recorded_seq"] == "13-opaque")
    }

    @Test func theHistoryKeepsAtMostFiftySessionsNewestFirst() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let store = try DocumentStore.inMemory()
        var last = ""
        for n in 0..<53 {
            let remote = try await CouchRemote.open(http: http, store: store, logger: T.quiet)
            _ = try await remote.checkpoint("k2", direction: .push)
            try await remote.putCheckpoint("k2", value: ["seq": .int(Int64(n))], direction: .push, caughtUp: true)
            last = remote.sessionID
        }
        let doc = try await Self.serverCopy(server, key: "k2")
        guard case .array(let history)? = doc["history"] else {
            Issue.record("no history")
            return
        }
        #expect(history.count == CouchRemote.historyKept)
        #expect(history[0]["session_id"] == .string(last))
        #expect(history[0]["recorded_seq"] == 52)
        #expect(history[0]["start_last_seq"] == 51)
        #expect(history[0]["docs_written"] != nil)
    }

    @Test func localDocumentsRoundTripThroughTheServer() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let http = server.adminHTTP()
        defer { Task { await http.shutdown() } }
        let remote = try await CouchRemote.open(http: http, store: try DocumentStore.inMemory(), logger: T.quiet)
        #expect(try await remote.localDocument("state") == nil)
        try await remote.putLocalDocument("state", value: ["a": 1])
        try await remote.putLocalDocument("state", value: ["a": 2])
        #expect(try await remote.localDocument("state") == ["a": 2])
    }
}
