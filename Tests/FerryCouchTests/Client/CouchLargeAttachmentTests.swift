import Crypto
import FerryCore
import FerryStore
@testable import FerrySync
import Foundation
import Logging
import NIOCore
import Testing

@testable import FerryCouch
@testable import FerryCouchClient
@testable import FerryCouchDocuments


/// Large attachments through the CouchDB-protocol client: fetched as stubs and then one by
/// one, streamed to disk, resumed with `Range`, pushed as streamed multipart PUTs. Runs
/// against `FERRY_COUCH_REFERENCE_URL` (a real CouchDB) when it is set, else against a Ferry
/// node's CouchDB API served in-process: the same tests, another target.
@Suite struct CouchLargeAttachmentTests {
    typealias T = CouchClientTesting

    /// A target database and how to end it.
    struct Target {
        let url: String
        let stop: @Sendable () async -> Void
        var endpoint: CouchEndpoint { try! CouchEndpoint.parse(url) }
        func http(stallTimeout: Duration = .seconds(30)) -> CouchHTTP {
            CouchHTTP(endpoint: endpoint, tls: nil, stallTimeout: stallTimeout, logger: T.quiet)
        }
    }

    static func target() async throws -> Target {
        if let url = CouchReferencePullTests.referenceURL { return Target(url: url, stop: {}) }
        let server = try await CouchTestServer.start()
        return Target(url: server.url, stop: { await server.stop() })
    }

    /// A data directory's store (blobs in files, as a node keeps them), removed by `cleanUp`.
    static func fileStore() throws -> (DocumentStore, cleanUp: () -> Void) {
        let dir = NSTemporaryDirectory() + "ferry-couch-large-\(UUID().uuidString)"
        let store = try DocumentStore.open(directory: dir)
        return (store, { try? FileManager.default.removeItem(atPath: dir) })
    }

