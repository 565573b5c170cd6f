import FerryCore
import FerryStore
import FerrySync
import Foundation
import Logging
import NIOCore
import Testing
@testable import FerryTransport

/// A temporary data directory with its own identity.
final class TestNode: @unchecked Sendable {
    let directory: String
    let identity: NodeIdentity
    let store: DocumentStore

    init() throws {
        directory = NSTemporaryDirectory() + "ferry-net-" + UUID().uuidString
        identity = try NodeIdentity.loadOrCreate(directory: directory, name: "test-node")
        store = try DocumentStore.open(directory: directory)
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }
}

func quietLogger() -> Logger {
    var l = Logger(label: "test")
    l.logLevel = ProcessInfo.processInfo.environment["FERRY_TEST_LOG"] == nil ? .critical : .trace
    return l
}

/// Starts a listener for `server` on an ephemeral loopback port.
func startListener(
    _ server: TestNode, trust: PeerTrust, options: ReplicationResponder.Options = .init(),
    configure: (inout WebSocketListener.Configuration) -> Void = { _ in }
) async throws -> (WebSocketListener, Task<Void, any Error>, Int) {
    var config = WebSocketListener.Configuration()
    config.host = "127.0.0.1"
    config.port = 0
    config.authentication = .mutualTLS(trust)
    configure(&config)
    let listener = WebSocketListener(
        identity: server.identity, configuration: config,
        responder: ReplicationResponder(store: server.store, options: options, logger: quietLogger()), logger: quietLogger())
    let task = Task { try await listener.run() }
    let port = try await listener.waitUntilBound()
    return (listener, task, port)
}

func replicate(_ client: TestNode, url: String, pin: PeerTrust, direction: ReplicatorConfiguration.Direction = .pushAndPull,
               attempts: Int = 1, configure: (inout WebSocketConnector) -> Void = { _ in }) async throws -> Replicator {
    var connector = try WebSocketConnector(url: url, serverTrust: pin, identity: client.identity)
    connector.logger = quietLogger()
    configure(&connector)
    var config = ReplicatorConfiguration()
    config.direction = direction
    config.maxAttempts = attempts
    config.wiring.nodeID = client.identity.nodeID
    let r = Replicator(store: client.store, connector: connector.connector, configuration: config, logger: quietLogger())
    await r.run()
    return r
}

