import FerryCore
import Foundation
import Logging
import ServiceLifecycle
import Testing

@testable import FerryCouch

/// The CouchDB API listener as a service.
@Suite(.timeLimit(.minutes(2))) struct ServerListenerTests {
    @Test func aGracefulShutdownFiresTheDatabasesShutdownSignal() async throws {
        let door = try ServerFrontDoorTests.frontDoor()
        let (bound, announce) = AsyncStream.makeStream(of: Int.self)
        let service = try CouchListenerService(
            frontDoor: door, host: "127.0.0.1", port: 0, logger: Logger(label: "test"), onBound: { announce.yield($0) })
        let group = ServiceGroup(configuration: .init(services: [service], logger: Logger(label: "test")))
        let run = Task { try await group.run() }
        var ports = bound.makeAsyncIterator()
        let port = await ports.next()
        #expect((port ?? 0) > 0)
        #expect(!door.database.shutdown.isFired)
        await group.triggerGracefulShutdown()
        try await run.value
        #expect(door.database.shutdown.isFired)
    }

    @Test func aTLSListenerRefusesAKeyThatIsNotDER() throws {
        let door = try ServerFrontDoorTests.frontDoor(.lan)
        #expect(throws: (any Error).self) {
            _ = try CouchListenerService(
                frontDoor: door, host: "127.0.0.1", port: 0, tls: .init(certificateDER: [1, 2, 3], privateKeyDER: [4, 5, 6]),
                logger: Logger(label: "test"))
        }
    }
}