    /// Content that compresses badly (so no server keeps it gzip-encoded).
    static func content(_ count: Int, seed: UInt8 = 7) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var x = UInt64(seed) &* 0x9E37_79B9_7F4A_7C15 | 1
        for i in 0..<count {
            x ^= x << 13
            x ^= x >> 7
            x ^= x << 17
            out[i] = UInt8(truncatingIfNeeded: x)
        }
        return out
    }

    /// Writes a document with one attachment through the target's API (`PUT` doc, `PUT` attachment).
    static func seedAttachment(_ http: CouchHTTP, id: String, name: String, bytes: [UInt8]) async throws -> String {
        let doc = try await http.json(.PUT, http.databasePath(CouchEndpoint.escapeDatabase(id)), body: ["kind": "scan"])
        let rev = try #require(doc["rev"]?.stringValue)
        let put = try await http.send(
            .PUT, http.databasePath(CouchEndpoint.escapeDatabase(id) + "/" + name), query: [("rev", rev)],
            headers: [("Content-Type", "application/octet-stream")], body: bytes)
        #expect(put.status == 201, "\(String(decoding: put.body, as: UTF8.self))")
        return try #require(put.json?["rev"]?.stringValue)
    }

    static func md5Hex(_ bytes: [UInt8]) -> String { Hex.encode(Array(Insecure.MD5.hash(data: bytes))) }

    @Test func aLargeAttachmentIsFetchedOnItsOwnAfterAStubAndStreamedIntoTheBlobStore() async throws {
        let target = try await Self.target()
        defer { Task { await target.stop() } }
        let http = target.http()
        defer { Task { await http.shutdown() } }
        let bytes = Self.content(3 << 20 + 17)
        let id = "scan-\(UUID().uuidString.lowercased())"
        let rev = try await Self.seedAttachment(http, id: id, name: "scan.bin", bytes: bytes)
        let (local, cleanUp) = try Self.fileStore()
        defer { cleanUp() }
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        let wires = try await remote.fetchRevisions(
            [RevisionRequest(id: try DocumentID(id), rev: try RevisionID(rev), ancestors: [])], deltas: false, maxHistory: 10)
        #expect(wires.count == 1 && !wires[0].missing)
        // Asked for separately, once, and never held in memory.
        #expect(remote.downloadState.withLock { $0.requests } == 1)
        #expect(remote.pullState.withLock { $0.heldBytes } == 0)
        let digest = BlobDigest.of(bytes)
        #expect(local.blobs.has(digest))
        let body = try JSON.parse(wires[0].content)
        #expect(body["@attachments"]?["scan.bin"]?["digest"]?.stringValue == digest.description)
        #expect(body["@attachments"]?["scan.bin"]?["length"]?.intValue == Int64(bytes.count))
    }

    @Test func aPartlyFetchedAttachmentResumesWithARangeRequest() async throws {
        let target = try await Self.target()
        defer { Task { await target.stop() } }
        let http = target.http()
        defer { Task { await http.shutdown() } }
        let bytes = Self.content(2 << 20 + 5, seed: 9)
        let id = "resume-\(UUID().uuidString.lowercased())"
        let rev = try await Self.seedAttachment(http, id: id, name: "part.bin", bytes: bytes)
        let (local, cleanUp) = try Self.fileStore()
        defer { cleanUp() }
        // What an interrupted run left: the first 1.5 MiB, keyed by the content's MD5 and length.
        let kept = 3 << 19
        let partial = "\(local.blobs.directory!)/tmp/resume-couch-\(Self.md5Hex(bytes))-\(bytes.count)"
        try Data(bytes[0..<kept]).write(to: URL(fileURLWithPath: partial))
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        _ = try await remote.fetchRevisions(
            [RevisionRequest(id: try DocumentID(id), rev: try RevisionID(rev), ancestors: [])], deltas: false, maxHistory: 10)
        #expect(remote.downloadState.withLock { $0.resumed } == 1)
        // Only the rest crossed the link.
        #expect(remote.downloadState.withLock { $0.bytes } == Int64(bytes.count - kept))
        #expect(try local.blobs.get(BlobDigest.of(bytes)) == bytes)
        #expect(!FileManager.default.fileExists(atPath: partial))
    }

    @Test func aPartialFileThatDoesNotMatchTheContentIsNeverStored() async throws {
        let target = try await Self.target()
        defer { Task { await target.stop() } }
        let http = target.http()
        defer { Task { await http.shutdown() } }
        let bytes = Self.content(2 << 20, seed: 3)
        let id = "torn-\(UUID().uuidString.lowercased())"
        let rev = try await Self.seedAttachment(http, id: id, name: "t.bin", bytes: bytes)
        let (local, cleanUp) = try Self.fileStore()
        defer { cleanUp() }
        let partial = "\(local.blobs.directory!)/tmp/resume-couch-\(Self.md5Hex(bytes))-\(bytes.count)"
        try Data([UInt8](repeating: 0xEE, count: 1 << 20)).write(to: URL(fileURLWithPath: partial))
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        let wires = try await remote.fetchRevisions(
            [RevisionRequest(id: try DocumentID(id), rev: try RevisionID(rev), ancestors: [])], deltas: false, maxHistory: 10)
        // The MD5 check refuses the revision this time and drops the torn file; the next fetch starts afresh.
        let pipeline = IncomingPipeline(policy: .trusted, filter: nil, maxBodyBytes: 1 << 20)
        if case .accepted = pipeline.check(wires[0], baseBody: { _, _ in nil }) { Issue.record("a torn attachment was accepted") }
        #expect(!FileManager.default.fileExists(atPath: partial))
        _ = try await remote.fetchRevisions(
            [RevisionRequest(id: try DocumentID(id), rev: try RevisionID(rev), ancestors: [])], deltas: false, maxHistory: 10)
        #expect(try local.blobs.get(BlobDigest.of(bytes)) == bytes)
    }

    @Test func aLargeAttachmentIsPushedAsAStreamedMultipartPut() async throws {
        let target = try await Self.target()
        defer { Task { await target.stop() } }
        let http = target.http()
        defer { Task { await http.shutdown() } }
        let (local, cleanUp) = try Self.fileStore()
        defer { cleanUp() }
        let bytes = Self.content(3 << 20, seed: 11)
        let id = try DocumentID("push-\(UUID().uuidString.lowercased())")
        try local.put(id, body: try CouchOutgoingDocumentTests.withAttachment(["kind": "scan"], name: "big.bin", bytes: bytes, revpos: 1, store: local))
        let remote = try await CouchRemote.open(http: http, store: local, logger: T.quiet)
        let counted = Locked(ReplicationSummary())
        remote.countBlobs { change in counted.withLock { change(&$0) } }
        let results = try await CouchPushTests.pushAll(local, remote)
        #expect(results.count == 1 && results.allSatisfy { $0.status == .stored }, "\(results)")
        #expect(remote.pushState.withLock { $0.streamedPuts } == 1)
        // Its bytes count as a blob's, as a push to a Ferry peer counts them.
        let summary = counted.withLock { $0 }
        #expect(summary.blobsSent == 1 && summary.blobBytesSent == Int64(bytes.count) && summary.blobBytesToSend == Int64(bytes.count), "\(summary)")
        #expect(remote.pushState.withLock { $0.bulkDocsRequests } == 0)
        let back = try await http.send(
            .GET, http.databasePath(CouchEndpoint.escapeDatabase(id.rawValue) + "/big.bin"), headers: [("Accept", "*/*")])
        #expect(back.status == 200)
        #expect(back.body == bytes)
    }

    @Test func aWholePullAndPushOfALargeAttachmentConverge() async throws {
        let target = try await Self.target()
        defer { Task { await target.stop() } }
        let seeder = target.http()
        defer { Task { await seeder.shutdown() } }
        let bytes = Self.content(4 << 20, seed: 21)
        let id = "round-\(UUID().uuidString.lowercased())"
        _ = try await Self.seedAttachment(seeder, id: id, name: "r.bin", bytes: bytes)
        let (local, cleanUp) = try Self.fileStore()
        defer { cleanUp() }
        var configuration = ReplicatorConfiguration()
        configuration.direction = .pull
        configuration.maxAttempts = 1
        configuration.documentIDs = [try DocumentID(id)]
        let replication = CouchReplication(endpoint: target.endpoint, logger: T.quiet)
        let replicator = replication.replicator(store: local, configuration: configuration, logger: T.quiet)
        await replicator.run()
        await replication.shutdown()
        #expect(replicator.status.error == nil, "\(String(describing: replicator.status.error))")
        #expect(try local.blobs.get(BlobDigest.of(bytes)) == bytes)
        #expect(try local.document(DocumentID(id)) != nil)
        // The summary counts what crossed: the attachment and the protocol's requests.
        let summary = replicator.summary
        #expect(summary.bytesReceived >= bytes.count && summary.bytesReceived < bytes.count + (1 << 20), "\(summary.bytesReceived)")
        #expect(summary.bytesSent > 0)
        // Its blob counts like a blob from a Ferry peer (progress in bytes, and the total).
        #expect(summary.blobsReceived == 1)
        #expect(summary.blobBytesReceived == Int64(bytes.count) && summary.blobBytesToReceive == Int64(bytes.count), "\(summary)")
    }
}

