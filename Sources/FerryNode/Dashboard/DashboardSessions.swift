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
    /// Live event streams (`GET /ui/events`) one session may hold open at once: a page holds
    /// one, so a few tabs fit, and one session cannot take every stream.
    public static let maxStreamsPerSession = 4
    /// Live event streams open at once over all sessions: each builds a snapshot of the node
    /// every second, so hundreds of them slow the whole admin API.
    public static let maxStreams = 32

    private let sessions = Locked<[String: Session]>([:])
    private let tokens = Locked<[String: Date]>([:])
    /// Open event streams: per session (its cookie's digest) and in total.
    private let streams = Locked(StreamCount())

    struct StreamCount {
        var bySession: [String: Int] = [:]
        var total = 0
    }

    /// Why a live event stream was refused (answered 429 `too_many_streams`).
    enum StreamRefusal: Error, Equatable, CustomStringConvertible {
        case sessionFull(limit: Int)
        case nodeFull(limit: Int)

        var description: String {
            switch self {
            case .sessionFull(let limit):
                "this dashboard session already has \(limit) live event streams open (close a tab, or wait for one to end)"
            case .nodeFull(let limit): "the node already serves \(limit) live event streams, the most it keeps open at once"
            }
        }
    }

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

    /// Takes a slot for one live event stream of the session this cookie opens, or refuses
    /// it when the session or the node holds its most already. The slot is given back when
    /// the stream ends (`StreamSlot.release`) or, at the latest, when the slot is dropped.
    func openStream(cookie: String) throws(StreamRefusal) -> StreamSlot {
        let key = Self.digest(cookie)
        try streams.withLock { (s: inout StreamCount) throws(StreamRefusal) in
            guard s.bySession[key, default: 0] < Self.maxStreamsPerSession else { throw .sessionFull(limit: Self.maxStreamsPerSession) }
            guard s.total < Self.maxStreams else { throw .nodeFull(limit: Self.maxStreams) }
            s.bySession[key, default: 0] += 1
            s.total += 1
        }
        return StreamSlot(sessions: self, key: key)
    }

    /// Live event streams open now: of the session this cookie opens, and in total.
    func openStreams(cookie: String? = nil) -> (session: Int, total: Int) {
        let key = cookie.map(Self.digest)
        return streams.withLock { s in (key.map { s.bySession[$0] ?? 0 } ?? 0, s.total) }
    }

    fileprivate func closeStream(key: String) {
        streams.withLock { s in
            let left = (s.bySession[key] ?? 1) - 1
            s.bySession[key] = left > 0 ? left : nil
            s.total = max(0, s.total - 1)
        }
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

/// One live event stream's place in `DashboardSessions`' counts: given back once, by
/// `release()` when the stream ends or by deinit if the stream never ran (a connection that
/// closed before its answer was written), so no path leaves a slot taken.
final class StreamSlot: Sendable {
    private let sessions: DashboardSessions
    private let key: String
    private let released = Locked(false)

    fileprivate init(sessions: DashboardSessions, key: String) {
        self.sessions = sessions
        self.key = key
    }

    func release() {
        let first = released.withLock { r in
            defer { r = true }
            return !r
        }
        if first { sessions.closeStream(key: key) }
    }

    deinit { release() }
}
