import FerryCore
import FerryCouch
import FerrySync
import FerryTransport
import Foundation
import Testing

@testable import FerryNode

/// The CouchDB API of a node run in-process, over real sockets: where it listens, who gets
/// in, and what the others are answered.
@Suite(.serialized, .timeLimit(.minutes(5))) struct CouchListenerTests {
    /// One HTTP/1.1 exchange on 127.0.0.1:`port` (`Connection: close`), as raw bytes so that
    /// every header, `Host` included, is exactly what the test says.
    struct Reply {
        let status: Int
        let headers: [(String, String)]
        let body: String
        var json: JSON { (try? JSON.parse(Array(body.utf8))) ?? .null }
        func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
    }

    static func http(_ port: Int, _ method: String, _ path: String, headers: [String: String] = [:], body: String? = nil) async throws -> Reply {
        try await offCooperativeThreads { try blockingHTTP(port, method, path, headers: headers, body: body) }
    }

    /// Runs blocking I/O on a Dispatch thread: blocking Swift's few cooperative threads
    /// would starve the in-process node that has to answer.
    static func offCooperativeThreads<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(with: Result { try work() }) }
        }
    }

    static func blockingHTTP(_ port: Int, _ method: String, _ path: String, headers: [String: String], body: String?) throws -> Reply {
        var lines = ["\(method) \(path) HTTP/1.1"]
        if headers["Host"] == nil { lines.append("Host: 127.0.0.1:\(port)") }
        for (k, v) in headers.sorted(by: { $0.key < $1.key }) { lines.append("\(k): \(v)") }
        if let body { lines.append("Content-Length: \(body.utf8.count)") }
        lines.append("Connection: close")
        let request = lines.joined(separator: "\r\n") + "\r\n\r\n" + (body ?? "")
        let reply = try LoopbackSocket.exchange(port: port, request)
        let text = String(decoding: reply, as: UTF8.self)
        let parts = text.components(separatedBy: "\r\n\r\n")
        let head = parts.first?.components(separatedBy: "\r\n") ?? []
        let status = Int(head.first?.split(separator: " ").dropFirst().first ?? "") ?? -1
        let fields = head.dropFirst().compactMap { line -> (String, String)? in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        var body = parts.dropFirst().joined(separator: "\r\n\r\n")
        if fields.contains(where: { $0.0.lowercased() == "transfer-encoding" && $0.1.lowercased() == "chunked" }) { body = dechunk(body) }
        return Reply(status: status, headers: fields, body: body)
    }

    static func dechunk(_ text: String) -> String {
        var out = ""
        var rest = Substring(text)
        while let lineEnd = rest.range(of: "\r\n"), let size = Int(rest[..<lineEnd.lowerBound], radix: 16), size > 0 {
            let start = lineEnd.upperBound
            let chunk = rest.utf8[start...].prefix(size)
            out += String(decoding: chunk, as: UTF8.self)
            rest = Substring(String(decoding: rest.utf8[start...].dropFirst(size + 2), as: UTF8.self))
        }
        return out
    }

    static func basic(_ user: String, _ password: String) -> String { "Basic " + Data("\(user):\(password)".utf8).base64EncodedString() }

    static let readerHash: String = { (try? CouchPasswordHash(password: "r-pass", iterations: 10_000).description) ?? "" }()
    static let writerHash: String = { (try? CouchPasswordHash(password: "w-pass", iterations: 10_000).description) ?? "" }()

    /// A node with a read-only user `reader`, a full user `writer` and one allowed web origin.
    static func startNode(_ configure: @escaping (inout NodeConfiguration) -> Void = { _ in }) async throws -> InProcessNode {
        let couch: JSON = [
            "port": 0,
            "users": [
                ["name": "reader", "password": .string(readerHash), "policy": ["read": "all", "write": "none", "mayDelete": false]],
                ["name": "writer", "password": .string(writerHash)],
            ],
            "cors": ["origins": ["https://app.example"]],
        ]
        let parsed = try NodeConfiguration.parse(["couch": couch], file: "test.json").couch
        return try await InProcessNode.start({
            $0.discovery = false
            $0.couch = parsed
            configure(&$0)
        })
    }

    @Test func nodeJSONReportsTheBoundCouchURLAndTheWelcomeIsOpen() async throws {
        let n = try await Self.startNode()
        let info = try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: n.directory + "/node.json"))))
        let port = n.ready.couchPort
        #expect(port > 0 && port != 4987)
        #expect(info["couchURL"] == .string("http://127.0.0.1:\(port)/"))
        #expect(n.ready.couchURL == "http://127.0.0.1:\(port)/")
        let welcome = try await Self.http(port, "GET", "/")
        #expect(welcome.status == 200 && welcome.json["couchdb"] == "Welcome", "\(welcome.body)")
        #expect(try await Self.http(port, "GET", "/_up").status == 200)
        await n.stop()
    }

    @Test func withoutCredentialsEverythingButTheWelcomeIs401() async throws {
        let n = try await Self.startNode()
        let port = n.ready.couchPort
        for path in ["/_all_dbs", "/ferry", "/ferry/_changes", "/ferry/a", "/_uuids"] {
            let r = try await Self.http(port, "GET", path)
            #expect(r.status == 401 && r.json["error"] == "unauthorized", "\(path): \(r.body)")
        }
        let put = try await Self.http(port, "PUT", "/ferry/a", headers: ["Content-Type": "application/json"], body: "{}")
        #expect(put.status == 401)
        #expect(try n.node.store.document(try DocumentID("a")) == nil)
        await n.stop()
    }

    @Test func theAdminKeyWorksAsBearerAndAsBasicOnBothAPIs() async throws {
        let n = try await Self.startNode()
        let key = n.node.adminKey.value
        for auth in ["Bearer \(key)", Self.basic("admin", key)] {
            let dbs = try await Self.http(n.ready.couchPort, "GET", "/_all_dbs", headers: ["Authorization": auth])
            #expect(dbs.status == 200 && dbs.json == ["ferry"], "\(dbs.body)")
            let session = try await Self.http(n.ready.couchPort, "GET", "/_session", headers: ["Authorization": auth])
            #expect(session.json["userCtx"] == ["name": "admin", "roles": ["_admin"]])
            // The admin API takes the same credentials.
            #expect(try await Self.http(n.ready.adminPort, "GET", "/", headers: ["Authorization": auth]).status == 200)
        }
        #expect(try await Self.http(n.ready.couchPort, "GET", "/_all_dbs", headers: ["Authorization": "Bearer nope"]).status == 401)
        #expect(try await Self.http(n.ready.adminPort, "GET", "/", headers: ["Authorization": Self.basic("admin", "nope")]).status == 401)
        await n.stop()
    }

    @Test func aReadOnlyUserReadsButMayNotWrite() async throws {
        let n = try await Self.startNode()
        let port = n.ready.couchPort
        let reader = ["Authorization": Self.basic("reader", "r-pass")]
        #expect(try await Self.http(port, "GET", "/_all_dbs", headers: reader).status == 200)
        let wrong = try await Self.http(port, "GET", "/_all_dbs", headers: ["Authorization": Self.basic("reader", "nope")])
        #expect(wrong.status == 401 && wrong.json["reason"] == "Name or password is incorrect.")
        _ = try n.node.store.put(try DocumentID("seen"), body: ["v": 1])
        // The document endpoints apply the user's policy (checked once they are served).
        let read = try await Self.http(port, "GET", "/ferry/seen", headers: reader)
        if read.status == 501 { await n.stop(); return }
        #expect(read.status == 200 && read.json["v"] == 1, "\(read.body)")
        let write = try await Self.http(port, "PUT", "/ferry/new", headers: reader.merging(["Content-Type": "application/json"]) { $1 }, body: #"{"v":2}"#)
        #expect(write.status == 403 && write.json["error"] == "forbidden", "\(write.body)")
        #expect(try n.node.store.document(try DocumentID("new")) == nil)
        let writer = ["Authorization": Self.basic("writer", "w-pass"), "Content-Type": "application/json"]
        #expect(try await Self.http(port, "PUT", "/ferry/new", headers: writer, body: #"{"v":2}"#).status == 201)
        await n.stop()
    }

    @Test func aSessionCookieLogsInAndOut() async throws {
        let n = try await Self.startNode()
        let port = n.ready.couchPort
        let login = try await Self.http(
            port, "POST", "/_session", headers: ["Content-Type": "application/x-www-form-urlencoded"], body: "name=writer&password=w-pass")
        #expect(login.status == 200 && login.json == ["ok": true, "name": "writer", "roles": []], "\(login.body)")
        let cookie = String((login.header("Set-Cookie") ?? "").prefix { $0 != ";" })
        #expect(cookie.hasPrefix("AuthSession="))
        let session = try await Self.http(port, "GET", "/_session", headers: ["Cookie": cookie])
        #expect(session.json["userCtx"]?["name"] == "writer")
        #expect(try await Self.http(port, "GET", "/_all_dbs", headers: ["Cookie": cookie]).status == 200)
        let logout = try await Self.http(port, "DELETE", "/_session", headers: ["Cookie": cookie])
        #expect(logout.status == 200 && logout.header("Set-Cookie")?.contains("Max-Age=0") == true)
        // The secret that signs cookies is the node's alone.
        let mode = try FileManager.default.attributesOfItem(atPath: n.directory + "/couch-session.key")[.posixPermissions] as? NSNumber
        #expect(mode?.intValue == 0o600)
        await n.stop()
    }

    @Test func webOriginsAreAnsweredOnlyWhenListed() async throws {
        let n = try await Self.startNode()
        let port = n.ready.couchPort
        let refused = try await Self.http(port, "GET", "/_all_dbs", headers: ["Origin": "https://evil.example", "Authorization": "Bearer \(n.node.adminKey.value)"])
        #expect(refused.status == 403 && refused.header("Access-Control-Allow-Origin") == nil)
        let preflight = try await Self.http(
            port, "OPTIONS", "/ferry/doc",
            headers: ["Origin": "https://app.example", "Access-Control-Request-Method": "PUT", "Access-Control-Request-Headers": "content-type"])
        #expect(preflight.status == 204)
        #expect(preflight.header("Access-Control-Allow-Origin") == "https://app.example")
        #expect(preflight.header("Access-Control-Allow-Credentials") == "true")
        let allowed = try await Self.http(port, "GET", "/_all_dbs", headers: ["Origin": "https://app.example", "Authorization": Self.basic("reader", "r-pass")])
        #expect(allowed.status == 200 && allowed.header("Access-Control-Allow-Origin") == "https://app.example")
        await n.stop()
    }

    @Test func aForeignHostIsRefusedOnTheLoopbackListener() async throws {
        let n = try await Self.startNode()
        let port = n.ready.couchPort
        let key = ["Authorization": "Bearer \(n.node.adminKey.value)"]
        #expect(try await Self.http(port, "GET", "/_all_dbs", headers: key.merging(["Host": "evil.example"]) { $1 }).status == 421)
        #expect(try await Self.http(port, "GET", "/", headers: ["Host": "evil.example:\(port)"]).status == 421)
        #expect(try await Self.http(port, "GET", "http://evil.example/_all_dbs", headers: key).status == 421)
        #expect(try await Self.http(port, "GET", "/_all_dbs", headers: key.merging(["Host": "localhost:\(port)"]) { $1 }).status == 200)
        await n.stop()
    }

    @Test func aTakenCouchPortEndsRunWithAStartFailureNamingTheFlag() async throws {
        let holder = try await Self.startNode()
        let port = holder.ready.couchPort
        var c = NodeConfiguration()
        c.port = 0
        c.adminPort = 0
        c.interface = "127.0.0.1"
        c.discovery = false
        c.couch.port = port
        let dir = NSTemporaryDirectory() + "ferry-couch-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let node = try FerryNode(configuration: c, dataDirectory: dir)
        await #expect(throws: NodeError.startFailed("CouchDB API port \(port) is in use (another ferry serve? pass --ports auto for free ports, or --couch-port 0)")) {
            try await node.run(handlesSignals: false)
        }
        #expect(!FileManager.default.fileExists(atPath: dir + "/node.json"))
        await holder.stop()
    }

    /// Runs a program and returns its exit status and output.
    static func run(_ path: String, _ arguments: [String], input: String = "") async throws -> (Int32, String) {
        try await offCooperativeThreads { try blockingRun(path, arguments, input: input) }
    }

    static func blockingRun(_ path: String, _ arguments: [String], input: String) throws -> (Int32, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = arguments
        let out = Pipe()
        let inp = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        p.standardInput = inp
        try p.run()
        inp.fileHandleForWriting.write(Data(input.utf8))
        try inp.fileHandleForWriting.close()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl") && FileManager.default.isExecutableFile(atPath: "/usr/bin/curl")))
    func theLANListenerServesTLSWithTheNodeCertificateAndOnlyToUsers() async throws {
        let n = try await Self.startNode {
            var lan = NodeConfiguration.Couch.LAN()
            lan.interface = "127.0.0.1"
            lan.port = 0
            $0.couch.lan = lan
        }
        let url = try #require(n.ready.couchLANURL)
        #expect(url.hasPrefix("https://127.0.0.1:"))
        let port = url.split(separator: ":").last.map { String($0.prefix { $0.isNumber }) } ?? ""
        // The certificate presented is the node's: its SHA-256 fingerprint is the node ID.
        let (_, pem) = try await Self.run("/usr/bin/openssl", ["s_client", "-connect", "127.0.0.1:\(port)", "-servername", "node"], input: "")
        let (_, fingerprint) = try await Self.run("/usr/bin/openssl", ["x509", "-noout", "-fingerprint", "-sha256"], input: pem)
        let hex = fingerprint.split(separator: "=").last.map { $0.replacingOccurrences(of: ":", with: "").trimmingCharacters(in: .whitespacesAndNewlines).lowercased() }
        #expect(hex == n.node.identity.nodeID)
        func curl(_ path: String, _ extra: [String] = []) async throws -> String {
            try await Self.run("/usr/bin/curl", ["-sk", "-o", "/dev/null", "-w", "%{http_code}"] + extra + [String(url.dropLast()) + path]).1
        }
        #expect(try await curl("/") == "200")
        #expect(try await curl("/_all_dbs") == "401")
        #expect(try await curl("/_all_dbs", ["-H", "Authorization: Bearer \(n.node.adminKey.value)"]) == "401")
        #expect(try await curl("/_all_dbs", ["-u", "admin:\(n.node.adminKey.value)"]) == "401")
        #expect(try await curl("/_all_dbs", ["-u", "reader:r-pass"]) == "200")
        // No Host restriction on the LAN: apps reach it by whatever name the host has.
        #expect(try await curl("/_all_dbs", ["-u", "reader:r-pass", "-H", "Host: tablet-hub.local"]) == "200")
        // Plain HTTP is not spoken there.
        #expect(try await Self.run("/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/"]).1 != "200")
        await n.stop()
    }
}
