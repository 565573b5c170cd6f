import ArgumentParser
import FerryCore
import FerryCouch
import FerryDiscovery
import FerryNode
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging

/// `ferry id`: prints (creating if needed) or imports this node's identity.
struct ID: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "id", abstract: "Print this node's ID: the SHA-256 fingerprint of its certificate.",
        discussion: "Creates the identity (a self-signed P-256 certificate in DATA/identity) on first use.")

    @OptionGroup var global: GlobalOptions
    @Option(name: .customLong("import"), parsing: .upToNextOption, help: "Install an existing identity: CERT.pem KEY.pem.")
    var importFiles: [String] = []
    @Option(help: "Common name for a newly created certificate (default: the host name).") var name: String?

    func validate() throws {
        if !importFiles.isEmpty && importFiles.count != 2 { throw ValidationError("--import takes CERT.pem KEY.pem") }
    }

    func run() async throws {
        let identity: NodeIdentity
        if importFiles.count == 2 {
            identity = try NodeIdentity.importPEM(certificatePath: importFiles[0], keyPath: importFiles[1], into: global.dataDirectory)
        } else {
            identity = try NodeIdentity.loadOrCreate(directory: global.dataDirectory, name: name ?? NodeName.defaultName(host: ProcessInfo.processInfo.hostName, dataDirectory: global.dataDirectory))
        }
        let expires = ISO8601DateFormatter().string(from: identity.expires)
        if global.json {
            Output.json([
                "id": .string(identity.nodeID), "name": .string(identity.name),
                "certificate": .string(identity.certificatePath), "expires": .string(expires),
            ])
        } else {
            Output.line(identity.nodeID)
        }
    }
}

