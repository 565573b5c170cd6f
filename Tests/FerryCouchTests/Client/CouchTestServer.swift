import FerryCore
import FerryStore
import Foundation
import Logging
import ServiceLifecycle
import Testing

@testable import FerryCouch
@testable import FerryCouchClient
@testable import FerryCouchDocuments


/// A Ferry node's CouchDB API served in-process on a loopback port, over its own store:
/// the server side that the CouchDB-protocol client tests replicate with.
final class CouchTestServer: Sendable {
    let store: DocumentStore
    let port: Int
    let group: ServiceGroup
    let run: Task<Void, any Error>
    /// The admin key's Basic credentials (user `admin`).
    static let adminPassword = ServerFrontDoorTests.adminKey

    /// `http://admin:KEY@127.0.0.1:PORT/ferry`.
    var url: String { "http://admin:\(Self.adminPassword)@127.0.0.1:\(port)/ferry" }

    var endpoint: CouchEndpoint { try! CouchEndpoint.parse(url) }

    static func start(store: DocumentStore? = nil) async throws -> CouchTestServer {
        try await launch(store: try store ?? DocumentStore.inMemory(), port: 0, tls: nil)
    }

    /// The same API on a given port (e.g. again on the port of a server stopped before).
    static func start(store: DocumentStore, port wanted: Int) async throws -> CouchTestServer {
        try await launch(store: store, port: wanted, tls: nil)
    }

    /// The same API over TLS with the given certificate and key (DER).
    static func startTLS(certificateDER: [UInt8], privateKeyDER: [UInt8], store: DocumentStore? = nil) async throws -> CouchTestServer {
        try await launch(
            store: try store ?? DocumentStore.inMemory(), port: 0,
            tls: .init(certificateDER: certificateDER, privateKeyDER: privateKeyDER))
    }

    /// Runs the listener and returns once it is bound; throws when it stops before binding
    /// (a port still taken, say), rather than waiting for a bind that never comes.
    private static func launch(store: DocumentStore, port wanted: Int, tls: CouchListenerService.TLSIdentity?) async throws -> CouchTestServer {
        let door = try ServerFrontDoorTests.frontDoor(store: store)
        let (bound, announce) = AsyncStream.makeStream(of: Int.self)
        var quiet = Logger(label: "ferry.test.couch")
        quiet.logLevel = .critical
        let service = try CouchListenerService(
            frontDoor: door, host: "127.0.0.1", port: wanted, tls: tls, logger: quiet, onBound: { announce.yield($0) })
        let group = ServiceGroup(configuration: .init(services: [service], logger: quiet))
        let run = Task {
            defer { announce.finish() }
            try await group.run()
        }
        var ports = bound.makeAsyncIterator()
        guard let port = await ports.next() else {
            let why = await run.result
            throw CouchClientError(.noPort, message: "the test server stopped before it bound: \(why)", isTransient: false)
        }
        return CouchTestServer(store: store, port: port, group: group, run: run)
    }

    /// An HTTP client of this server as the admin (for seeding it through its CouchDB API).
    func adminHTTP() -> CouchHTTP {
        var quiet = Logger(label: "ferry.test.couch.client")
        quiet.logLevel = .critical
        return CouchHTTP(endpoint: endpoint, tls: nil, logger: quiet)
    }

    init(store: DocumentStore, port: Int, group: ServiceGroup, run: Task<Void, any Error>) {
        self.store = store
        self.port = port
        self.group = group
        self.run = run
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await run.value
    }
}
