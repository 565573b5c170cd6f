import Crypto
import FerryCore
import Foundation

/// A single-use invitation as the new node receives it: the inviter's node ID (pinned when
/// dialling), where it listens, and a random 128-bit secret.
///
/// Text form: `ferry1-` followed by unpadded base64url of the bytes
/// `0x01 | inviter ID (32 bytes) | secret (16 bytes) | UTF-8 "host:port[,host:port…]"`.
public struct InvitationCode: Sendable, Equatable {
    public static let prefix = "ferry1-"
    static let formatVersion: UInt8 = 1

    public var inviter: String
    public var secret: [UInt8]
    /// `host:port` (IPv6 hosts in brackets), tried in order.
    public var addresses: [String]

    public init(inviter: String, secret: [UInt8], addresses: [String]) {
        self.inviter = inviter
        self.secret = secret
        self.addresses = addresses
    }

    /// Parses a code; anything malformed says what is wrong with it.
    public init(parsing raw: String) throws(MembershipError) {
        let text = raw.trimmingCharacters(in: .whitespacesAndNewlines)
        guard text.hasPrefix(Self.prefix) else { throw .badInvitationCode("it does not start with \"\(Self.prefix)\"") }
        guard let bytes = Base64URL.decode(String(text.dropFirst(Self.prefix.count))) else {
            throw .badInvitationCode("the part after \"\(Self.prefix)\" is not base64url (was it cut when copied?)")
        }
        guard bytes.count > 49 else { throw .badInvitationCode("it is too short (was it cut when copied?)") }
        guard bytes[0] == Self.formatVersion else { throw .badInvitationCode("unknown code format \(bytes[0])") }
        inviter = Hex.encode(bytes[1..<33])
        secret = Array(bytes[33..<49])
        guard let list = String(validating: bytes[49...], as: UTF8.self) else {
            throw .badInvitationCode("its address list is not UTF-8")
        }
        addresses = list.split(separator: ",").map(String.init)
        for a in addresses where Self.split(address: a) == nil {
            throw .badInvitationCode("\"\(LogText.escape(a))\" is not a host:port address")
        }
        guard !addresses.isEmpty else { throw .badInvitationCode("it names no address") }
    }

    public var text: String {
        var bytes: [UInt8] = [Self.formatVersion]
        bytes += Hex.decode(inviter) ?? []
        bytes += secret
        bytes += Array(addresses.joined(separator: ",").utf8)
        return Self.prefix + Base64URL.encode(bytes)
    }

    /// Splits `host:port` or `[v6]:port`; nil when either part is missing or the port is out of range.
    public static func split(address: String) -> (host: String, port: Int)? {
        guard let colon = address.lastIndex(of: ":") else { return nil }
        var host = String(address[..<colon])
        guard let port = Int(address[address.index(after: colon)...]), (1...65535).contains(port) else { return nil }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains(","), !host.contains(where: { $0.isWhitespace || $0 == "/" }) else { return nil }
        return (host, port)
    }
}

/// Unpadded base64url (RFC 4648 §5).
enum Base64URL {
    static func encode(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func decode(_ text: String) -> [UInt8]? {
        guard text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else { return nil }
        var s = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while s.count % 4 != 0 { s += "=" }
        return Data(base64Encoded: s).map(Array.init)
    }
}

/// A moment of this machine's boot: its boot ID and the real time since it booted
/// (`CLOCK_BOOTTIME`, which counts suspend and never moves with the wall clock), so a
/// deadline kept on disk survives a restart of the node and cannot be stretched by setting
/// the clock back.
public struct BootInstant: Sendable, Equatable {
    public var boot: String
    public var seconds: Double

    public init(boot: String, seconds: Double) {
        self.boot = boot
        self.seconds = seconds
    }

    /// Read once: a boot's ID never changes while a process lives.
    private static let bootID: String? = (try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8))?
        .trimmingCharacters(in: .whitespacesAndNewlines)

    /// Now, or nil where the boot ID cannot be read (the wall clock alone then decides).
    public static func now() -> BootInstant? {
        guard let boot = bootID, !boot.isEmpty else { return nil }
        var ts = timespec()
        guard clock_gettime(CLOCK_BOOTTIME, &ts) == 0 else { return nil }
        return BootInstant(boot: boot, seconds: Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9)
    }
}

/// The invitations this node issued, persisted in DATA/invitations.json (0600): only the
/// SHA-256 of each secret, its expiry, its admin flag and whether it was used.
///
/// An invitation ends at its wall-clock expiry or once its lifetime of real time has passed
/// in the boot that issued it, whichever comes first: a clock set back cannot make a code
/// live longer than it was issued for, and a clock set forward ends it early (refusing is
/// the safe side).
public final class InvitationBook: Sendable {
    /// One issued invitation.
    struct Record: Sendable, Equatable {
        var secretHash: [UInt8]
        var expires: Date
        var admin: Bool
        var used: Bool
        /// The same expiry on the issuing boot's clock (nil: issued where it could not be read).
        var bootDeadline: BootInstant? = nil

        func hasExpired(at wall: Date, _ up: BootInstant?) -> Bool {
            if expires <= wall { return true }
            guard let deadline = bootDeadline, let up, up.boot == deadline.boot else { return false }
            return up.seconds >= deadline.seconds
        }
    }

    let file: String?
    let now: @Sendable () -> Date
    let uptime: @Sendable () -> BootInstant?
    private let records: Locked<[Record]>