/// `ferry serve`: runs this node as a peer until SIGTERM/SIGINT.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run this node as a peer: TLS WebSocket listener, DNS-SD discovery, replication with trusted peers, admin API.",
        discussion: """
            With no configuration it runs on ./ferry-data with a generated identity, listens on \
            port 4985, serves the admin API on 127.0.0.1:4986 and the CouchDB API on \
            127.0.0.1:4987, and discovers peers over DNS-SD. \
            --config FILE reads a JSON config (docs/operations.md); flags override it. \
            Writes DATA/node.json ({"id","pid","port","url","adminURL","couchURL"}) when ready and removes \
            it on a clean exit. SIGTERM or SIGINT stop it gracefully (exit 0). Peers are given \
            as URL#NODEID, where NODEID is the other node's `ferry id`; they are dialled and \
            trusted to connect here.
            """)

    @OptionGroup var global: GlobalOptions
    @Option(help: "JSON config file (see docs/operations.md). Flags override it.") var config: String?
    @Option(help: "Listener port; 0 picks a free one (see node.json). Default 4985.") var port: Int?
    @Option(help: "Interface address to listen on. Default 0.0.0.0.") var interface: String?
    @Option(help: "Admin API port on 127.0.0.1; 0 picks a free one. Default 4986.") var adminPort: Int?
    @Option(help: "CouchDB API port on 127.0.0.1; 0 picks a free one. Default 4987.") var couchPort: Int?
    @Option(help: "auto: a free port for every listener (--port, --admin-port, --couch-port), as a second node on one machine needs. Explicit port flags win.")
    var ports: String?
    @Option(help: "Node name (DNS-SD instance, certificate CN). Default: the host name, then - and the data directory's name unless it is ferry-data.") var name: String?
    @Option(name: [.customLong("group"), .customLong("database")], help: "Group: the database name in /NAME/sync and in DNS-SD. Default ferry.")
    var group: String?
    @Option(help: "A peer to replicate with: wss://HOST:PORT/ferry/sync#NODEID (repeatable).") var peer: [String] = []
    @Option(help: "A node ID allowed to connect (repeatable).") var trust: [String] = []
    @Flag(inversion: .prefixedNo, help: "Discover peers over DNS-SD (avahi). Default on.") var discovery: Bool?
    @Flag(help: "Trust on first use: pin the first node seen in this group.") var tofu = false
    @Flag(help: "Refuse pushes from peers.") var readOnly = false
    @Flag(help: "DEVELOPMENT ONLY: plaintext ws:// instead of TLS.") var insecure = false
    @Flag(help: "DEVELOPMENT ONLY: accept any client certificate.") var acceptAnyPeer = false
    @Option(help: "Require HTTP Basic credentials instead of client certificates: USER:PASSWORD on the first line of this file (mode 0600). Or set FERRY_PASSWORD=USER:PASSWORD.")
    var passwordFile: String?
    /// Refused: a password in the command line is visible to every local user.
    @Option(help: .hidden) var password: String?
    @Option(help: "Also serve replication on this Unix domain socket.") var unix: String?
    @Flag(help: "Serve one replication session on stdin/stdout, then exit (for --exec over ssh).") var stdio = false

    func validate() throws {
        if let port, !(0...65535).contains(port) { throw ValidationError("--port must be 0...65535") }
        if let adminPort, !(0...65535).contains(adminPort) { throw ValidationError("--admin-port must be 0...65535") }
        if let couchPort, !(0...65535).contains(couchPort) { throw ValidationError("--couch-port must be 0...65535") }
        if let ports, ports != "auto" { throw ValidationError("--ports takes auto (a free port for every listener); got \(ports)") }
        if password != nil { throw ValidationError(ListenerPassword.argvRefusal) }
        for id in trust where NodeIDFormat.normalized(id) == nil {
            throw ValidationError("--trust \(id): \(NodeIDFormat.requirement)")
        }
    }

    /// The config file (if any) with the flags applied over it.
    func nodeConfiguration() throws -> NodeConfiguration {
        var c = try config.map { try NodeConfiguration.load(file: $0) } ?? NodeConfiguration()
        if ports == "auto" {
            c.port = 0
            c.adminPort = 0
            c.couch.port = 0
        }
        if let port { c.port = port }
        if let interface { c.interface = interface }
        if let adminPort { c.adminPort = adminPort }
        if let couchPort { c.couch.port = couchPort }
        if let name {
            c.name = name
        } else if c.name == ProcessInfo.processInfo.hostName {
            c.name = NodeName.defaultName(host: c.name, dataDirectory: global.dataDirectory)
        }
        if let group { c.group = group }
        if let discovery { c.discovery = discovery }
        if tofu { c.trustMode = .tofu }
        if readOnly { c.readOnly = true }
        for text in peer {
            let p = try FerryNode.Peer(parsing: text)
            c.peers.removeAll { $0.nodeID == p.nodeID }
            c.peers.append(.init(url: p.url, nodeID: p.nodeID))
        }
        for id in trust.map({ $0.lowercased() }) where !c.trust.contains(where: { $0.nodeID == id }) {
            c.trust.append(.init(nodeID: id))
        }
        c.insecure = insecure
        c.acceptAnyPeer = acceptAnyPeer
        c.unixSocket = unix
        if let credentials = try ListenerPassword.read(file: passwordFile) { c.password = credentials }
        return c
    }

    func run() async throws {
        if stdio { return try await serveStdio() }
        // The admin and CouchDB APIs on event loops of their own, apart from the peer links'.
        FrontDoorEventLoops.dedicate()
        // From the start a signal stops the node, whatever state it is in: one that comes
        // before the node runs makes it stop as soon as it starts.
        let signals = ShutdownSignals.install(limit: FerryNode.maximumGracefulShutdown + .seconds(5))
        defer { signals.cancel() }
        // Until the node is ready, info logs wait: a failed start-up prints its one line alone.
        // A level asked for in the environment (to watch start-up itself) shows at once.
        if LogLevel.environment == nil { StartupLogs.hold() }
        defer { StartupLogs.release(discarding: true) }
        let configuration = try nodeConfiguration()
        let dataDir = global.data ?? configuration.dataDirectory ?? global.dataDirectory
        LogLevel.set(configuration.logLevel)
        let node = try FerryNode(configuration: configuration, dataDirectory: dataDir, logger: Logger(label: "ferry"))
        let json = global.json
        let scheme = configuration.insecure ? "ws, NO TLS" : "wss, TLS 1.3"
        let run = Task {
            try await Self.run(node, configuration: configuration, dataDirectory: dataDir, json: json, scheme: scheme)
        }
        signals.attach(node: node, cancel: { run.cancel() })
        do {
            try await withTaskCancellationHandler { try await run.value } onCancel: { run.cancel() }
        } catch is CancellationError where signals.escalated {
            throw CLIError(message: "stopped at once by a second signal (work in flight was cancelled)")
        } catch is CancellationError {
            // A service that ended its graceful shutdown by cancelling its own work.
        }
    }

    /// The banner's discovery line: on, off, or unavailable with why.
    static func describe(_ discovery: DiscoveryAvailability?, group: String) -> String {
        switch discovery {
        case nil: return "off"
        case .available: return "DNS-SD on (_ferry._tcp, group \(group))"
        case .unavailable(let reason):
            return "DNS-SD unavailable (\(reason)); static peers (--peer) and group members are dialled at their known addresses, retrying in the background"
        }
    }

    /// One replication session on stdin/stdout; the default signal handling ends it.
    func serveStdio() async throws {
        let configuration = try nodeConfiguration()
        let dataDir = global.data ?? configuration.dataDirectory ?? global.dataDirectory
        // One session with the policies `serve` applies to a Unix-socket client (the
        // transport authenticates nobody). stdout carries the protocol: logs go to stderr.
        let store = try DocumentStore.open(directory: dataDir)
        let trust = try TrustStore(dataDirectory: dataDir, configuration: configuration)
        let replicators = ReplicationFactory(
            store: store, nodeID: store.uuid, trust: trust, configuration: configuration, logger: Logger(label: "ferry.sync.responder"))
        let endpoint = try await ByteStreamTransport.pipes(input: dup(STDIN_FILENO), output: dup(STDOUT_FILENO))
        await replicators.responder(authenticated: false).serve(endpoint)
    }

    static func run(_ node: FerryNode, configuration: NodeConfiguration, dataDirectory dataDir: String, json: Bool, scheme: String)
        async throws
    {
        try await node.run(handlesSignals: false) { ready in
            StartupLogs.release()
            if json {
                Output.json([
                    "id": .string(ready.nodeID), "port": .int(Int64(ready.port)), "adminPort": .int(Int64(ready.adminPort)),
                    "url": .string(ready.url), "adminURL": .string(ready.adminURL), "pid": .int(Int64(getpid())),
                    "couchURL": .string(ready.couchURL),
                ])
            } else {
                Output.line("""
                    Ferry node \(ready.nodeID)
                    listening on port \(ready.port) (\(scheme)); admin API \(ready.adminURL); data in \(dataDir)
                    CouchDB API \(ready.couchURL) (database \(configuration.group))\(ready.couchLANURL.map { "; on the LAN \($0)" } ?? "")
                    discovery: \(Self.describe(ready.discovery, group: configuration.group))
                    To let another node replicate with this one, run there:
                      ferry trust add \(ready.nodeID)
                    (or, without discovery: ferry serve --peer wss://<this-host>:\(ready.port)/\(configuration.group)/sync#\(ready.nodeID))
                    and trust it here with `ferry trust add <its ferry id>`. Ctrl-C stops.
                    """)
            }
            fflush(nil)
        }
    }
}

