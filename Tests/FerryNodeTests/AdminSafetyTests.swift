import FerryCore
import FerrySync
import Foundation
import Testing

@testable import FerryNode

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The admin API's guard, its changes feed's bounds, and the trust and replication stores'
/// refusal to replace an entry by omission.
@Suite struct AdminGuardTests {
    @Test func onlyLoopbackHostsAreAccepted() {
        for host in ["127.0.0.1:4986", "127.0.0.1", "localhost:4986", "LOCALHOST", "localhost.", "127.1.2.3:80", "[::1]:4986", "[::1]", "127.0.0.1:65535"] {
            #expect(AdminRequestRules.isLoopbackAuthority(host), "\(host)")
        }
        for host in [
            "evil.example", "evil.example:4986", "127.0.0.1.evil.example", "localhost.evil.example:1", "10.0.0.1:4986", "[::2]:1", "", "[::1",
            "[::1]evil", "[::1]:", "[::1]:x", "127.0.0.1:evil", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:", "127.0.0.1:+80",
            "127.0.0.1:80:80", "localhost:٤٩٨٦", "user@127.0.0.1",
        ] {
            #expect(!AdminRequestRules.isLoopbackAuthority(host), "\(host)")
        }
    }

    @Test func anAbsoluteOrAuthorityFormTargetNamesItsAuthority() {
        #expect(AdminRequestRules.targetAuthority("/docs/a") == nil)
        #expect(AdminRequestRules.targetAuthority("*") == nil)
        #expect(AdminRequestRules.targetAuthority("http://evil.example/") == "evil.example")
        #expect(AdminRequestRules.targetAuthority("http://127.0.0.1:4986?x=1") == "127.0.0.1:4986")
        #expect(AdminRequestRules.targetAuthority("HTTP://[::1]:4986/metrics") == "[::1]:4986")
        #expect(AdminRequestRules.targetAuthority("evil.example:80") == "evil.example:80")
        #expect(AdminRequestRules.targetAuthority("http:///") == "")
    }

