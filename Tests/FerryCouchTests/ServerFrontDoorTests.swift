import FerryCore
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import HummingbirdTesting
import IntegrationHarness
import NIOCore
import Testing

@testable import FerryCouch
@testable import FerryCouchDocuments

/// The CouchDB API's front door over Hummingbird's router test client: which requests get
/// in, as whom, and what the others are answered. A live feed's wait allows two minutes (see
/// `DatabaseChangesTests`: a parallel run's first burst held the pool 34 s once).
@Suite struct ServerFrontDoorTests {
    static let adminKey = String(repeating: "k", count: 64)

    /// A settable wall clock for cookies, and the throttle's clock moved with it.
    final class WallClock: Sendable {
        let date = Locked(Date(timeIntervalSince1970: 1_800_000_000))
        let throttleClock = ManualClock()
        func advance(_ seconds: TimeInterval) {
            date.withLock { $0.addTimeInterval(seconds) }
            throttleClock.advance(by: .milliseconds(Int64(seconds * 1000)))
        }
        var now: Date { date.withLock { $0 } }
    }

    /// The throttle the tests use: 5 failures per address, the default account backoff.
    static func throttle(_ clock: WallClock) -> LoginThrottle {
        var policy = LoginThrottle.Policy()
        policy.maxFailuresPerAddress = 5
        return LoginThrottle(policy: policy, clock: clock.throttleClock)
    }

    static func frontDoor(
        _ listener: CouchFrontDoor.Listener = .loopback, origins: [String] = [], clock: WallClock = WallClock(), store: DocumentStore? = nil,
        throttle: LoginThrottle? = nil, sessions: CouchSessionCookies = CouchSessionCookies(secret: Array(repeating: 1, count: 32)),
        users: CouchUserTable? = nil
    ) throws -> CouchFrontDoor {
        let database = CouchDatabase(name: "ferry", store: try store ?? DocumentStore.inMemory(), serverUUID: String(repeating: "a", count: 32))
        let users = try users ?? Self.users()
        let access = CouchAccess(
            users: users, sessions: sessions, cors: CouchCORSPolicy(origins: origins),
            adminKey: { $0 == Self.adminKey }, adminKeyFingerprint: "fp", throttle: throttle ?? Self.throttle(clock),
            now: { clock.now })
        return CouchFrontDoor(database: database, access: access, listener: listener)
    }

    /// `reader` (read-only) and `writer`, with fresh salts.
    static func users() throws -> CouchUserTable {
        CouchUserTable([
            CouchUser(name: "reader", password: try CouchPasswordHash(password: "r-pass", iterations: 10_000),
                policy: PeerPolicy(read: .all, write: .none, mayDelete: false)),
            CouchUser(name: "writer", password: try CouchPasswordHash(password: "w-pass", iterations: 10_000)),
        ])
    }

    static func basic(_ user: String, _ password: String) -> String {
        "Basic " + Data("\(user):\(password)".utf8).base64EncodedString()
    }

    func json(_ response: TestResponse) -> JSON { (try? JSON.parse(Array(response.body.readableBytesView))) ?? .null }

    /// Opens `writer`'s continuous `_changes` feed (after `query`) on a store holding `a`,
    /// runs `change` on the users once the feed waits for a commit, then writes `written`;
    /// returns the feed's JSON lines.
    func liveFeed(_ query: String, change: @escaping @Sendable (CouchUserTable) throws -> Void, then written: [String]) async throws -> [JSON] {
        let users = try Self.users()
        let store = try DocumentStore.inMemory()
        let door = try Self.frontDoor(store: store, users: users)
        _ = try store.put(DocumentID("a"), body: ["n": 1])
        let lines = Locked<[JSON]>([])
        try await Application(responder: door).test(.router) { client in
            async let answer = client.execute(
                uri: "/ferry/_changes?feed=continuous&since=0&heartbeat=600000" + query, method: .get,
                headers: [.authorization: Self.basic("writer", "w-pass")])
            try await waitUntil("the feed waits for a commit", timeout: 120, every: .milliseconds(5)) { store.commitWaiters > 0 }
            try change(users)
            for id in written { _ = try store.put(DocumentID(id), body: ["n": 2]) }
            let parsed = try await answer.body.readableBytesView.split(separator: UInt8(ascii: "\n")).compactMap { try? JSON.parse(Array($0)) }
            lines.withLock { $0 = parsed }
        }
        return lines.withLock { $0 }
    }

