import FerryCore
import FerrySync
import Foundation
import Testing

@testable import FerryNode

let idA = String(repeating: "a", count: 64)
let idB = String(repeating: "b", count: 64)

func parse(_ text: String) throws(ConfigError) -> NodeConfiguration {
    try NodeConfiguration.parse(try! JSON.parse(text), file: "test.json")
}

func configError(_ text: String) -> ConfigError? {
    do {
        _ = try parse(text)
        return nil
    } catch { return error }
}

@Suite(.timeLimit(.minutes(10))) struct NodeConfigurationTests {
    @Test func emptyConfigGivesTheDocumentedDefaults() throws {
        let c = try parse("{}")
        #expect(c.port == 4985)
        #expect(c.adminPort == 4986)
        #expect(c.adminInterface == "127.0.0.1")
        #expect(c.group == "ferry")
        #expect(c.discovery)
        #expect(c.trustMode == .pinned)
        #expect(c.peers.isEmpty && c.trust.isEmpty)
    }

    @Test func fullConfigIsRead() throws {
        let c = try parse("""
            {"name":"clinic-1","group":"wards","listen":{"interface":"10.0.0.5","port":5000},"admin":{"port":0},
             "discovery":{"enabled":false,"trust":"tofu"},
             "peers":[{"url":"wss://10.0.0.6:5000/wards/sync","id":"\(idA)","name":"ward-b"}],
             "trust":[{"id":"\(idB)","name":"tablet","policy":{"read":{"ids":["public/*"]},"write":{"types":["note"]},"mayDelete":false}}],
             "conflicts":{"default":"lastWriteWins","types":{"note":"merge"}},
             "pullFilter":{"ids":["*"],"maxBytes":4096,"required":{"type":"string"}},
             "validation":{"types":["note","order"]},
             "logLevel":"debug","limits":{"maxConnections":8,"idleTimeoutSeconds":30},"readOnly":true,
             "replications":[{"id":"backup","url":"wss://10.0.0.9:4985/wards/sync","peer":"\(idA)","direction":"push","continuous":false}]}
            """)
        #expect(c.name == "clinic-1" && c.group == "wards" && c.interface == "10.0.0.5" && c.port == 5000 && c.adminPort == 0)
        #expect(!c.discovery && c.trustMode == .tofu)
        #expect(c.peers == [.init(url: "wss://10.0.0.6:5000/wards/sync", nodeID: idA, name: "ward-b")])
        #expect(c.trust[0].policy.read.idPatterns == ["public/*"])
        #expect(c.trust[0].policy.write.types == ["note"])
        #expect(!c.trust[0].policy.mayDelete)
        #expect(c.resolvers.fallback.name == "lastWriteWins")
        #expect(c.resolvers.byType["note"]?.name == "merge")
        #expect(c.pullFilter?.maxBytes == 4096)
        #expect(c.validation?.types == ["note", "order"])
        #expect(c.logLevel == .debug && c.limits.maxConnections == 8 && c.limits.idleTimeoutSeconds == 30 && c.readOnly)
        #expect(c.replications.first?.direction == .push && c.replications.first?.continuous == false)
    }

    @Test func badConfigNamesTheKeyAndTheReason() {
        #expect(configError(#"{"listen":{"port":70000}}"#)?.key == "listen.port")
        #expect(configError(#"{"lisen":{}}"#)?.key == "lisen")
        #expect(configError(#"{"lisen":{}}"#)?.reason.contains("unknown key") == true)
        #expect(configError(#"{"peers":[{"url":"wss://h:1/ferry/sync","id":"nothex"}]}"#)?.key == "peers[0].id")
        #expect(configError(#"{"peers":[{"url":"http://h/","id":"\#(idA)"}]}"#)?.key == "peers[0].url")
        #expect(configError(#"{"admin":{"interface":"0.0.0.0"}}"#)?.reason.contains("loopback") == true)
        #expect(configError(#"{"conflicts":{"types":{"note":"coinflip"}}}"#)?.key == "conflicts.types.note")
        #expect(configError(#"{"pullFilter":{"required":{"qty":"integer"}}}"#)?.key == "pullFilter.required.qty")
        #expect(configError(#"{"logLevel":"loud"}"#)?.key == "logLevel")
        #expect(configError(#"{"discovery":{"trust":"everyone"}}"#)?.key == "discovery.trust")
        #expect(configError(#"{"group":"a/b"}"#)?.key == "group")
        let e = configError(#"{"limits":{"maxConnections":0}}"#)
        #expect(e?.description == "test.json: limits.maxConnections: must be an integer in 1...100000")
    }

    @Test func unreadableOrInvalidJSONFileIsRefusedWithItsName() throws {
        #expect(throws: ConfigError.self) { try NodeConfiguration.load(file: "/nonexistent/ferry.json") }
        let path = NSTemporaryDirectory() + "ferry-bad-\(UUID().uuidString).json"
        try "{\"name\": ".write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        do {
            _ = try NodeConfiguration.load(file: path)
            Issue.record("accepted broken JSON")
        } catch {
            #expect(error.file == path)
            #expect(error.reason.contains("not valid JSON"))
        }
    }

    @Test func emptyAccessRuleObjectMeansNothingNotEverything() throws {
        let c = try parse(#"{"trust":[{"id":"\#(idA)","policy":{"write":{}}}]}"#)
        #expect(c.trust[0].policy.write == .none)
    }
}

@Suite(.timeLimit(.minutes(10))) struct DocumentRuleTests {
    func check(_ rule: DocumentRule, _ id: String, _ body: String, deleted: Bool = false) -> String? {
        let json = try! JSON.parse(body)
        return rule.violation(id: try! DocumentID(id), deleted: deleted, body: json, size: json.canonicalBytes.count)
    }

    @Test func requiredFieldsAndTheirTypesAreChecked() {
        var rule = DocumentRule()
        rule.required = ["qty": "number", "name": "string"]
        #expect(check(rule, "a", #"{"qty":1,"name":"x"}"#) == nil)
        #expect(check(rule, "a", #"{"qty":"1","name":"x"}"#)?.contains("must be number") == true)
        #expect(check(rule, "a", #"{"qty":1}"#)?.contains("\"name\" is missing") == true)
    }

    @Test func idPatternsTypesAndSizeAreChecked() {
        var rule = DocumentRule()
        rule.idPatterns = ["orders/*"]
        rule.types = ["order"]
        rule.maxBytes = 40
        #expect(check(rule, "orders/1", #"{"type":"order"}"#) == nil)
        #expect(check(rule, "secrets/1", #"{"type":"order"}"#) != nil)
        #expect(check(rule, "orders/1", #"{"type":"note"}"#) != nil)
        #expect(check(rule, "orders/1", #"{"type":"order","pad":"0123456789012345678901234567890"}"#)?.contains("bytes") == true)
    }

    @Test func tombstonesOnlyFaceTheIDRule() {
        var rule = DocumentRule()
        rule.idPatterns = ["orders/*"]
        rule.required = ["qty": "number"]
        #expect(check(rule, "orders/1", "{}", deleted: true) == nil)
        #expect(check(rule, "other", "{}", deleted: true) != nil)
    }

    @Test func filterNameChangesWithTheRule() {
        var a = DocumentRule()
        a.types = ["x"]
        var b = a
        b.types = ["y"]
        #expect(a.filter(name: "f").name != b.filter(name: "f").name)
        #expect(a.filter(name: "f").name == a.filter(name: "f").name)
    }
}

@Suite(.timeLimit(.minutes(10))) struct TrustStoreTests {
    func tempDir() -> String {
        let d = NSTemporaryDirectory() + "ferry-trust-\(UUID().uuidString)"
        try! FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }

    @Test func addedEntriesPersistAndFeedTheListenerSet() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try TrustStore(dataDirectory: dir, configuration: NodeConfiguration())
        #expect(!store.ids.contains(idA))
        var policy = PeerPolicy()
        policy.write = AccessRule(idPatterns: ["notes/*"])
        try store.add(.init(nodeID: idA, name: "tablet", policy: policy, source: .api))
        #expect(store.ids.contains(idA))
        let reopened = try TrustStore(dataDirectory: dir, configuration: NodeConfiguration())
        #expect(reopened.entry(idA)?.policy == policy)
        #expect(reopened.entry(idA)?.name == "tablet")
        #expect(try reopened.remove(idA))
        #expect(!reopened.ids.contains(idA))
        #expect(try TrustStore(dataDirectory: dir, configuration: NodeConfiguration()).entries.isEmpty)
    }

    @Test func configEntriesCannotBeRemovedAtRunTime() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = NodeConfiguration()
        c.trust = [.init(nodeID: idB)]
        c.peers = [.init(url: "wss://h:1/ferry/sync", nodeID: idA)]
        let store = try TrustStore(dataDirectory: dir, configuration: c)
        #expect(store.ids.contains(idA) && store.ids.contains(idB))
        #expect(throws: NodeError.self) { try store.remove(idB) }
        #expect(throws: NodeError.self) { try store.add(.init(nodeID: idA, name: nil, policy: .trusted, source: .api)) }
    }

    @Test func corruptTrustFileIsRefusedWithItsName() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try #"{"peers":[{"id":"short"}]}"#.write(toFile: dir + "/trust.json", atomically: true, encoding: .utf8)
        #expect(throws: ConfigError.self) { try TrustStore(dataDirectory: dir, configuration: NodeConfiguration()) }
    }
}