    @Test func namesWithControlOrFormCharactersAreRefused() throws {
        for name in ["tablet", "Ana's Mac", "café-1", "東京", "a b"] { try NodeName.validate(name) }
        for name in ["tr\nFAKE2", "evil\u{1B}[31m", "a\u{7F}", "a\u{85}", "a\u{202E}b", "zw\u{200B}j", "a\u{2028}b", "tab\t"] {
            #expect(throws: NodeNameError.self, "\(name.debugDescription)") { try NodeName.validate(name) }
        }
        #expect(throws: ConfigError.self) { try NodeConfiguration.parse(["name": "evil\n"], file: "test.json") }
        let id = String(repeating: "a", count: 64)
        #expect(throws: ConfigError.self) {
            try NodeConfiguration.parse(["trust": [["id": .string(id), "name": "tr\nFAKE2"]]], file: "test.json")
        }
        #expect(throws: ConfigError.self) {
            try NodeConfiguration.parse(["peers": [["url": "wss://127.0.0.1:1/ferry/sync", "id": .string(id), "name": "a\u{202E}"]]], file: "test.json")
        }
        #expect(throws: ConfigError.self) { try TrustStore.Change(parsing: ["name": "x\r"], id: id, source: "test") }
        #expect(try NodeConfiguration.parse(["name": "kitchen"], file: "test.json").name == "kitchen")
    }

    @Test func anAccessRuleIsWrittenMinimallyAndReadBackAsItWas() throws {
        let rules = [
            AccessRule.all, .none, AccessRule(idPatterns: ["notes/*"]), AccessRule(idPrefixes: ["p/"], types: ["note"]),
            AccessRule(idPrefixes: ["p/"], idPatterns: ["a*"], types: ["t"]),
        ]
        #expect(AccessRule(idPatterns: ["notes/*"]).json == ["ids": ["notes/*"]])
        #expect(PeerPolicy(read: .all, write: AccessRule(idPatterns: ["notes/*"]), mayDelete: false).json.canonicalString
            == #"{"mayDelete":false,"read":"all","write":{"ids":["notes/*"]}}"#)
        for rule in rules {
            let policy = PeerPolicy(read: rule, write: rule, mayDelete: true)
            let id = String(repeating: "a", count: 64)
            let entry = try NodeConfiguration.TrustEntry(parsing: ["id": .string(id), "policy": policy.json], source: "test")
            #expect(entry.policy == policy, "\(rule.json)")
        }
    }

    @Test func theBearerTokenIsReadCaseInsensitivelyAndNothingElseCounts() {
        #expect(AdminRequestRules.bearerToken("Bearer abc") == "abc")
        #expect(AdminRequestRules.bearerToken("bearer  abc") == "abc")
        #expect(AdminRequestRules.bearerToken("Basic abc") == nil)
        #expect(AdminRequestRules.bearerToken("Bearer ") == nil)
        #expect(AdminRequestRules.bearerToken(nil) == nil)
    }

    @Test func onlyApplicationJSONCountsAsJSON() {
        #expect(AdminRequestRules.isJSON("application/json"))
        #expect(AdminRequestRules.isJSON("Application/JSON; charset=utf-8"))
        #expect(!AdminRequestRules.isJSON("text/plain"))
        #expect(!AdminRequestRules.isJSON("application/x-www-form-urlencoded"))
        #expect(!AdminRequestRules.isJSON(nil))
    }

    @Test func theAdminKeyIsCreatedOwnerOnlyOnceAndMatchesOnlyItself() throws {
        let dir = NSTemporaryDirectory() + "ferry-key-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try AdminKey.loadOrCreate(dataDirectory: dir)
        let path = AdminKey.path(dataDirectory: dir)
        let mode = try #require(FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? NSNumber).uint16Value
        #expect(mode & 0o777 == 0o600)
        #expect(try AdminKey.loadOrCreate(dataDirectory: dir).value == key.value)
        #expect(key.value.count == 64)
        #expect(key.matches(key.value))
        #expect(!key.matches(String(key.value.dropLast()) + "x"))
        #expect(!key.matches(""))
        #expect(!"\(key)".contains(key.value))
        chmod(path, 0o644)
        #expect(throws: NodeError.self) { try AdminKey.loadOrCreate(dataDirectory: dir) }
    }

    @Test func theAdminConfigKeysAreReadAndDefaultToClosed() throws {
        #expect(NodeConfiguration().adminAllowedOrigins.isEmpty && !NodeConfiguration().adminPublicMetrics)
        let c = try NodeConfiguration.parse(
            ["admin": ["allowedOrigins": ["http://localhost:8080"], "publicMetrics": true]], file: "test.json")
        #expect(c.adminAllowedOrigins == ["http://localhost:8080"] && c.adminPublicMetrics)
        #expect(throws: ConfigError.self) { try NodeConfiguration.parse(["admin": ["allowedOrigins": ["*"]]], file: "test.json") }
        #expect(throws: ConfigError.self) {
            try NodeConfiguration.parse(["admin": ["allowedOrigins": ["http://localhost:8080/app"]]], file: "test.json")
        }
    }

    @Test func aShutdownSignalWakesEveryWaiterAndLaterOnesAtOnce() async {
        let signal = ShutdownSignal()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<3 { group.addTask { await signal.wait() } }
            signal.fire()
        }
        await signal.wait()
        #expect(signal.isFired)
    }

    @Test func aCancelledWaiterReturnsWithoutTheSignal() async {
        let signal = ShutdownSignal()
        let task = Task { await signal.wait() }
        task.cancel()
        await task.value
        #expect(!signal.isFired)
    }
}

@Suite struct AdminStoreTests {
    static func directory() throws -> String {
        let dir = NSTemporaryDirectory() + "ferry-admin-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    @Test func reAddingATrustedPeerIsRefusedAndKeepsItsPolicyAndName() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let trust = try TrustStore(dataDirectory: dir, configuration: NodeConfiguration())
        let id = String(repeating: "a", count: 64)
        let restricted = PeerPolicy(read: .none, write: AccessRule(idPatterns: ["notes/*"]), mayDelete: false)
        try trust.add(.init(nodeID: id, name: "tablet", policy: restricted, source: .api))
        #expect(throws: NodeError.self) { try trust.add(.init(nodeID: id, name: nil, policy: .trusted, source: .api)) }
        #expect(trust.entry(id)?.policy == restricted)
        #expect(trust.entry(id)?.name == "tablet")
        // Saved as it was, too.
        #expect(try TrustStore(dataDirectory: dir, configuration: NodeConfiguration()).entry(id)?.policy == restricted)
    }

