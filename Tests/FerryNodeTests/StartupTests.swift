import FerryCore
import FerryTransport
import Foundation
import Logging
import ServiceLifecycle
import Testing

@testable import FerryNode

/// A node that cannot start stops, and a node can be stopped before it is ready.
@Suite(.serialized, .timeLimit(.minutes(5))) struct StartupTests {
    func makeNode(_ configure: (inout NodeConfiguration) -> Void = { _ in }) throws -> (FerryNode, String) {
        var c = NodeConfiguration()
        c.port = 0
        c.adminPort = 0
        c.couch.port = 0
        c.interface = "127.0.0.1"
        c.discovery = false
        c.name = "test"
        configure(&c)
        let dir = NSTemporaryDirectory() + "ferry-startup-\(UUID().uuidString)"
        return (try FerryNode(configuration: c, dataDirectory: dir), dir)
    }

    @Test func aTakenAdminPortEndsRunWithAStartFailureNamingThePortAndTheFix() async throws {
        let holder = try await InProcessNode.start { _ in }
        defer { Task { await holder.stop() } }
        let (node, dir) = try makeNode { $0.adminPort = holder.ready.adminPort }
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let port = holder.ready.adminPort
        await #expect(throws: NodeError.startFailed("admin port \(port) is in use (another ferry serve? pass --ports auto for free ports, or --admin-port 0)")) {
            try await node.run()
        }
        #expect(!FileManager.default.fileExists(atPath: dir + "/node.json"))
    }

    @Test func aTakenListenerPortEndsRunWithAStartFailure() async throws {
        let holder = try await InProcessNode.start { _ in }
        defer { Task { await holder.stop() } }
        let (node, dir) = try makeNode { $0.port = holder.ready.port }
        defer { try? FileManager.default.removeItem(atPath: dir) }
        await #expect(throws: NodeError.startFailed("port \(holder.ready.port) is in use (another ferry serve? pass --ports auto for free ports, or --port 0)")) {
            try await node.run()
        }
    }

    @Test func stopBeforeRunMakesRunReturnWithoutStarting() async throws {
        let (node, dir) = try makeNode()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        node.stop()
        try await node.run(handlesSignals: false) { _ in Issue.record("a stopped node became ready") }
        #expect(!FileManager.default.fileExists(atPath: dir + "/node.json"))
    }

    @Test func stopEndsARunningNodeCleanly() async throws {
        let (node, dir) = try makeNode()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (readyStream, ready) = AsyncStream.makeStream(of: FerryNode.Ready.self)
        let run = Task { try await node.run(handlesSignals: false) { ready.yield($0) } }
        var readiness = readyStream.makeAsyncIterator()
        _ = await readiness.next()
        #expect(FileManager.default.fileExists(atPath: dir + "/node.json"))
        node.stop()
        try await run.value
        #expect(!FileManager.default.fileExists(atPath: dir + "/node.json"))
    }

    @Test func waitingForTheAdminPortEndsWhenCancelled() async throws {
        let box = ReadinessBox()
        let waiter = Task { try await box.adminPort() }
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        // A port announced later still reaches later waiters.
        box.adminBound(4242)
        #expect(try await box.adminPort() == 4242)
    }

    @Test func gracefulShutdownBeforeReadinessEndsTheReadinessService() async throws {
        let (node, dir) = try makeNode()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // A listener that is never run never binds, so readiness waits for ever unless
        // shutdown ends the wait.
        let listener = node.makeListener(responder: node.makeResponder(authenticated: true))
        let readiness = ReadinessService(node: node, listener: listener, readiness: ReadinessBox(), onReady: { _ in })
        let group = ServiceGroup(configuration: .init(services: [readiness], logger: Logger(label: "test")))
        let run = Task { try await group.run() }
        await group.triggerGracefulShutdown()
        try await run.value
        #expect(!FileManager.default.fileExists(atPath: dir + "/node.json"))
    }
}