    /// A live `_changes` feed judges what comes after each wait by its user's policy of that
    /// moment: narrowed while the feed waits, the documents the user may no longer read are
    /// not listed.
    @Test func aLiveFeedFollowsItsUsersNarrowedPolicy() async throws {
        let lines = try await liveFeed("&limit=2", change: { users in
            var narrowed = try #require(users.user(named: "writer"))
            narrowed.policy = PeerPolicy(read: AccessRule(idPrefixes: ["x"]), write: .none, mayDelete: false)
            users.replace(with: [try #require(users.user(named: "reader")), narrowed])
        }, then: ["b", "x1"])
        #expect(lines.compactMap { $0["id"]?.stringValue } == ["a", "x1"], "\(lines)")
        #expect(lines.last?["pending"] == nil, "a restricted reader is not told how much it may not see")
    }

    /// A live `_changes` feed ends once its user is removed (as the user's cookie sessions
    /// do): a write after the removal is never sent to it.
    @Test(.timeLimit(.minutes(3))) func aLiveFeedEndsWhenItsUserIsRemoved() async throws {
        let lines = try await liveFeed("", change: { users in
            users.replace(with: [try #require(users.user(named: "reader"))])
        }, then: ["after-removal"])
        #expect(lines.compactMap { $0["id"]?.stringValue } == ["a"], "\(lines)")
        #expect(lines.last?["last_seq"] != nil)
    }

    @Test func theWelcomeAndUpAnswerWithoutCredentialsAndNothingElseDoes() async throws {
        let app = Application(responder: try Self.frontDoor())
        try await app.test(.router) { client in
            try await client.execute(uri: "/", method: .get) { #expect($0.status == .ok) }
            try await client.execute(uri: "/_up", method: .get) { #expect($0.status == .ok) }
            for path in ["/_all_dbs", "/ferry", "/ferry/doc", "/ferry/_changes", "/_uuids", "/_utils"] {
                try await client.execute(uri: path, method: .get) { response in
                    #expect(response.status == .unauthorized, "\(path)")
                    #expect(self.json(response)["error"] == "unauthorized", "\(path)")
                }
            }
            try await client.execute(uri: "/ferry/doc", method: .put, body: ByteBuffer(string: "{}")) { #expect($0.status == .unauthorized) }
        }
    }

    @Test func theAdminKeyWorksAsBearerAndAsBasicAdmin() async throws {
        let app = Application(responder: try Self.frontDoor())
        try await app.test(.router) { client in
            for auth in ["Bearer \(Self.adminKey)", Self.basic("admin", Self.adminKey)] {
                try await client.execute(uri: "/_all_dbs", method: .get, headers: [.authorization: auth]) { response in
                    #expect(response.status == .ok)
                    #expect(self.json(response) == ["ferry"])
                }
                try await client.execute(uri: "/_session", method: .get, headers: [.authorization: auth]) { response in
                    #expect(self.json(response)["userCtx"] == ["name": "admin", "roles": ["_admin"]])
                }
            }
            for auth in ["Bearer wrong", Self.basic("admin", "wrong")] {
                try await client.execute(uri: "/_all_dbs", method: .get, headers: [.authorization: auth]) { #expect($0.status == .unauthorized) }
            }
        }
    }

    @Test func aUserLogsInWithBasicAndAWrongPasswordIsNameOrPasswordIsIncorrect() async throws {
        let app = Application(responder: try Self.frontDoor())
        try await app.test(.router) { client in
            try await client.execute(uri: "/_session", method: .get, headers: [.authorization: Self.basic("reader", "r-pass")]) { response in
                #expect(self.json(response)["userCtx"] == ["name": "reader", "roles": []])
                #expect(self.json(response)["info"]?["authenticated"] == "default")
            }
            try await client.execute(uri: "/_all_dbs", method: .get, headers: [.authorization: Self.basic("reader", "nope")]) { response in
                #expect(response.status == .unauthorized)
                #expect(self.json(response) == ["error": "unauthorized", "reason": "Name or password is incorrect."])
            }
            try await client.execute(uri: "/_session", method: .get) { response in
                #expect(self.json(response)["userCtx"] == ["name": .null, "roles": []])
            }
        }
    }

    @Test func aSessionLoginSetsACookieThatAuthenticatesUntilLogout() async throws {
        let clock = WallClock()
        let app = Application(responder: try Self.frontDoor(clock: clock))
        try await app.test(.router) { client in
            let cookie = try await client.execute(
                uri: "/_session", method: .post, headers: [.contentType: "application/x-www-form-urlencoded"],
                body: ByteBuffer(string: "name=writer&password=w-pass")
            ) { response -> String in
                #expect(response.status == .ok)
                #expect(self.json(response) == ["ok": true, "name": "writer", "roles": []])
                let set = response.headers[.setCookie] ?? ""
                #expect(set.hasPrefix("AuthSession=") && set.contains("HttpOnly"))
                return String(set.prefix { $0 != ";" })
            }
            try await client.execute(uri: "/_all_dbs", method: .get, headers: [.cookie: cookie]) { #expect($0.status == .ok) }
            try await client.execute(uri: "/_session", method: .get, headers: [.cookie: cookie]) { response in
                #expect(self.json(response)["userCtx"]?["name"] == "writer")
                #expect(self.json(response)["info"]?["authenticated"] == "cookie")
            }
            // Past the first tenth of its life a cookie is renewed; past its end it no longer counts.
            clock.advance(120)
            try await client.execute(uri: "/_all_dbs", method: .get, headers: [.cookie: cookie]) { response in
                #expect(response.status == .ok)
                #expect(response.headers[.setCookie]?.hasPrefix("AuthSession=") == true)
            }
            clock.advance(600)
            try await client.execute(uri: "/_all_dbs", method: .get, headers: [.cookie: cookie]) { #expect($0.status == .unauthorized) }
            try await client.execute(uri: "/_session", method: .delete, headers: [.cookie: cookie]) { response in
                #expect(response.headers[.setCookie]?.contains("Max-Age=0") == true)
            }
            // A login body past 64 KiB is refused unread.
            try await client.execute(
                uri: "/_session", method: .post, headers: [.contentType: "application/json"],
                body: ByteBuffer(string: #"{"name":"reader","password":""# + String(repeating: "x", count: 70_000) + #""}"#)
            ) { #expect($0.status == .contentTooLarge) }
            // JSON logins work too; a wrong password gets no cookie.
            try await client.execute(
                uri: "/_session", method: .post, headers: [.contentType: "application/json"],
                body: ByteBuffer(string: #"{"name":"reader","password":"r-pass"}"#)
            ) { #expect($0.status == .ok && $0.headers[.setCookie] != nil) }
            try await client.execute(
                uri: "/_session", method: .post, headers: [.contentType: "application/json"],
                body: ByteBuffer(string: #"{"name":"reader","password":"bad"}"#)
            ) { response in
                #expect(response.status == .unauthorized && response.headers[.setCookie] == nil)
                #expect(self.json(response)["reason"] == "Name or password is incorrect.")
            }
        }
    }

    @Test func aJSONLoginTheParserRefusesIsABadRequestNamingTheReason() async throws {
        let app = Application(responder: try Self.frontDoor())
        try await app.test(.router) { client in
            try await client.execute(
                uri: "/_session", method: .post, headers: [.contentType: "application/json"],
                body: ByteBuffer(string: #"{"name":"reader","name":"writer","password":"r-pass"}"#)
            ) { response in
                #expect(response.status == .badRequest && response.headers[.setCookie] == nil)
                #expect(self.json(response)["error"] == "bad_request")
                #expect(self.json(response)["reason"]?.stringValue?.contains(#"duplicate key "name""#) == true, "\(self.json(response))")
            }
        }
    }

    @Test func theLANListenerRefusesTheAdminKeyAndAcceptsUsers() async throws {
        let app = Application(responder: try Self.frontDoor(.lan))
        try await app.test(.router) { client in
            for auth in ["Bearer \(Self.adminKey)", Self.basic("admin", Self.adminKey)] {
                try await client.execute(uri: "/_all_dbs", method: .get, headers: [.authorization: auth]) { #expect($0.status == .unauthorized) }
            }
            try await client.execute(
                uri: "/_session", method: .post, headers: [.contentType: "application/json"],
                body: ByteBuffer(string: #"{"name":"admin","password":"\#(Self.adminKey)"}"#)
            ) { #expect($0.status == .unauthorized) }
            try await client.execute(
                uri: "/_all_dbs", method: .get, headers: [.authorization: Self.basic("reader", "r-pass"), .init("Host")!: "tablet.example:6984"]
            ) { #expect($0.status == .ok) }
            try await client.execute(uri: "/_session", method: .post, headers: [.contentType: "application/json"],
                body: ByteBuffer(string: #"{"name":"reader","password":"r-pass"}"#)
            ) { #expect($0.headers[.setCookie]?.contains("Secure") == true) }
        }
    }

    @Test func aForeignHostIsMisdirectedOnLoopback() async throws {
        let app = Application(responder: try Self.frontDoor())
        try await app.test(.router) { client in
            try await client.execute(uri: "/", method: .get, headers: [.init("Host")!: "evil.example"]) { response in
                #expect(response.status == .misdirectedRequest)
                #expect(self.json(response)["error"] == "misdirected_request")
            }
        }
    }

    @Test func unlistedOriginsAreRefusedAndListedOnesGetAPreflight() async throws {
        let app = Application(responder: try Self.frontDoor(origins: ["https://app.example"]))
        try await app.test(.router) { client in
            try await client.execute(uri: "/", method: .get, headers: [.origin: "https://evil.example"]) { response in
                #expect(response.status == .forbidden)
                #expect(response.headers[.accessControlAllowOrigin] == nil)
            }
            // A page's failed request gets no Basic challenge (no browser login dialog); other clients do.
            try await client.execute(uri: "/_all_dbs", method: .get, headers: [.origin: "https://app.example"]) { response in
                #expect(response.status == .unauthorized && response.headers[.wwwAuthenticate] == nil)
                #expect(response.headers[.accessControlAllowOrigin] == "https://app.example")
            }
            try await client.execute(uri: "/_all_dbs", method: .get) { #expect($0.headers[.wwwAuthenticate] != nil) }
            try await client.execute(
                uri: "/ferry/doc", method: .options,
                headers: [.origin: "https://app.example", .accessControlRequestMethod: "PUT", .accessControlRequestHeaders: "content-type,authorization"]
            ) { response in
                #expect(response.status == .noContent)
                #expect(response.headers[.accessControlAllowOrigin] == "https://app.example")
                #expect(response.headers[.accessControlAllowCredentials] == "true")
            }
            try await client.execute(
                uri: "/_all_dbs", method: .get, headers: [.origin: "https://app.example", .authorization: Self.basic("reader", "r-pass")]
            ) { response in
                #expect(response.status == .ok)
                #expect(response.headers[.accessControlAllowOrigin] == "https://app.example")
            }
        }
    }

    @Test func repeatedFailedLoginsAreRefusedForAWhile() async throws {
        let clock = WallClock()
        let app = Application(responder: try Self.frontDoor(clock: clock))
        try await app.test(.router) { client in
            for _ in 0..<5 {
                try await client.execute(uri: "/_all_dbs", method: .get, headers: [.authorization: Self.basic("reader", "x")]) {
                    #expect($0.status == .unauthorized)
                }
            }
            // Even the right password waits out the window.
            try await client.execute(uri: "/_all_dbs", method: .get, headers: [.authorization: Self.basic("reader", "r-pass")]) { response in
                #expect(response.status == .tooManyRequests)
                #expect(self.json(response)["error"] == "too_many_requests")
            }
            clock.advance(61)
            try await client.execute(uri: "/_all_dbs", method: .get, headers: [.authorization: Self.basic("reader", "r-pass")]) {
                #expect($0.status == .ok)
            }
        }
    }

    @Test func parallelWrongLoginsBeyondTheLimitAreRefusedUnevaluated() async throws {
        let door = try Self.frontDoor()
        let now = Date()
        // 40 guesses at once, each checked off the cooperative threads (PBKDF2): the throttle
        // allows 5 failures per address, so no more than 5 passwords may be evaluated.
        let statuses = await withTaskGroup(of: HTTPResponse.Status.self) { group in
            for i in 0..<40 {
                group.addTask {
                    do {
                        _ = try await door.authenticate(Self.basic("reader", "wrong-\(i)"), address: "10.0.0.1", now: now)
                        return HTTPResponse.Status.ok
                    } catch let error as CouchError {
                        return error.status
                    } catch {
                        return HTTPResponse.Status.internalServerError
                    }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(statuses.filter { $0 == .unauthorized }.count <= 5, "\(statuses)")
        #expect(statuses.filter { $0 == .tooManyRequests }.count >= 35, "\(statuses)")
    }

    @Test func aSecondAddressIsRefusedForAnAccountUnderAttack() async throws {
        let door = try Self.frontDoor()
        let now = Date()
        for _ in 0..<5 {
            await #expect(throws: CouchError.self) { try await door.authenticate(Self.basic("reader", "guess"), address: "10.0.0.1", now: now) }
        }
        do {
            _ = try await door.authenticate(Self.basic("reader", "r-pass"), address: "10.0.0.2", now: now)
            Issue.record("another address was let in to an account under attack")
        } catch {
            #expect(error.status == .tooManyRequests)
        }
        // Other accounts are not held up.
        #expect(try await door.authenticate(Self.basic("writer", "w-pass"), address: "10.0.0.2", now: now) == .user(name: "writer", policy: .trusted))
    }

    @Test func aSessionCookieWorksOnlyOnTheListenerThatIssuedIt() async throws {
        let clock = WallClock()
        let sessions = CouchSessionCookies(secret: Array(repeating: 9, count: 32))
        // One node: one user table (a cookie is bound to the password hash too) and one secret.
        let users = try Self.users()
        let lan = Application(responder: try Self.frontDoor(.lan, clock: clock, sessions: sessions, users: users))
        let loopback = Application(responder: try Self.frontDoor(.loopback, clock: clock, sessions: sessions, users: users))
        func login(_ app: some ApplicationProtocol) async throws -> String {
            try await app.test(.router) { client in
                try await client.execute(
                    uri: "/_session", method: .post, headers: [.contentType: "application/json"],
                    body: ByteBuffer(string: #"{"name":"writer","password":"w-pass"}"#)
                ) { response in
                    #expect(response.status == .ok)
                    return String((response.headers[.setCookie] ?? "").prefix { $0 != ";" })
                }
            }
        }
        func status(_ app: some ApplicationProtocol, cookie: String) async throws -> HTTPResponse.Status {
            try await app.test(.router) { client in
                try await client.execute(uri: "/_all_dbs", method: .get, headers: [.cookie: cookie]) { $0.status }
            }
        }
        let fromLAN = try await login(lan)
        let fromLoopback = try await login(loopback)
        #expect(try await status(lan, cookie: fromLAN) == .ok)
        #expect(try await status(loopback, cookie: fromLoopback) == .ok)
        #expect(try await status(loopback, cookie: fromLAN) == .unauthorized)
        #expect(try await status(lan, cookie: fromLoopback) == .unauthorized)
    }

    @Test func uuidsAreRandomHexAndTheirCountIsBounded() async throws {
        let app = Application(responder: try Self.frontDoor())
        try await app.test(.router) { client in
            let auth = "Bearer \(Self.adminKey)"
            try await client.execute(uri: "/_uuids?count=3", method: .get, headers: [.authorization: auth]) { response in
                guard case .array(let ids)? = self.json(response)["uuids"] else { Issue.record("no uuids"); return }
                #expect(ids.count == 3 && Set(ids).count == 3)
                #expect(ids.allSatisfy { ($0.stringValue?.count ?? 0) == 32 })
            }
            try await client.execute(uri: "/_uuids?count=1001", method: .get, headers: [.authorization: auth]) { #expect($0.status == .forbidden) }
            try await client.execute(uri: "/_uuids?count=x", method: .get, headers: [.authorization: auth]) { #expect($0.status == .badRequest) }
        }
    }
}