    @Test func aTrustChangeAltersOnlyWhatItNames() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let trust = try TrustStore(dataDirectory: dir, configuration: NodeConfiguration())
        let id = String(repeating: "b", count: 64)
        let restricted = PeerPolicy(read: .none, write: AccessRule(idPatterns: ["notes/*"]), mayDelete: false)
        try trust.add(.init(nodeID: id, name: "tablet", policy: restricted, source: .api))
        let renamed = try #require(try trust.update(id, TrustStore.Change(parsing: ["name": "tablet-2"], id: id, source: "test")))
        #expect(renamed.policy == restricted && renamed.name == "tablet-2")
        let deletes = try #require(try trust.update(id, TrustStore.Change(parsing: ["policy": ["mayDelete": true]], id: id, source: "test")))
        #expect(deletes.policy.read == .none && deletes.policy.write == restricted.write && deletes.policy.mayDelete)
        #expect(try trust.update(String(repeating: "c", count: 64), .init(name: "x")) == nil)
        #expect(throws: ConfigError.self) { try TrustStore.Change(parsing: ["id": .string(String(repeating: "c", count: 64))], id: id, source: "test") }
        #expect(try TrustStore(dataDirectory: dir, configuration: NodeConfiguration()).entry(id) == deletes)
    }

    @Test func aReplicationWithAnExistingIDIsNotReplaced() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let registry = try ReplicationRegistry(dataDirectory: dir)
        let first = ReplicationSpec(id: "r", url: "wss://127.0.0.1:1/ferry/sync", peerID: String(repeating: "a", count: 64))
        var second = first
        second.url = "wss://10.0.0.66:1/ferry/sync"
        #expect(try registry.add(first))
        #expect(try registry.add(second) == false)
        #expect(registry.specs == [first])
    }

    @Test func everyDocumentedMetricIsExportedFromTheStartWithHelp() {
        let text = NodeMetrics().render(connectedPeers: 0, inboundConnections: 0, storeBytes: 0, documents: 0, lastSequence: 0)
        let lines = text.split(separator: "\n")
        for name in NodeMetrics.help.keys {
            #expect(lines.contains { $0.hasPrefix("# HELP \(name) ") }, "no HELP for \(name)")
            #expect(lines.contains { $0.hasPrefix("\(name) ") || $0.hasPrefix("\(name){") }, "no sample of \(name)")
        }
        #expect(lines.contains { $0.hasPrefix("ferry_documents_rejected_total{") && $0.contains(#"reason="policy""#) && $0.hasSuffix(" 0") })
    }
}