/// Stops and stalls: a stop ends any transfer at once; a transfer that moves nothing for the
/// stall period errors clearly, and one that keeps moving is never cut off.
@Suite struct CouchTransferLivenessTests {
    typealias T = CouchClientTesting

    @Test func aStopEndsADownloadThatWouldOtherwiseWaitForever() async throws {
        let silent = try SilentServer()
        let endpoint = try CouchEndpoint.parse("http://127.0.0.1:\(silent.port)/db")
        // A stall period longer than any test: only the stop can end this request.
        let http = CouchHTTP(endpoint: endpoint, tls: nil, stallTimeout: .seconds(3600), logger: T.quiet)
        defer { Task { await http.shutdown() } }
        let download = Task { () -> CouchClientError? in
            do throws(CouchClientError) {
                _ = try await http.download("/db/doc/att") { _ in }
                return nil
            } catch { return error }
        }
        try await T.waitUntil("the request is in flight") { http.inFlight.count > 0 }
        http.abort()
        let error = await download.value
        #expect(error?.code == "stopped")
        #expect(error?.isTransient == false)
        // Later requests are refused at once.
        await #expect(throws: CouchClientError.self) { _ = try await http.send(.GET, "/") }
    }

    @Test(.timeLimit(.minutes(1))) func aStopEndsAPinnedHTTPSRequestThatWouldOtherwiseWaitForItsTimeout() async throws {
        // A server that accepts and never answers: the TLS handshake itself never ends.
        let silent = try SilentServer()
        var endpoint = try CouchEndpoint.parse("https://127.0.0.1:\(silent.port)/db")
        endpoint.trust = .pinned(String(repeating: "ab", count: 32))
        let http = CouchHTTP(endpoint: endpoint, tls: nil, stallTimeout: .seconds(3600), logger: T.quiet)
        defer { Task { await http.shutdown() } }
        let request = Task { () -> CouchClientError? in
            do throws(CouchClientError) {
                _ = try await http.send(.GET, "/db/doc/att", timeout: .seconds(3600))
                return nil
            } catch { return error }
        }
        try await T.waitUntil("the request is in flight") { http.inFlight.count > 0 }
        http.abort()
        let error = await request.value
        #expect(error?.code == "stopped")
    }

