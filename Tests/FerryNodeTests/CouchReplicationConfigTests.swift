import FerryCore
import FerryCouch
import FerryCouchClient
import FerryStore
import FerrySync
import Foundation
import Testing

@testable import FerryNode

/// Replications with a CouchDB URL in the config file: what they set and what they refuse.
@Suite struct CouchReplicationConfigTests {
    static let pin = String(repeating: "ab", count: 32)

    func parse(_ entry: JSON) throws(ConfigError) -> ReplicationSpec {
        try NodeConfiguration.parse(["replications": [entry]], file: "test.json").replications[0]
    }

    @Test func everyCouchKeyIsReadAndTheStoredFormReadsBackTheSame() throws {
        let spec = try parse([
            "id": "hub", "url": "https://couch.example:6984/wards", "direction": "push", "continuous": false,
            "documentIDs": ["a", "b"], "credentialsFile": "/etc/ferry/hub.cred", "pin": .string(Self.pin.uppercased()),
            "createTarget": true, "selector": ["type": "note"], "policy": ["write": ["prefixes": ["notes/"]], "mayDelete": false],
        ])
        #expect(spec.isCouch && spec.peerID == nil && spec.id == "hub")
        #expect(spec.direction == .push && !spec.continuous && spec.documentIDs == ["a", "b"])
        let couch = try #require(spec.couch)
        #expect(couch.credentialsFile == "/etc/ferry/hub.cred" && couch.credentialsEnv == nil)
        #expect(couch.pin == Self.pin && couch.createTarget && couch.selector == ["type": "note"])
        #expect(couch.policy == PeerPolicy(read: .all, write: AccessRule(idPrefixes: ["notes/"]), mayDelete: false))
        #expect(try parse(spec.json) == spec)
    }

    @Test func aCouchReplicationDefaultsToContinuousPushAndPullWithNothingElse() throws {
        let spec = try parse(["url": "http://127.0.0.1:5984/db"])
        #expect(spec.id == "config-0" && spec.continuous && spec.direction == .pushAndPull)
        #expect(spec.couch == CouchReplicationOptions())
        #expect(spec.json == ["id": "config-0", "url": "http://127.0.0.1:5984/db", "direction": "pushAndPull", "continuous": true])
    }

    @Test func badCouchReplicationEntriesAreRefusedNamingTheKey() {
        let url: JSON = "http://127.0.0.1:5984/db"
        let cases: [(JSON, String, String)] = [
            (["url": url, "peer": .string(String(repeating: "a", count: 64))], "replications[0].peer", "no peer node ID"),
            (["url": url, "credentialsFile": "/f", "credentialsEnv": "E"], "replications[0].credentialsEnv", "not both"),
            (["url": "http://u:p@127.0.0.1:5984/db", "credentialsFile": "/f"], "replications[0].credentialsFile", "already holds credentials"),
            (["url": "http://u:p@127.0.0.1:5984/db", "credentialsEnv": "E"], "replications[0].credentialsEnv", "already holds credentials"),
            (["url": url, "credentialsEnv": "A=B"], "replications[0].credentialsEnv", "variable name"),
            (["url": url, "pin": .string(Self.pin)], "replications[0].pin", "https"),
            (["url": "https://h:6984/db", "pin": "abc"], "replications[0].pin", "64 hex"),
            (["url": url, "selector": ["$nope": 1]], "replications[0].selector", "Mango selector"),
            (["url": url, "selector": "type == note"], "replications[0].selector", "object"),
            (["url": url, "createTarget": true, "direction": "pull"], "replications[0].createTarget", "push"),
            (["url": url, "createTarget": "yes"], "replications[0].createTarget", "true or false"),
            (["url": url, "policy": ["write": "some"]], "replications[0].policy.write", "all"),
            (["url": "http://127.0.0.1:5984/"], "replications[0].url", "names no database"),
            (["url": "http://127.0.0.1:5984/db?x=1"], "replications[0].url", "no query"),
            (["url": url, "user": "x"], "replications[0].user", "unknown key"),
            (["url": "wss://127.0.0.1:1/ferry/sync", "peer": .string(String(repeating: "a", count: 64)), "selector": [:]],
             "replications[0].selector", "only a CouchDB replication"),
            (["url": "ftp://h/db"], "replications[0].url", "wss://"),
        ]
        for (entry, key, reason) in cases {
            #expect {
                _ = try parse(entry)
            } throws: { error in
                guard let e = error as? ConfigError else { return false }
                return e.key == key && e.reason.contains(reason)
            }
        }
    }

    @Test func theListedFormNeverHoldsTheURLsPassword() throws {
        let spec = try parse(["url": "http://alice:s3cret-pw@127.0.0.1:5984/db"])
        #expect(spec.json.canonicalString.contains("s3cret-pw"))  // the stored form keeps it (an owner-only file)
        #expect(!spec.publicJSON.canonicalString.contains("s3cret-pw"))
        #expect(spec.displayURL.contains("alice") && !spec.displayURL.contains("s3cret-pw"))
    }

    @Test func credentialsComeFromTheFileOrTheEnvironmentWhenTheEndpointIsMade() throws {
        let file = NSTemporaryDirectory() + "ferry-cred-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: file) }
        try Data("hub:from-file\n".utf8).write(to: URL(fileURLWithPath: file))
        var options = CouchReplicationOptions()
        options.credentialsFile = file
        options.pin = Self.pin
        options.createTarget = true
        let endpoint = try options.endpoint(url: "https://h:6984/db")
        #expect(endpoint.credentials == CouchCredentials(user: "hub", password: "from-file"))
        #expect(endpoint.trust == .pinned(Self.pin) && endpoint.createTarget)
        options.credentialsFile = file + ".missing"
        #expect { try options.endpoint(url: "https://h:6984/db") } throws: { error in
            (error as? CouchClientError).map { !$0.isTransient && $0.message.contains("credentials file") } ?? false
        }
        options.credentialsFile = nil
        options.credentialsEnv = "FERRY_TEST_NEVER_SET_\(UUID().uuidString.prefix(8))"
        #expect(throws: CouchClientError.self) { try options.endpoint(url: "https://h:6984/db") }
    }
}