/// The admin API of a node run in-process.
@Suite(.serialized, .timeLimit(.minutes(5))) struct AdminChangesTests {
    @Test func lastSeqNeverPassesTheStoresLastSequence() async throws {
        let n = try await InProcessNode.start({ $0.discovery = false })
        _ = try n.node.store.put(try DocumentID("one"), body: [:])
        let last = Int64(try n.node.store.lastSequence)
        let far = try await n.get("/changes?since=99999999999")
        #expect(far["last_seq"]?.intValue == last)
        #expect(far["results"] == .array([]))
        let polled = try await n.get("/changes?since=99999999999&feed=longpoll&timeout=1")
        #expect(polled["last_seq"]?.intValue == last)
        // A client that saves last_seq sees the next change.
        _ = try n.node.store.put(try DocumentID("two"), body: [:])
        let next = try await n.get("/changes?since=\(far["last_seq"]?.intValue ?? -1)")
        #expect(next["results"].map { if case .array(let a) = $0 { a.count } else { -1 } } == 1)
        await n.stop()
    }

    @Test func aTrustedPeerIsChangedOnlyExplicitly() async throws {
        let n = try await InProcessNode.start({ $0.discovery = false })
        let id = String(repeating: "d", count: 64)
        let post = #"{"id":"\#(id)","name":"tablet","policy":{"write":{"ids":["notes/*"]}}}"#
        #expect(try await n.request("POST", "/trust", body: post).status == 201)
        let again = try await n.request("POST", "/trust", body: #"{"id":"\#(id)"}"#)
        #expect(again.status == 409)
        let entry = n.node.trust.entry(id)
        #expect(entry?.name == "tablet" && entry?.policy.write == AccessRule(idPatterns: ["notes/*"]))
        let put = try await n.request("PUT", "/trust/\(id)", body: #"{"policy":{"mayDelete":false}}"#)
        #expect(put.status == 200)
        #expect(n.node.trust.entry(id)?.policy == PeerPolicy(read: .all, write: AccessRule(idPatterns: ["notes/*"]), mayDelete: false))
        #expect(n.node.trust.entry(id)?.name == "tablet")
        #expect(try await n.request("PUT", "/trust/\(String(repeating: "e", count: 64))", body: #"{"name":"x"}"#).status == 404)
        let spec = #"{"id":"r1","url":"wss://127.0.0.1:1/ferry/sync","peer":"\#(id)","continuous":false}"#
        #expect(try await n.request("POST", "/replications", body: spec).status == 201)
        let other = #"{"id":"r1","url":"wss://10.0.0.66:1/ferry/sync","peer":"\#(id)","continuous":false}"#
        #expect(try await n.request("POST", "/replications", body: other).status == 409)
        #expect(n.node.replicationRegistry.specs.map(\.url) == ["wss://127.0.0.1:1/ferry/sync"])
        await n.stop()
    }

    /// Sends `request` as raw bytes to the node's admin port and returns the status line's code.
    static func rawStatus(_ port: Int, _ request: String) throws -> Int {
        let reply = try LoopbackSocket.exchange(port: port, request)
        let line = String(decoding: reply, as: UTF8.self).prefix { $0 != "\r" }
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
    }

    @Test func anAbsoluteFormTargetsAuthorityIsCheckedAndMustMatchHost() async throws {
        let n = try await InProcessNode.start({ $0.discovery = false })
        let port = n.ready.adminPort
        let key = n.node.adminKey.value
        func status(_ target: String, host: String?) throws -> Int {
            let hostLine = host.map { "Host: \($0)\r\n" } ?? ""
            return try Self.rawStatus(port, "GET \(target) HTTP/1.1\r\n\(hostLine)Authorization: Bearer \(key)\r\nConnection: close\r\n\r\n")
        }
        #expect(try status("http://evil.example/", host: "127.0.0.1") == 421)
        #expect(try status("http://evil.example/metrics", host: "127.0.0.1") == 421)
        #expect(try status("http://user@127.0.0.1/", host: "127.0.0.1") == 421)
        #expect(try status("http://127.0.0.1:\(port)/", host: "localhost:\(port)") == 421)
        #expect(try status("http://127.0.0.1:\(port)/", host: "127.0.0.1:\(port)") == 200)
        #expect(try status("http://localhost/docs", host: "LOCALHOST") == 200)
        #expect(try status("/", host: "127.0.0.1") == 200)
        #expect(try status("/", host: "127.0.0.1:evil") == 421)
        await n.stop()
    }

    @Test func trustNamesWithControlCharactersAreABadRequest() async throws {
        let n = try await InProcessNode.start({ $0.discovery = false })
        let id = String(repeating: "9", count: 64)
        let post = try await n.request("POST", "/trust", body: #"{"id":"\#(id)","name":"tr\nFAKE2"}"#)
        #expect(post.status == 400 && post.json["error"] == "bad_request", "\(post.text)")
        #expect(!n.node.trust.isTrusted(id))
        #expect(try await n.request("POST", "/trust", body: #"{"id":"\#(id)","name":"tablet"}"#).status == 201)
        let put = try await n.request("PUT", "/trust/\(id)", body: #"{"name":"a\u202eb"}"#)
        #expect(put.status == 400 && put.json["error"] == "bad_request", "\(put.text)")
        #expect(n.node.trust.entry(id)?.name == "tablet")
        await n.stop()
    }

    @Test func requestsWithoutTheKeyOrFromAWebPageAreRefused() async throws {
        let n = try await InProcessNode.start({ $0.discovery = false })
        let id = String(repeating: "f", count: 64)
        var bare = URLRequest(url: URL(string: n.ready.adminURL + "/")!)
        bare.httpMethod = "GET"
        let (_, unauthenticated) = try await URLSession.shared.data(for: bare)
        #expect((unauthenticated as? HTTPURLResponse)?.statusCode == 401)
        let wrong = try await n.request("GET", "/", headers: ["Authorization": "Bearer " + String(repeating: "0", count: 64)])
        #expect(wrong.status == 401)
        let fromPage = try await n.request(
            "POST", "/trust", body: #"{"id":"\#(id)"}"#, headers: ["Origin": "http://evil.example", "Content-Type": "text/plain"])
        #expect(fromPage.status == 403)
        let plain = try await n.request("POST", "/trust", body: #"{"id":"\#(id)"}"#, headers: ["Content-Type": "text/plain"])
        #expect(plain.status == 415)
        #expect(!n.node.trust.isTrusted(id))
        #expect(try await n.request("GET", "/metrics", headers: ["Authorization": ""]).status == 401)
        await n.stop()
    }

    @Test func configuredOriginsAndPublicMetricsAreAdmitted() async throws {
        let n = try await InProcessNode.start({
            $0.discovery = false
            $0.adminAllowedOrigins = ["http://localhost:8080"]
            $0.adminPublicMetrics = true
        })
        #expect(try await n.request("GET", "/", headers: ["Origin": "http://localhost:8080"]).status == 200)
        #expect(try await n.request("GET", "/", headers: ["Origin": "http://localhost:8081"]).status == 403)
        var bare = URLRequest(url: URL(string: n.ready.adminURL + "/metrics")!)
        bare.httpMethod = "GET"
        let (_, metrics) = try await URLSession.shared.data(for: bare)
        #expect((metrics as? HTTPURLResponse)?.statusCode == 200)
        bare.url = URL(string: n.ready.adminURL + "/trust")!
        let (_, trust) = try await URLSession.shared.data(for: bare)
        #expect((trust as? HTTPURLResponse)?.statusCode == 401)
        await n.stop()
    }
}