    /// Loads the book from `file` (nil keeps it in memory only); an unreadable file starts empty.
    init(file: String?, now: @escaping @Sendable () -> Date = { Date() }, uptime: @escaping @Sendable () -> BootInstant? = BootInstant.now) {
        self.file = file
        self.now = now
        self.uptime = uptime
        var loaded: [Record] = []
        if let file, let data = FileManager.default.contents(atPath: file), let json = try? JSON.parse(Array(data)),
            case .array(let list)? = json["invitations"]
        {
            for item in list {
                guard let hash = item["secretSHA256"]?.stringValue.flatMap(Hex.decode), hash.count == 32,
                    let expires = item["expires"]?.intValue, let admin = item["admin"]?.boolValue, let used = item["used"]?.boolValue
                else { continue }
                var record = Record(secretHash: hash, expires: Date(timeIntervalSince1970: Double(expires) / 1000), admin: admin, used: used)
                if let boot = item["boot"]?.stringValue, let ms = item["bootDeadline"]?.intValue {
                    record.bootDeadline = BootInstant(boot: boot, seconds: Double(ms) / 1000)
                }
                loaded.append(record)
            }
        }
        records = Locked(loaded)
    }

    /// Whether an unused, unexpired invitation exists (the listener then admits unknown certificates to join).
    public var isOpen: Bool {
        let (t, up) = (now(), uptime())
        return records.withLock { $0.contains { !$0.used && !$0.hasExpired(at: t, up) } }
    }

    /// Issues an invitation; returns its secret and expiry.
    func issue(admin: Bool, lifetime: TimeInterval) throws(MembershipError) -> (secret: [UInt8], expires: Date) {
        var rng = SystemRandomNumberGenerator()
        let secret = (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let expires = now().addingTimeInterval(lifetime)
        var record = Record(secretHash: Array(SHA256.hash(data: secret)), expires: expires, admin: admin, used: false)
        record.bootDeadline = uptime().map { BootInstant(boot: $0.boot, seconds: $0.seconds + lifetime) }
        records.withLock { $0.append(record) }
        try save()
        return (secret, expires)
    }

    /// Spends the invitation with this secret: unknown, used and expired ones are refused.
    /// Compares every stored hash in constant time, so timing tells nothing about the secret.
    func redeem(_ secret: [UInt8]) throws(MembershipError) -> Record {
        let hash = Array(SHA256.hash(data: secret))
        let (t, up) = (now(), uptime())
        let outcome = records.withLock { list -> Result<Record, MembershipError> in
            var match: Int?
            for (i, r) in list.enumerated() where Self.constantTimeEqual(r.secretHash, hash) { match = i }
            guard let i = match else { return .failure(.invitationUnknown) }
            if list[i].used { return .failure(.invitationUsed) }
            if list[i].hasExpired(at: t, up) { return .failure(.invitationExpired) }
            list[i].used = true
            return .success(list[i])
        }
        let record = try outcome.get()
        try save()
        return record
    }

    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var diff: UInt8 = 0
        for i in a.indices { diff |= a[i] ^ b[i] }
        return diff == 0
    }

    /// Saves, dropping records that expired more than a day ago (used ones still refuse reuse until then).
    func save() throws(MembershipError) {
        guard let file else { return }
        let horizon = now().addingTimeInterval(-86_400)
        let list = records.withLock { r -> [Record] in
            r.removeAll { $0.expires < horizon }
            return r
        }
        let json = JSON.object([
            "invitations": .array(list.map { r in
                var item: [String: JSON] = [
                    "secretSHA256": .string(Hex.encode(r.secretHash)), "expires": .int(Int64(r.expires.timeIntervalSince1970 * 1000)),
                    "admin": .bool(r.admin), "used": .bool(r.used),
                ]
                if let d = r.bootDeadline {
                    item["boot"] = .string(d.boot)
                    item["bootDeadline"] = .int(Int64(d.seconds * 1000))
                }
                return .object(item)
            })
        ])
        do { try writeAtomically(json, to: file) } catch { throw .storage("cannot save \(file): \(error)") }
    }
}

/// Counts failed joins per peer and per address over a sliding minute: past the limit,
/// further attempts are refused until the minute has passed.
final class JoinAttempts: Sendable {
    let limit: Int
    let window: Duration
    /// Time on a monotonic clock (a wall clock set back a day would hold failures for a day).
    let elapsed: @Sendable () -> Duration
    private let failures = Locked<[String: [Duration]]>([:])

    init(limit: Int = 5, window: Duration = .seconds(60), clock: any Clock<Duration> = ContinuousClock()) {
        self.limit = limit
        self.window = window
        self.elapsed = Self.stopwatch(clock)
    }

    private static func stopwatch<C: Clock<Duration>>(_ clock: C) -> @Sendable () -> Duration {
        let start = clock.now
        return { start.duration(to: clock.now) }
    }

    func isLimited(_ keys: [String]) -> Bool {
        let t = elapsed()
        return failures.withLock { f in keys.contains { (f[$0] ?? []).filter { t - $0 < window }.count >= limit } }
    }

    func failed(_ keys: [String]) {
        let t = elapsed()
        failures.withLock { f in
            if f.count > 1024 { f = f.filter { $0.value.contains { t - $0 < window } } }
            for k in keys { f[k] = (f[k] ?? []).filter { t - $0 < window } + [t] }
        }
    }
}