@Suite(.timeLimit(.minutes(10))) struct IdentityTests {
    @Test func theNodeIDIsTheSHA256OfTheCertificateDERAndStable() throws {
        let node = try TestNode()
        #expect(node.identity.nodeID.count == 64)
        #expect(node.identity.nodeID == NodeIdentity.fingerprint(node.identity.certificateDER))
        let again = try NodeIdentity.loadOrCreate(directory: node.directory)
        #expect(again.nodeID == node.identity.nodeID)
        let mode = try FileManager.default.attributesOfItem(atPath: node.identity.keyPath)[.posixPermissions] as! NSNumber
        #expect(mode.intValue & 0o777 == 0o600)
        #expect(node.identity.expires > Date().addingTimeInterval(365 * 86400))
    }

    @Test func aKeyReadableByOthersIsRefused() throws {
        let node = try TestNode()
        chmod(node.identity.keyPath, 0o644)
        #expect(throws: TransportError.self) { try NodeIdentity.loadOrCreate(directory: node.directory) }
        do { _ = try NodeIdentity.loadOrCreate(directory: node.directory) } catch {
            #expect(error.description.contains("readable by others"))
        }
    }

    @Test func corruptOrTamperedFilesAreRefusedClearly() throws {
        let node = try TestNode()
        let certText = try String(contentsOfFile: node.identity.certificatePath, encoding: .utf8)
        try "not a certificate".write(toFile: node.identity.certificatePath, atomically: true, encoding: .utf8)
        do {
            _ = try NodeIdentity.loadOrCreate(directory: node.directory)
            Issue.record("a corrupt certificate was accepted")
        } catch { #expect(error.description.contains("corrupt")) }
        // Another node's certificate with this key: it does not belong to the key.
        let other = try TestNode()
        try String(contentsOfFile: other.identity.certificatePath, encoding: .utf8)
            .write(toFile: node.identity.certificatePath, atomically: true, encoding: .utf8)
        do {
            _ = try NodeIdentity.loadOrCreate(directory: node.directory)
            Issue.record("a certificate for another key was accepted")
        } catch { #expect(error.description.contains("does not belong")) }
        try certText.write(toFile: node.identity.certificatePath, atomically: true, encoding: .utf8)
        try "garbage".write(toFile: node.identity.keyPath, atomically: true, encoding: .utf8)
        chmod(node.identity.keyPath, 0o600)
        do {
            _ = try NodeIdentity.loadOrCreate(directory: node.directory)
            Issue.record("a corrupt key was accepted")
        } catch { #expect(error.description.contains("corrupt")) }
    }

    @Test func anExpiredCertificateIsRefused() throws {
        let dir = NSTemporaryDirectory() + "ferry-exp-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        _ = try NodeIdentity.loadOrCreate(directory: dir, name: "old", now: Date().addingTimeInterval(-7200), validity: 3600)
        do {
            _ = try NodeIdentity.loadOrCreate(directory: dir)
            Issue.record("an expired certificate was accepted")
        } catch { #expect(error.description.contains("expired")) }
    }

    @Test func anExistingPEMIdentityCanBeImported() throws {
        let source = try TestNode()
        let dir = NSTemporaryDirectory() + "ferry-imp-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let imported = try NodeIdentity.importPEM(
            certificatePath: source.identity.certificatePath, keyPath: source.identity.keyPath, into: dir)
        #expect(imported.nodeID == source.identity.nodeID)
        #expect(throws: TransportError.self) {
            try NodeIdentity.importPEM(certificatePath: source.identity.certificatePath, keyPath: source.identity.keyPath, into: dir)
        }
    }
}

@Suite(.serialized, .timeLimit(.minutes(10))) struct TLSReplicationTests {
    @Test func aPinnedServerIsAcceptedAndReplicationConverges() async throws {
        let server = try TestNode()
        let client = try TestNode()
        try server.store.put(try DocumentID("from-server"), body: ["v": 1])
        try client.store.put(try DocumentID("from-client"), body: ["v": 2])
        let (listener, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID]))
        defer { task.cancel() }
        let r = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        #expect(r.status.error == nil)
        #expect(try server.store.document(try DocumentID("from-client")) != nil)
        #expect(try client.store.document(try DocumentID("from-server")) != nil)
        _ = listener
    }

    @Test func aDifferentSelfSignedServerIsRefusedBeforeAnyMessage() async throws {
        let server = try TestNode()
        let client = try TestNode()
        let impostor = try TestNode()
        try server.store.put(try DocumentID("secret"), body: ["v": 1])
        let (_, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID]))
        defer { task.cancel() }
        let r = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([impostor.identity.nodeID]))
        #expect(r.status.error?.code == "untrusted_peer")
        #expect(r.status.error?.isTransient == false)
        #expect(r.status.error?.description.contains(server.identity.nodeID) == true)
        #expect(try client.store.document(try DocumentID("secret")) == nil)
        #expect(try client.store.localDocument("x") == nil)
    }

    @Test func anUnknownClientCertificateIsRefusedByTheListener() async throws {
        let server = try TestNode()
        let stranger = try TestNode()
        let friend = try TestNode()
        try stranger.store.put(try DocumentID("intrusion"), body: [:])
        let (listener, task, port) = try await startListener(server, trust: .pinned([friend.identity.nodeID]))
        defer { task.cancel() }
        let r = try await replicate(stranger, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        #expect(r.status.error != nil)
        #expect(r.status.error?.isTransient == false)
        // Told apart from a pin mismatch: the server refused us, and may trust us later.
        #expect(r.status.error?.code == "not_trusted_by_peer")
        #expect(try server.store.document(try DocumentID("intrusion")) == nil)
        // The listener keeps serving trusted peers.
        let ok = try await replicate(friend, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        #expect(ok.status.error == nil)
        _ = listener
    }

    @Test func aTrustedPeerIsBoundToItsPolicyAndReadOnlyRefusesPush() async throws {
        let server = try TestNode()
        let client = try TestNode()
        try server.store.put(try DocumentID("public/1"), body: [:])
        try server.store.put(try DocumentID("private/1"), body: [:])
        try client.store.put(try DocumentID("upload"), body: [:])
        var options = ReplicationResponder.Options()
        options.policies[client.identity.nodeID] = PeerPolicy(read: AccessRule(idPrefixes: ["public/"]))
        options.readOnly = true
        let (_, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID]), options: options)
        defer { task.cancel() }
        let url = "wss://127.0.0.1:\(port)/ferry/sync"
        let pull = try await replicate(client, url: url, pin: .pinned([server.identity.nodeID]), direction: .pull)
        #expect(pull.status.error == nil)
        #expect(try client.store.document(try DocumentID("public/1")) != nil)
        #expect(try client.store.document(try DocumentID("private/1")) == nil)
        let push = try await replicate(client, url: url, pin: .pinned([server.identity.nodeID]), direction: .push)
        #expect(push.status.error?.code == "forbidden")
        #expect(try server.store.document(try DocumentID("upload")) == nil)
    }

    @Test func passwordAuthenticationAndWrongPathsGiveClearPermanentErrors() async throws {
        let server = try TestNode()
        let client = try TestNode()
        let (_, task, port) = try await startListener(server, trust: .acceptAnyPeer) {
            $0.authentication = .password(user: "clinic", password: "s3cret")
        }
        defer { task.cancel() }
        let url = "wss://127.0.0.1:\(port)/ferry/sync"
        let good = try await replicate(client, url: url, pin: .pinned([server.identity.nodeID])) {
            $0.credentials = ("clinic", "s3cret")
        }
        #expect(good.status.error == nil)
        let bad = try await replicate(client, url: url, pin: .pinned([server.identity.nodeID])) {
            $0.credentials = ("clinic", "guess")
        }
        #expect(bad.status.error?.description.contains("401") == true)
        #expect(bad.status.error?.isTransient == false)
        let wrongPath = try await replicate(client, url: "wss://127.0.0.1:\(port)/other/sync", pin: .pinned([server.identity.nodeID])) {
            $0.credentials = ("clinic", "s3cret")
        }
        #expect(wrongPath.status.error?.description.contains("404") == true)
    }

    @Test func aServerCanBePinnedByItsCertificateFile() async throws {
        let server = try TestNode()
        let client = try TestNode()
        try server.store.put(try DocumentID("pem"), body: [:])
        let (_, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID]))
        defer { task.cancel() }
        let trust = try PeerTrust.pinnedCertificate(pemFile: server.identity.certificatePath)
        #expect(trust == .pinned([server.identity.nodeID]))
        let r = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: trust)
        #expect(r.status.error == nil)
        #expect(throws: TransportError.self) { try PeerTrust.pinnedCertificate(pemFile: client.identity.keyPath) }
    }

    @Test func aRefusedConnectionIsTransient() async throws {
        let client = try TestNode()
        let r = try await replicate(client, url: "wss://127.0.0.1:1/ferry/sync", pin: .pinned(["00"]))
        #expect(r.status.error?.isTransient == true)
    }

    @Test func garbageAndTextFramesCloseOnlyThatConnection() async throws {
        let server = try TestNode()
        let client = try TestNode()
        let (_, task, port) = try await startListener(server, trust: .pinned([client.identity.nodeID]))
        defer { task.cancel() }
        // Raw garbage on the TCP port: the TLS handshake fails and the connection closes.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(connected == 0)
        let junk = [UInt8](repeating: 0x41, count: 4096)
        _ = junk.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        var buf = [UInt8](repeating: 0, count: 1024)
        var n = 1
        while n > 0 { n = read(fd, &buf, buf.count) }  // the server closes it
        close(fd)
        // A trusted client still replicates.
        try server.store.put(try DocumentID("after"), body: [:])
        let r = try await replicate(client, url: "wss://127.0.0.1:\(port)/ferry/sync", pin: .pinned([server.identity.nodeID]))
        #expect(r.status.error == nil)
        #expect(try client.store.document(try DocumentID("after")) != nil)
    }
}

