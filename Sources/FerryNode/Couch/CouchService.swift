import Crypto
import FerryCore
import FerryCouch
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging
import NIOCore
import ServiceLifecycle

// The node's CouchDB HTTP API: its database, who may use it, and its listeners.
extension FerryNode {
    /// The node's database as the CouchDB API serves it: the group's name, the store, the
    /// pull filter peers face, and a server UUID stable for the node.
    func makeCouchDatabase(shutdown: CouchShutdown = CouchShutdown()) -> CouchDatabase {
        let filter = replicators.pullFilter.map { ReplicationFactory.carryingMembership($0) }
        var database = CouchDatabase(
            name: configuration.group, store: store, pullFilter: filter,
            maxRequestBytes: configuration.couch.effectiveMaxRequestBytes(configuration.limits),
            serverUUID: String(identity.nodeID.prefix(32)), logger: Logger(label: "ferry.couch"), shutdown: shutdown,
            metrics: metrics.sync)
        database.vendorVersion = FerryVersion.current
        database.queryTimeout = .seconds(configuration.couch.queryTimeoutSeconds)
        let fetcher = DeferredBlobFetcher(store: store, replicators: liveReplicators.list, logger: logger)
        database.fetchDeferredBlob = { digest in try await fetcher.ensure(digest) }
        return database
    }

    /// Users (config and run-time), session cookies (signed with DATA/couch-session.key), web
    /// origins and the admin key.
    func makeCouchAccess() throws(NodeError) -> CouchAccess {
        let couch = configuration.couch
        let key = adminKey
        return CouchAccess(
            users: couchUsers.table,
            sessions: CouchSessionCookies(
                secret: try CouchSessionSecret.loadOrCreate(dataDirectory: dataDirectory), lifetime: TimeInterval(couch.sessionSeconds)),
            cors: CouchCORSPolicy(origins: couch.corsOrigins),
            adminKey: { key.matches($0) },
            adminKeyFingerprint: Hex.encode(SHA256.hash(data: Array(("ferry couch session " + key.value).utf8))),
            throttle: .couch(logger: Logger(label: "ferry.couch")))
    }

    /// The loopback listener and, when configured, the LAN one, each behind a StartupGuard
    /// that explains a port in use.
    func makeCouchServices(readiness: ReadinessBox) throws -> [any Service] {
        let database = makeCouchDatabase()
        let access = try makeCouchAccess()
        let couch = configuration.couch
        let idle = TimeAmount.seconds(Int64(couch.idleTimeoutSeconds))
        let loopbackGate = couchGate("couch", listeners: couch.lan == nil ? 1 : 2)
        var services: [any Service] = [
            StartupGuard(
                role: .couch("127.0.0.1", couch.port),
                service: try CouchListenerService(
                    frontDoor: CouchFrontDoor(database: database, access: access, listener: .loopback), host: "127.0.0.1", port: couch.port,
                    logger: logger, idleTimeout: idle, admit: { loopbackGate.admit($0) }, onBound: { readiness.couchBound($0) }))
        ]
        if let lan = couch.lan {
            let lanGate = couchGate("couch-lan", listeners: 2)
            let tls = CouchListenerService.TLSIdentity(
                certificateDER: identity.certificateDER, privateKeyDER: Array(identity.privateKey.derRepresentation))
            services.append(
                StartupGuard(
                    role: .couchLAN(lan.interface, lan.port),
                    service: try CouchListenerService(
                        frontDoor: CouchFrontDoor(database: database, access: access, listener: .lan), host: lan.interface, port: lan.port,
                        tls: tls, logger: logger, idleTimeout: idle, admit: { lanGate.admit($0) }, onBound: { readiness.couchLANBound($0) })))
        }
        return services
    }

    /// A CouchDB listener's gate: the configured caps, the total lowered to its share of the
    /// open-file limit (`DescriptorBudget`).
    func couchGate(_ name: String, listeners: Int) -> ListenerGate {
        let couch = configuration.couch
        let total = DescriptorBudget.current.couchTotal(configured: couch.maxConnections, listeners: listeners)
        return ListenerGate(name: name, limits: .init(total: total, perAddress: couch.maxConnectionsPerAddress), logger: logger)
    }
}

/// The secret that signs the CouchDB API's session cookies: 32 random bytes in
/// DATA/couch-session.key (mode 0600), so sessions survive a restart and no other user can forge one.
enum CouchSessionSecret {
    static func path(dataDirectory: String) -> String { "\(dataDirectory)/couch-session.key" }

    static func loadOrCreate(dataDirectory: String) throws(NodeError) -> [UInt8] {
        let path = path(dataDirectory: dataDirectory)
        if !FileManager.default.fileExists(atPath: path) {
            let secret = Hex.encode(SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
            if fd >= 0 {
                defer { close(fd) }
                fchmod(fd, 0o600)
                let bytes = Array((secret + "\n").utf8)
                let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                fsync(fd)
                guard written == bytes.count else { throw .badConfiguration("cannot write the session secret \(path): errno \(errno)") }
                return Array(secret.utf8)
            } else if errno != EEXIST {
                throw .badConfiguration("cannot create the session secret \(path): errno \(errno)")
            }
        }
        guard let attrs = try? FileManager.default.attributesOfItem(atPath: path),
            let text = try? String(contentsOfFile: path, encoding: .utf8)
        else { throw .badConfiguration("cannot read the session secret \(path)") }
        if let mode = (attrs[.posixPermissions] as? NSNumber)?.uint16Value, mode & 0o077 != 0 {
            throw .badConfiguration("the session secret \(path) is readable by others (mode \(String(mode, radix: 8))); run: chmod 600 \(path)")
        }
        let value = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard value.count >= 32 else { throw .badConfiguration("the session secret \(path) is too short; delete it and restart the node") }
        return Array(value.utf8)
    }
}

extension NodeConfiguration.Couch {
    /// A `couch.users` entry for the config file: the name, a freshly salted PBKDF2-SHA256
    /// hash of `password`, and the policy (everything, or read-only).
    public static func userEntry(name: String, password: String, iterations: Int, readOnly: Bool) throws -> JSON {
        if let problem = CouchUser.nameProblem(name) { throw NodeError.badConfiguration("user name \(LogText.escape(name)) \(problem)") }
        guard !password.isEmpty else { throw NodeError.badConfiguration("the password is empty") }
        let hash = try CouchPasswordHash(password: password, iterations: iterations)
        let policy = readOnly ? PeerPolicy(read: .all, write: .none, mayDelete: false) : PeerPolicy.trusted
        return ["name": .string(name), "password": .string(hash.description), "policy": policy.json]
    }
}