/// Owns SIGTERM and SIGINT for `ferry serve`: the first stops the node (at once, or as soon
/// as it is attached), a second cancels it, and a process still running `limit` after the
/// first exits 1. The signals come from `ProcessSignals`, which holds them blocked from the
/// process's first line, so one that comes before `install` is not lost.
struct ShutdownSignals {
    private let state: SignalState

    /// Whether a second signal came.
    var escalated: Bool { state.escalated }

    static func install(limit: Duration) -> ShutdownSignals {
        let state = SignalState(limit: limit)
        ProcessSignals.deliver { _ in state.received() }
        return ShutdownSignals(state: state)
    }

    /// The node a first signal stops and the action a second one takes; stops the node at
    /// once when a signal already came.
    func attach(node: FerryNode, cancel: @escaping @Sendable () -> Void) { state.attach(node: node, cancel: cancel) }

    /// Nothing to undo: a signal that comes while the process exits still reaches the
    /// handler (which finds the node stopped) instead of killing the process.
    func cancel() {}
}

/// The signals `ferry serve` has received and what they act on.
private final class SignalState: Sendable {
    private struct State {
        var count = 0
        var node: FerryNode?
        var cancel: (@Sendable () -> Void)?
    }

    private let state = Locked(State())
    private let limit: Duration