    @Test func aTransferThatMovesNoByteForTheStallPeriodErrorsAsStalled() async throws {
        let silent = try SilentServer()
        let endpoint = try CouchEndpoint.parse("http://127.0.0.1:\(silent.port)/db")
        let http = CouchHTTP(endpoint: endpoint, tls: nil, stallTimeout: .milliseconds(300), logger: T.quiet)
        defer { Task { await http.shutdown() } }
        do throws(CouchClientError) {
            _ = try await http.download("/db/doc/att") { _ in }
            Issue.record("a silent server's download ended without an error")
        } catch {
            #expect(error.code == "stalled", "\(error)")
            #expect(error.isTransient)
        }
    }

    @Test func aSlowButMovingTransferOutlastsTheStallPeriod() async throws {
        let server = try await CouchTestServer.start()
        defer { Task { await server.stop() } }
        let bytes = CouchLargeAttachmentTests.content(6 << 20)
        let http = CouchHTTP(endpoint: server.endpoint, tls: nil, stallTimeout: .milliseconds(400), logger: T.quiet)
        defer { Task { await http.shutdown() } }
        _ = try await CouchLargeAttachmentTests.seedAttachment(http, id: "slow", name: "s.bin", bytes: bytes)
        // The sink takes its time: the whole transfer lasts several stall periods, each of
        // which still moves bytes.
        let received = Locked<Int>(0)
        let response = try await http.download(http.databasePath("slow/s.bin"), headers: [("Accept", "*/*")]) { chunk in
            received.withLock { $0 += chunk.readableBytes }
            usleep(20_000)
        }
        #expect(response.status == 200)
        #expect(received.withLock { $0 } == bytes.count)
    }
}

/// A TCP port that accepts connections (the kernel completes them) and never answers.
final class SilentServer: @unchecked Sendable {
    let fd: Int32
    let port: Int
    init() throws {
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, len) } }
        listen(s, 16)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(s, $0, &len) } }
        fd = s
        port = Int(UInt16(bigEndian: addr.sin_port))
    }
    deinit { close(fd) }
}
