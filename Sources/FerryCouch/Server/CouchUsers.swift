import Crypto
import CryptoExtras
import FerryCore
import FerrySync
import Foundation

/// A salted PBKDF2-SHA256 password hash in the config's text form
/// `pbkdf2-sha256$<iterations>$<salt base64>$<hash base64>`; it verifies a password in
/// constant time and never holds the password itself.
public struct CouchPasswordHash: Sendable, Equatable, CustomStringConvertible {
    public static let scheme = "pbkdf2-sha256"
    /// Fewer iterations make a stolen config too cheap to brute-force.
    public static let minimumIterations = 10_000
    public static let maximumIterations = 10_000_000
    /// What `ferry couch-user` uses (OWASP's figure for PBKDF2-HMAC-SHA256).
    public static let defaultIterations = 600_000
    static let minimumSaltBytes = 16
    static let hashBytes = 32

    public let iterations: Int
    public let salt: [UInt8]
    public let hash: [UInt8]

    /// The config text form.
    public var description: String {
        "\(Self.scheme)$\(iterations)$\(Data(salt).base64EncodedString())$\(Data(hash).base64EncodedString())"
    }

    /// Parses the config text form; the error says what is wrong, never echoing the hash.
    public init(parsing text: String) throws(CouchUserError) {
        let parts = text.split(separator: "$", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0] == Self.scheme else {
            throw .badHash("must be \(Self.scheme)$ITERATIONS$SALT$HASH (make one with `ferry couch-user NAME`)")
        }
        guard let n = Int(parts[1]), (Self.minimumIterations...Self.maximumIterations).contains(n) else {
            throw .badHash("iterations must be an integer in \(Self.minimumIterations)...\(Self.maximumIterations)")
        }
        guard let salt = Data(base64Encoded: String(parts[2])), salt.count >= Self.minimumSaltBytes else {
            throw .badHash("the salt must be base64 of at least \(Self.minimumSaltBytes) bytes")
        }
        guard let hash = Data(base64Encoded: String(parts[3])), hash.count == Self.hashBytes else {
            throw .badHash("the hash must be base64 of \(Self.hashBytes) bytes")
        }
        iterations = n
        self.salt = Array(salt)
        self.hash = Array(hash)
    }

    /// Hashes `password` with a fresh random salt.
    public init(password: String, iterations: Int = Self.defaultIterations) throws(CouchUserError) {
        guard (Self.minimumIterations...Self.maximumIterations).contains(iterations) else {
            throw .badHash("iterations must be in \(Self.minimumIterations)...\(Self.maximumIterations)")
        }
        let salt = SymmetricKey(size: .bits128).withUnsafeBytes { Array($0) }
        self.iterations = iterations
        self.salt = salt
        hash = try Self.derive(password, salt: salt, iterations: iterations)
    }

    /// A hash no password matches, for checks that must cost what a real one does.
    init(unmatchable iterations: Int) {
        self.iterations = iterations
        salt = Array(repeating: 0, count: Self.minimumSaltBytes)
        hash = Array(repeating: 0, count: Self.hashBytes)
    }

    static func derive(_ password: String, salt: [UInt8], iterations: Int) throws(CouchUserError) -> [UInt8] {
        do {
            let key = try KDF.Insecure.PBKDF2.deriveKey(
                from: Array(password.utf8), salt: salt, using: .sha256, outputByteCount: hashBytes, unsafeUncheckedRounds: iterations)
            return key.withUnsafeBytes { Array($0) }
        } catch {
            throw .badHash("PBKDF2 failed: \(error)")
        }
    }

    /// Whether `password` is the one hashed (the comparison is constant time).
    public func verify(_ password: String) -> Bool {
        guard let derived = try? Self.derive(password, salt: salt, iterations: iterations) else { return false }
        var difference: UInt8 = 0
        for (a, b) in zip(derived, hash) { difference |= a ^ b }
        return difference == 0 && derived.count == hash.count
    }
}

/// A configured user of the CouchDB API: a name, a password hash and the read/write
/// policy Ferry applies to peers.
public struct CouchUser: Sendable, Equatable {
    public var name: String
    public var password: CouchPasswordHash
    public var policy: PeerPolicy

    public init(name: String, password: CouchPasswordHash, policy: PeerPolicy = .trusted) {
        self.name = name
        self.password = password
        self.policy = policy
    }

    /// Why a user name is refused, or nil: non-empty, at most 200 characters, no `:` (it
    /// ends the name in HTTP Basic), no control characters, and not `admin` (the admin key's).
    public static func nameProblem(_ name: String) -> String? {
        if name.isEmpty || name.count > 200 { return "must be 1–200 characters" }
        if name.contains(":") { return "must not contain ':' (HTTP Basic separates name and password with it)" }
        if name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control || $0.properties.generalCategory == .format }) {
            return "must not contain control or format characters"
        }
        if name == "admin" || name.hasPrefix("_") { return "\"\(name)\" is reserved (admin is the admin key's user name)" }
        return nil
    }
}

/// The users of the CouchDB API, replaceable while the node runs, with a short-lived memory
/// of passwords already verified so that HTTP Basic clients (one PBKDF2 run per request
/// otherwise) stay fast. The memory holds keyed digests of name, password and hash, never
/// the password, so a changed password or a removed user is never let in by it.
public final class CouchUserTable: Sendable {
    private struct Users: Sendable {
        var byName: [String: CouchUser]
        /// Checked for unknown names, as costly as the costliest configured hash.
        var unknownUser: CouchPasswordHash