    init(limit: Duration) { self.limit = limit }

    var escalated: Bool { state.withLock { $0.count >= 2 } }

    func attach(node: FerryNode, cancel: @escaping @Sendable () -> Void) {
        let count = state.withLock { state -> Int in
            state.node = node
            state.cancel = cancel
            return state.count
        }
        if count >= 1 { node.stop() }
        if count >= 2 { cancel() }
    }

    func received() {
        let (count, node, cancel) = state.withLock { state in
            state.count += 1
            return (state.count, state.node, state.cancel)
        }
        if count == 1 {
            node?.stop()
            let seconds = Double(limit.components.seconds)
            DispatchQueue.global().asyncAfter(deadline: .now() + seconds) {
                Output.error("ferry: the node did not stop within \(Int(seconds)) s of the signal; exiting")
                _exit(1)
            }
        } else {
            cancel?()
        }
    }
}

/// The listener password `USER:PASSWORD` of `serve` and of `sync` to a password listener,
/// read from a file (refused, as ssh refuses a private key, when the group or others may read
/// it) or from `$FERRY_PASSWORD`; never from the command line, which every local user can
/// read in `ps` and /proc/PID/cmdline.
enum ListenerPassword {
    static let environmentVariable = "FERRY_PASSWORD"

    static let argvRefusal =
        "--password is refused: a password in the command line is visible to every local user (ps, /proc/PID/cmdline). "
        + "Put USER:PASSWORD on the first line of a file of mode 0600 and pass --password-file FILE, or set FERRY_PASSWORD=USER:PASSWORD."

    /// The credentials from `file` if given, else from the environment; nil when neither is set.
    static func read(
        file: String?, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(CLIError) -> (user: String, password: String)? {
        if let file {
            return try parse(try contents(of: file), source: "the password file \(file)")
        }
        guard let value = environment[environmentVariable], !value.isEmpty else { return nil }
        return try parse(value, source: "$\(environmentVariable)")
    }

    /// The file's text, once its mode shows that only its owner may read it.
    static func contents(of path: String) throws(CLIError) -> String {
        var st = stat()
        guard stat(path, &st) == 0 else { throw CLIError(message: "cannot read the password file \(path): \(String(cString: strerror(errno)))", status: 64) }
        guard st.st_mode & S_IFMT == S_IFREG else { throw CLIError(message: "the password file \(path) is not a regular file", status: 64) }
        let mode = st.st_mode & 0o777
        guard mode & 0o077 == 0 else {
            throw CLIError(
                message: "the password file \(path) is readable by others (mode \(String(mode, radix: 8))); run: chmod 600 \(path)", status: 64)
        }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw CLIError(message: "cannot read the password file \(path)", status: 64)
        }
        return text
    }

    /// `USER:PASSWORD` from the first line of `text`.
    static func parse(_ text: String, source: String) throws(CLIError) -> (user: String, password: String) {
        let line = text.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false).first.map {
            $0.hasSuffix("\r") ? String($0.dropLast()) : String($0)
        } ?? ""
        guard let colon = line.firstIndex(of: ":"), colon != line.startIndex, line.index(after: colon) != line.endIndex else {
            throw CLIError(message: "\(source) must hold USER:PASSWORD (a non-empty user and password)", status: 64)
        }
        return (String(line[..<colon]), String(line[line.index(after: colon)...]))
    }
}
