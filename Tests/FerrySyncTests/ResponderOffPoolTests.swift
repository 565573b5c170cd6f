import FerryCore
import FerryStore
import Foundation
import GRDBSQLite
import Testing

@testable import FerrySync

/// A responder's bulk store work runs on threads made for blocking work: pushes waiting on a
/// busy database leave Swift's cooperative pool free for every other task.
@Suite struct ResponderOffPoolTests {
    @Test func bulkPushesWaitingOnABusyDatabaseLeaveTheCooperativePoolRunning() async throws {
        let dir = NSTemporaryDirectory() + "ferry-offpool-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try DocumentStore.open(directory: dir)
        let responder = ReplicationResponder(store: store)
        // More pushing peers than the pool has threads, each with a bulk putRevs (8 × 1 KiB).
        let n = ProcessInfo.processInfo.activeProcessorCount + 2
        let source = try DocumentStore.inMemory()
        var batches: [[UInt8]] = []
        for peer in 0..<n {
            var wires: [WireRevision] = []
            for i in 0..<8 {
                let id = docID("p\(peer)-\(i)")
                let rev = try source.put(id, body: ["pad": .string(String(repeating: "x", count: 1024))])
                let tree = try #require(try source.revisionTree(id))
                wires.append(try #require(WireRevision.make(id: id, revision: rev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: 20)).0)
            }
            batches.append(WireRevision.encodeBatch(wires))
        }
        #expect(batches.allSatisfy { $0.count >= ReplicatorTuning.offPoolRequestBytes })
        var sessions: [ResponderSession] = []
        for peer in 0..<n {
            let session = ResponderSession(responder: responder, authenticatedPeer: nil)
            let hello: JSON = ["nodeID": .string("peer-\(peer)"), "protocol": [1]]
            let reply = await session.handle(
                Message(kind: .request, number: 1, properties: [("Profile", SyncProtocol.Profile.hello)], body: hello.canonicalBytes))
            #expect(reply?.kind == .response)
            sessions.append(session)
        }

        // Another connection holds the database's write lock: every push waits for it.
        let lock = try WriteLockHolder(path: (dir as NSString).appendingPathComponent(DocumentStore.databaseFileName))
        defer { lock.close() }
        // Were the pool's threads blocked, nothing on it could release the lock: a plain thread
        // then releases it after a minute, and the test fails instead of hanging.
        let releasedByPool = DispatchSemaphore(value: 0)
        let watchdogFired = Locked(false)
        Thread.detachNewThread {
            if releasedByPool.wait(timeout: .now() + 60) == .timedOut {
                watchdogFired.withLock { $0 = true }
                lock.release()
            }
        }
        let replies = await withTaskGroup(of: Message?.self) { group in
            for (i, session) in sessions.enumerated() {
                let body = batches[i]
                group.addTask {
                    await session.handle(Message(kind: .request, number: 2, properties: [("Profile", SyncProtocol.Profile.putRevs)], body: body))
                }
            }
            // A task on the pool sees every push waiting at once, then lets them through.
            while !sessions.allSatisfy({ $0.working.withLock { $0 } > 0 }) && !watchdogFired.withLock({ $0 }) { await Task.yield() }
            lock.release()
            releasedByPool.signal()
            var out: [Message?] = []
            for await reply in group { out.append(reply) }
            return out
        }
        #expect(!watchdogFired.withLock { $0 }, "the waiting pushes held the cooperative pool")
        for reply in replies {
            var statuses: [JSON?] = []
            if case .array(let results)? = try? reply?.json()["results"] { statuses = results.map { $0["status"] } }
            #expect(statuses == Array(repeating: "ok", count: 8), "\(String(describing: reply))")
        }
        #expect(try store.allDocuments().count == 8 * n)
    }
}

/// A second SQLite connection holding a database's write lock until released.
final class WriteLockHolder: @unchecked Sendable {
    // @unchecked: `connection` is used under `held`'s lock only.
    private var connection: OpaquePointer?
    private let held = Locked(false)

    init(path: String) throws {
        guard sqlite3_open(path, &connection) == SQLITE_OK, sqlite3_exec(connection, "BEGIN IMMEDIATE", nil, nil, nil) == SQLITE_OK else {
            throw StoreError.database("cannot hold the write lock of \(path)")
        }
        held.withLock { $0 = true }
    }

    func release() {
        held.withLock { h in
            if h { sqlite3_exec(connection, "ROLLBACK", nil, nil, nil) }
            h = false
        }
    }

    func close() {
        release()
        held.withLock { _ in sqlite3_close(connection) }
    }
}
