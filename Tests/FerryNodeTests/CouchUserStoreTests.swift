import FerryCore
import FerryCouch
import FerrySync
import Foundation
import Testing

@testable import FerryNode

/// Run-time CouchDB users: what persists, what the listeners' table sees at once, and what
/// stays read-only.
@Suite struct CouchUserStoreTests {
    func tempDir() -> String {
        let d = NSTemporaryDirectory() + "ferry-couch-users-\(UUID().uuidString)"
        try! FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }

    func user(_ name: String, _ password: String, policy: PeerPolicy = .trusted) throws -> CouchUser {
        CouchUser(name: name, password: try CouchPasswordHash(password: password, iterations: 10_000), policy: policy)
    }

    @Test func addedUsersAuthenticateAtOnceAndPersistInAnOwnerOnlyFile() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration())
        #expect(store.table.authenticate(name: "tablet", password: "pw", now: Date()) == nil)
        let readOnly = PeerPolicy(read: .all, write: .none, mayDelete: false)
        try store.add(try user("tablet", "pw", policy: readOnly))
        #expect(store.table.authenticate(name: "tablet", password: "pw", now: Date())?.policy == readOnly)
        let attributes = try FileManager.default.attributesOfItem(atPath: CouchUserStore.path(dataDirectory: dir))
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        let text = try String(contentsOfFile: CouchUserStore.path(dataDirectory: dir), encoding: .utf8)
        #expect(text.contains("pbkdf2-sha256$") && !text.contains("\"pw\""))

        let reopened = try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration())
        #expect(reopened.entries == [.init(name: "tablet", policy: readOnly, source: .api)])
        #expect(reopened.table.authenticate(name: "tablet", password: "pw", now: Date()) != nil)
    }

    @Test func aNewPasswordReplacesTheOldOneEvenWhereItWasRemembered() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration())
        try store.add(try user("tablet", "old"))
        let now = Date()
        #expect(store.table.authenticate(name: "tablet", password: "old", now: now) != nil)
        #expect(store.table.remembered(name: "tablet", password: "old", now: now) != nil)
        let entry = try store.update("tablet", .init(password: try CouchPasswordHash(password: "new", iterations: 10_000)))
        #expect(entry?.policy == .trusted, "a password change keeps the policy")
        #expect(store.table.remembered(name: "tablet", password: "old", now: now) == nil)
        #expect(store.table.authenticate(name: "tablet", password: "old", now: now) == nil)
        #expect(store.table.authenticate(name: "tablet", password: "new", now: now) != nil)
    }

    @Test func aPolicyChangeChangesOnlyWhatItNames() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration())
        try store.add(try user("tablet", "pw", policy: PeerPolicy(read: AccessRule(idPatterns: ["note-*"]), write: .all, mayDelete: true)))
        let change = try CouchUserStore.parseChange(["policy": ["mayDelete": false]], source: "test")
        let entry = try #require(try store.update("tablet", change))
        #expect(entry.policy == PeerPolicy(read: AccessRule(idPatterns: ["note-*"]), write: .all, mayDelete: false))
        #expect(store.table.user(named: "tablet")?.policy.mayDelete == false)
        #expect(store.table.authenticate(name: "tablet", password: "pw", now: Date()) != nil, "the password is kept")
    }

    @Test func removedUsersAreRefusedAtOnce() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration())
        try store.add(try user("tablet", "pw"))
        #expect(store.table.authenticate(name: "tablet", password: "pw", now: Date()) != nil)
        #expect(try store.remove("tablet"))
        #expect(store.table.user(named: "tablet") == nil)
        #expect(store.table.authenticate(name: "tablet", password: "pw", now: Date()) == nil)
        #expect(try !store.remove("tablet"))
        #expect(try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration()).entries.isEmpty)
    }

    @Test func configUsersAreReadOnlyAndWinOverRunTimeOnes() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var configuration = NodeConfiguration()
        configuration.couch.users = [try user("desk", "config-pw")]
        let store = try CouchUserStore(dataDirectory: dir, configuration: configuration)
        #expect(store.entries.map(\.source) == [.config])
        #expect(store.table.authenticate(name: "desk", password: "config-pw", now: Date()) != nil)
        #expect(throws: NodeError.self) { try store.add(try user("desk", "other")) }
        #expect(throws: NodeError.self) { try store.remove("desk") }
        #expect(throws: NodeError.self) { try store.update("desk", .init(mayDelete: false)) }
    }

    @Test func addingANameInUseIsAConflictAndKeepsTheFirstPassword() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration())
        try store.add(try user("tablet", "first"))
        #expect(throws: NodeError.conflict("user tablet exists; change it with `ferry couch-user set` (PUT /couch/users/{name})")) {
            try store.add(try user("tablet", "second"))
        }
        #expect(store.table.authenticate(name: "tablet", password: "first", now: Date()) != nil)
    }

    @Test func userBodiesAreParsedStrictly() throws {
        #expect(throws: ConfigError.self) { try CouchUserStore.parseUser(["name": "a"], source: "t") }
        #expect(throws: ConfigError.self) { try CouchUserStore.parseUser(["name": "a", "password": ""], source: "t") }
        #expect(throws: ConfigError.self) { try CouchUserStore.parseUser(["name": "a", "password": "x", "passwordHash": "y"], source: "t") }
        #expect(throws: ConfigError.self) { try CouchUserStore.parseUser(["name": "a", "passwordHash": "plain"], source: "t") }
        #expect(throws: ConfigError.self) { try CouchUserStore.parseUser(["name": "admin", "password": "x"], source: "t") }
        #expect(throws: ConfigError.self) { try CouchUserStore.parseUser(["name": "a", "password": "x", "role": "y"], source: "t") }
        let hash = try CouchPasswordHash(password: "pw", iterations: 10_000)
        let parsed = try CouchUserStore.parseUser(["name": "a", "passwordHash": .string(hash.description), "policy": ["write": "none"]], source: "t")
        #expect(parsed.password == hash && parsed.policy.write == .none)
    }

    @Test func aCorruptUsersFileIsRefusedWithItsName() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try #"{"users":[{"name":"a","password":"nope"}]}"#.write(toFile: CouchUserStore.path(dataDirectory: dir), atomically: true, encoding: .utf8)
        do {
            _ = try CouchUserStore(dataDirectory: dir, configuration: NodeConfiguration())
            Issue.record("a corrupt users file was accepted")
        } catch {
            #expect(error.description.contains("couch-users.json"))
        }
    }
}