/// A connection that cannot be made is reported in the user's terms, not NIO's.
@Suite struct ConnectFailureTests {
    @Test func aRefusedConnectionSaysConnectionRefused() async throws {
        // Port 1 on loopback: nothing listens there, so the kernel refuses at once.
        let connector = try WebSocketConnector(url: "ws://127.0.0.1:1/ferry/sync", serverTrust: .acceptAnyPeer, identity: nil)
        do {
            _ = try await connector.connect()
            Issue.record("connected to 127.0.0.1:1")
        } catch let error as TransportError {
            #expect(error.code == "connect_failed")
            #expect(error.message == "cannot connect to 127.0.0.1:1: connection refused")
        }
    }

    @Test func errnoAndNIOErrorsMapToPlainReasons() {
        #expect(WebSocketConnector.connectFailureReason(IOError(errnoCode: ECONNREFUSED, reason: "connect")) == "connection refused")
        #expect(WebSocketConnector.connectFailureReason(IOError(errnoCode: ETIMEDOUT, reason: "connect")) == "timed out")
        #expect(WebSocketConnector.connectFailureReason(IOError(errnoCode: EHOSTUNREACH, reason: "connect")) == "no route to host")
        #expect(WebSocketConnector.connectFailureReason(IOError(errnoCode: ENETUNREACH, reason: "connect")) == "no route to host")
        #expect(WebSocketConnector.connectFailureReason(ChannelError.connectTimeout(.seconds(10))) == "timed out")
        #expect(WebSocketConnector.connectFailureReason(SocketAddressError.unknown(host: "nowhere.invalid", port: 1)) == "host not found")
    }
}