/// A Mango selector as a replication filter.
@Suite struct CouchReplicationSelectorFilterTests {
    func input(_ id: String, _ body: JSON, deleted: Bool = false) throws -> FilterInput {
        FilterInput(id: try DocumentID(id), revision: try RevisionID("1-" + String(repeating: "a", count: 32)), deleted: deleted, body: body)
    }

    @Test func onlyMatchingRevisionsPassAndTheDocumentIsSeenAsCouchDBSeesIt() throws {
        let filter = try SelectorFilter.filter(["type": "note", "_id": ["$regex": "^n"]])
        #expect(filter.admits(try input("n1", ["type": "note"])))
        #expect(!filter.admits(try input("n2", ["type": "task"])))
        #expect(!filter.admits(try input("x1", ["type": "note"])))
        let deleted = try SelectorFilter.filter(["_deleted": true])
        let tombstone = try input("d", [:], deleted: true), live = try input("d", [:])
        #expect(deleted.admits(tombstone) && !deleted.admits(live))
        let withAttachment: JSON = ["@attachments": ["photo": ["@type": "blob", "contentType": "text/plain", "length": 3]]]
        let attached = try SelectorFilter.filter(["_attachments.photo.content_type": "text/plain"])
        let withFile = try input("f", withAttachment), without = try input("f", [:])
        #expect(attached.admits(withFile) && !attached.admits(without))
    }

    @Test func theFiltersNameChangesWithTheSelectorSoTheCheckpointDoes() throws {
        let a = try SelectorFilter.filter(["type": "note"])
        #expect(try SelectorFilter.filter(["type": "note"]).name == a.name)
        #expect(try SelectorFilter.filter(["type": "task"]).name != a.name)
    }

    @Test func aBadSelectorIsRefusedWithCouchDBsReason() {
        #expect(throws: MangoErrorMatch.self) {
            do { _ = try SelectorFilter.filter(["$gt": 1]) } catch { throw MangoErrorMatch() }
        }
    }

    struct MangoErrorMatch: Error {}

    @Test func theReplicatorConfigurationCarriesPolicySelectorAndTheNodesPullFilter() throws {
        let dir = NSTemporaryDirectory() + "ferry-couch-factory-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try DocumentStore.open(directory: dir)
        var c = NodeConfiguration()
        var rule = DocumentRule()
        rule.types = ["note"]
        c.pullFilter = rule
        let factory = ReplicationFactory(
            store: store, nodeID: "n", trust: try TrustStore(dataDirectory: dir, configuration: c), configuration: c,
            logger: .init(label: "test"))
        let selector: JSON = ["tag": "x"]
        let policy = PeerPolicy(read: AccessRule(idPrefixes: ["p/"]), write: .all, mayDelete: false)
        let rc = factory.couchConfiguration(policy: policy, selector: selector, selectorFilter: try SelectorFilter.filter(selector)) {
            $0.direction = .pull
        }
        #expect(rc.remotePolicy == policy && rc.remoteSelector == selector && rc.direction == .pull)
        #expect(rc.wiring.mesh == nil && rc.wiring.catchUpGate == nil && rc.maxAttemptWait == ReplicationFactory.maxCouchRetryWait)
        let pull = try #require(rc.pullFilter)
        #expect(pull.admits(try input("a", ["type": "note", "tag": "x"])))
        #expect(!pull.admits(try input("a", ["type": "task", "tag": "x"])))  // the node's pull filter
        #expect(!pull.admits(try input("a", ["type": "note", "tag": "y"])))  // the selector
        #expect(rc.pushFilter?.admits(try input("a", ["tag": "x"])) == true)
        #expect(rc.pushFilter?.admits(try input("a", ["tag": "y"])) == false)
        let open = factory.couchConfiguration(policy: nil, selector: nil, selectorFilter: nil) { _ in }
        #expect(open.remotePolicy == .trusted && open.pushFilter == nil && open.remoteSelector == nil)
    }
}
