import Crypto
import FerryCore
import Foundation

/// The web dashboard's logins: sessions (a cookie's digest → its CSRF token and expiry) and
/// one-time login links. Only digests of cookies and tokens are kept, in memory: a restart
/// logs everyone out.
public final class DashboardSessions: Sendable {
    struct Session: Sendable {
        let csrf: String
        let expires: Date
    }

    /// The session cookie's name.
    public static let cookieName = "ferry_session"
    /// How long a session lasts from its login.
    public static let lifetime: TimeInterval = 12 * 3600
    /// How long a one-time login link may wait to be opened.
    public static let tokenLifetime: TimeInterval = 120
    /// Sessions kept at most (the oldest go first): a login loop cannot fill memory.
    static let maxSessions = 256

    private let sessions = Locked<[String: Session]>([:])
    private let tokens = Locked<[String: Date]>([:])

    public init() {}

    static func random() -> String { Hex.encode(SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }) }
    static func digest(_ s: String) -> String { Hex.encode(SHA256.hash(data: Array(s.utf8))) }

    /// A new session: the cookie's value and its CSRF token.
    public func create(now: Date = Date()) -> (cookie: String, csrf: String) {
        let cookie = Self.random(), csrf = Self.random()
        sessions.withLock { s in
            s = s.filter { $0.value.expires > now }
            if s.count >= Self.maxSessions, let oldest = s.min(by: { $0.value.expires < $1.value.expires })?.key { s[oldest] = nil }
            s[Self.digest(cookie)] = Session(csrf: csrf, expires: now.addingTimeInterval(Self.lifetime))
        }
        return (cookie, csrf)
    }

    /// The CSRF token of the live session this cookie opens, or nil.
    public func csrf(cookie: String, now: Date = Date()) -> String? {
        sessions.withLock { s in
            let key = Self.digest(cookie)
            guard let session = s[key] else { return nil }
            guard session.expires > now else {
                s[key] = nil
                return nil
            }
            return session.csrf
        }
    }

    public func end(cookie: String) { _ = sessions.withLock { $0.removeValue(forKey: Self.digest(cookie)) } }

    /// A one-time login token (what `ferry ui` prints in a link).
    public func issueToken(now: Date = Date()) -> String {
        let token = Self.random()
        tokens.withLock { t in
            t = t.filter { $0.value > now }
            t[Self.digest(token)] = now.addingTimeInterval(Self.tokenLifetime)
        }
        return token
    }

    /// Whether the token is valid; it is used up either way.
    public func redeem(_ token: String, now: Date = Date()) -> Bool {
        tokens.withLock { t in t.removeValue(forKey: Self.digest(token)).map { $0 > now } ?? false }
    }

    /// The session cookie's value in a `Cookie` header, if any.
    static func cookie(in header: String?) -> String? {
        guard let header else { return nil }
        for part in header.split(separator: ";") {
            let kv = part.trimmingCharacters(in: .whitespaces)
            if kv.hasPrefix(cookieName + "=") { return String(kv.dropFirst(cookieName.count + 1)) }
        }
        return nil
    }
}