        init(_ users: [CouchUser]) {
            byName = Dictionary(users.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
            unknownUser = CouchPasswordHash(unmatchable: users.map(\.password.iterations).max() ?? CouchPasswordHash.minimumIterations)
        }
    }

    private let current: Locked<Users>
    /// Narrows a user's own policy by what the node's group grants the user (set once, by
    /// the node that serves the table); nil: the user's own policy alone.
    public let groupRestriction = Locked<(@Sendable (String, PeerPolicy) -> PeerPolicy)?>(nil)
    private let cacheKey = SymmetricKey(size: .bits256)
    private let verified = Locked<[Data: Date]>([:])
    /// How long a verified password skips PBKDF2.
    let rememberFor: TimeInterval
    static let maxRemembered = 4096

    /// The policy a request by `user` is judged by: the user's own, narrowed by the group's rules.
    public func policy(of user: CouchUser) -> PeerPolicy {
        guard let restrict = groupRestriction.withLock({ $0 }) else { return user.policy }
        return restrict(user.name, user.policy)
    }

    public init(_ users: [CouchUser], rememberFor: TimeInterval = 600) {
        current = Locked(Users(users))
        self.rememberFor = rememberFor
    }

    private var users: [String: CouchUser] { current.withLock { $0.byName } }
    private var unknownUser: CouchPasswordHash { current.withLock { $0.unknownUser } }

    /// Replaces every user at once; the next request, login or cookie check sees the new set
    /// (a cookie names its user's password hash, so a removed user's or an old password's
    /// cookie stops working).
    public func replace(with users: [CouchUser]) {
        current.withLock { $0 = Users(users) }
        verified.withLock { $0.removeAll() }
        policiesChanged()
    }

    /// The principal as it stands at each call: a user's policy of the moment, or nil once
    /// the user was removed or its password changed (as its cookie sessions end). For
    /// responses that outlive their request's authentication (live feeds).
    public func follow(_ principal: CouchPrincipal) -> @Sendable () -> CouchPrincipal? {
        guard case .user(let name, _) = principal else { return { principal } }
        let credential = user(named: name)?.password.description
        return { [self] in
            guard let user = self.user(named: name), user.password.description == credential else { return nil }
            return .user(name: name, policy: self.policy(of: user))
        }
    }

    /// Fired, then replaced, at each change that may change a user's policy or password.
    private let change = Locked(Latch<Void>())

    /// What the next change fires: take it before reading a user, then wait on it, and no
    /// change in between is missed.
    public func nextChange() -> Latch<Void> { change.withLock { $0 } }

    /// Tells those watching users (live replications) that policies may have changed: the
    /// table's users, or the group's rules that narrow them.
    public func policiesChanged() {
        let fired = change.withLock { latch -> Latch<Void> in
            let old = latch
            latch = Latch()
            return old
        }
        fired.set(())
    }

    /// Every user, by name.
    public var all: [CouchUser] { users.values.sorted { $0.name < $1.name } }

    public var isEmpty: Bool { users.isEmpty }

    public func user(named name: String) -> CouchUser? { current.withLock { $0.byName[name] } }

    /// The user whose name and password these are when the same pair was verified within
    /// `rememberFor` (no PBKDF2); nil otherwise, which says nothing about the password.
    public func remembered(name: String, password: String, now: Date) -> CouchUser? {
        guard let user = users[name] else { return nil }
        let digest = rememberedDigest(user: user, password: password)
        let known = verified.withLock { cache -> Bool in
            guard let until = cache[digest] else { return false }
            if until > now { return true }
            cache[digest] = nil
            return false
        }
        return known ? user : nil
    }

    private func rememberedDigest(user: CouchUser, password: String) -> Data {
        var mac = HMAC<SHA256>(key: cacheKey)
        mac.update(data: Array(user.name.utf8) + [0] + Array(password.utf8) + [0] + Array(user.password.description.utf8))
        return Data(mac.finalize())
    }

    /// The user whose name and password these are, or nil. Runs PBKDF2 (tens to hundreds of
    /// milliseconds) unless the same pair was verified within `rememberFor`.
    public func authenticate(name: String, password: String, now: Date) -> CouchUser? {
        guard let user = users[name] else {
            // As slow as a real check, so that timing does not tell which names exist.
            _ = unknownUser.verify(password)
            return nil
        }
        if let user = remembered(name: name, password: password, now: now) { return user }
        let digest = rememberedDigest(user: user, password: password)
        guard user.password.verify(password) else { return nil }
        verified.withLock { cache in
            if cache.count >= Self.maxRemembered { cache = cache.filter { $0.value > now } }
            if cache.count >= Self.maxRemembered { cache.removeAll() }
            cache[digest] = now.addingTimeInterval(rememberFor)
        }
        return user
    }
}

/// A user entry or password hash that cannot be used.
public enum CouchUserError: FerryError, Equatable {
    case badHash(String)

    public var domain: String { "couch" }
    public var code: String { "bad_password_hash" }
    public var failure: FailureKind { .invalidRequest }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .badHash(let why): return why
        }
    }
}
