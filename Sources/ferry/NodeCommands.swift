import ArgumentParser
import FerryCore
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
            identity = try NodeIdentity.loadOrCreate(directory: global.dataDirectory, name: name ?? ProcessInfo.processInfo.hostName)
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
        abstract: "Run this node as a peer: the TLS WebSocket listener and replicators to --peer nodes.",
        discussion: """
            Writes DATA/node.json ({"id","pid","port","url"}) when ready and removes it on a clean \
            exit. SIGTERM or SIGINT stop it gracefully. Peers are given as URL#NODEID, where NODEID \
            is the other node's `ferry id`; they are dialled and also trusted to connect here.
            """)

    @OptionGroup var global: GlobalOptions
    @Option(help: "Listener port; 0 picks a free one (see node.json).") var port = 4985
    @Option(help: "Interface address to listen on.") var interface = "0.0.0.0"
    @Option(help: "Database name in the URL path /NAME/sync.") var database = "ferry"
    @Option(help: "A peer to replicate with: wss://HOST:PORT/ferry/sync#NODEID (repeatable).") var peer: [String] = []
    @Option(help: "A node ID allowed to connect (repeatable).") var trust: [String] = []
    @Flag(help: "Refuse pushes from peers.") var readOnly = false
    @Flag(help: "DEVELOPMENT ONLY: plaintext ws:// instead of TLS.") var insecure = false
    @Flag(help: "DEVELOPMENT ONLY: accept any client certificate.") var acceptAnyPeer = false
    @Option(help: "Require HTTP Basic credentials USER:PASSWORD instead of client certificates.") var password: String?
    @Option(help: "Also serve replication on this Unix domain socket.") var unix: String?
    @Flag(help: "Serve one replication session on stdin/stdout, then exit (for --exec over ssh).") var stdio = false

    func validate() throws {
        if !(0...65535).contains(port) { throw ValidationError("--port must be 0...65535") }
        if let password, !password.contains(":") { throw ValidationError("--password takes USER:PASSWORD") }
        for id in trust where id.count != 64 || !id.allSatisfy(\.isHexDigit) {
            throw ValidationError("--trust \(id): a node ID is 64 hex digits (see `ferry id`)")
        }
    }

    func run() async throws {
        if stdio {
            // stdout carries the protocol: everything else goes to stderr.
            let store = try global.openStore()
            let endpoint = try await ByteStreamTransport.pipes(input: dup(STDIN_FILENO), output: dup(STDOUT_FILENO))
            var options = ReplicationResponder.Options()
            options.readOnly = readOnly
            options.nodeID = store.uuid
            await ReplicationResponder(store: store, options: options).serve(endpoint)
            return
        }
        var options = FerryNode.Options()
        options.dataDirectory = global.dataDirectory
        options.host = interface
        options.port = port
        options.databaseName = database
        options.peers = try peer.map { try FerryNode.Peer(parsing: $0) }
        options.trusted = Set(trust.map { $0.lowercased() })
        options.readOnly = readOnly
        options.insecure = insecure
        options.acceptAnyPeer = acceptAnyPeer
        options.unixSocket = unix
        if let password, let colon = password.firstIndex(of: ":") {
            options.password = (String(password[..<colon]), String(password[password.index(after: colon)...]))
        }
        let node = try FerryNode(options: options, logger: Logger(label: "ferry"))
        let json = global.json
        let dataDir = global.dataDirectory
        let scheme = insecure ? "ws, NO TLS" : "wss, TLS 1.3"
        let dbName = database
        try await node.run { port, id in
            if json {
                Output.json(["id": .string(id), "port": .int(Int64(port)), "pid": .int(Int64(getpid()))])
            } else {
                Output.line("""
                    Ferry node \(id)
                    listening on port \(port) (\(scheme)); data in \(dataDir)
                    To let another node replicate with this one, run there:
                      ferry serve --peer wss://<this-host>:\(port)/\(dbName)/sync#\(id)
                    and trust it here with --trust <its ferry id>. Ctrl-C stops.
                    """)
            }
            fflush(nil)
        }
    }
}
