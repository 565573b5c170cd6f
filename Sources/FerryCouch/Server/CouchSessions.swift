import Crypto
import FerryCore
import Foundation

/// Issues and checks `AuthSession` cookies: `base64url(name:expiry:mac)` where the mac is
/// HMAC-SHA256 under the node's session secret over the name, the expiry, the user's
/// credential (its password hash), so a changed password ends its sessions, and the listener
/// that issued it, so a cookie works only there.
public struct CouchSessionCookies: Sendable {
    public static let cookieName = "AuthSession"
    /// CouchDB's default session lifetime.
    public static let defaultLifetime: TimeInterval = 600

    private let secret: SymmetricKey
    /// Seconds a cookie stays valid; a request in the last 90 % of that renews it.
    public let lifetime: TimeInterval

    /// `secret` is the node's session secret (at least 32 bytes).
    public init(secret: [UInt8], lifetime: TimeInterval = Self.defaultLifetime) {
        self.secret = SymmetricKey(data: secret)
        self.lifetime = lifetime
    }

    /// A session for `name` on `listener`, valid for `lifetime` from `now`; `credential`
    /// identifies the user's current password (or key).
    public func issue(name: String, credential: String, listener: CouchFrontDoor.Listener, now: Date) -> String {
        let expiry = String(Int64(now.timeIntervalSince1970 + lifetime), radix: 16)
        let payload = "\(name):\(expiry)"
        let token = payload + ":" + Self.base64url(mac(payload, credential: credential, listener: listener))
        return Self.base64url(Array(token.utf8))
    }

    /// A valid cookie's user name and expiry; nil when it is malformed, forged, expired,
    /// issued by another listener, or its credential changed. `credential` answers a name's
    /// current credential (nil: no such user).
    public func verify(
        _ cookie: String, listener: CouchFrontDoor.Listener, credential: (String) -> String?, now: Date
    ) -> (name: String, expires: Date)? {
        guard let bytes = Self.base64urlDecode(cookie), let token = String(bytes: bytes, encoding: .utf8) else { return nil }
        let parts = token.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3, let expiry = Int64(parts[1], radix: 16), let presented = Self.base64urlDecode(String(parts[2])) else {
            return nil
        }
        let name = String(parts[0])
        guard let current = credential(name) else { return nil }
        let expected = mac("\(name):\(parts[1])", credential: current, listener: listener)
        guard presented.count == expected.count else { return nil }
        var difference: UInt8 = 0
        for (a, b) in zip(presented, expected) { difference |= a ^ b }
        let expires = Date(timeIntervalSince1970: TimeInterval(expiry))
        guard difference == 0, expires > now else { return nil }
        return (name, expires)
    }

    /// Whether a cookie expiring at `expires` should be reissued (less than 90 % of its lifetime left).
    public func needsRenewal(expires: Date, now: Date) -> Bool {
        expires.timeIntervalSince(now) < lifetime * 0.9
    }

    /// The `Set-Cookie` value for a session cookie; `secure` on TLS listeners.
    public func setCookie(_ value: String, secure: Bool) -> String {
        "\(Self.cookieName)=\(value); Version=1; Path=/; Max-Age=\(Int(lifetime)); HttpOnly; SameSite=Lax\(secure ? "; Secure" : "")"
    }

    /// The `Set-Cookie` value that removes the session cookie.
    public static func clearingCookie(secure: Bool) -> String {
        "\(cookieName)=; Version=1; Path=/; Max-Age=0; HttpOnly; SameSite=Lax\(secure ? "; Secure" : "")"
    }

    /// The name Sync Gateway gives its session cookie, which Couchbase Lite's session
    /// authenticator sends unless told another: accepted on the replication endpoint.
    public static let syncGatewayCookieName = "SyncGatewaySession"

    /// The `AuthSession` value (or the cookie `name`'s) among a request's `Cookie` headers, if any.
    public static func cookie(in headers: [String], named name: String = cookieName) -> String? {
        for header in headers {
            for pair in header.split(separator: ";") {
                let p = pair.trimmingCharacters(in: .whitespaces)
                guard let eq = p.firstIndex(of: "="), p[..<eq] == name else { continue }
                var value = String(p[p.index(after: eq)...])
                if value.hasPrefix("\"") && value.hasSuffix("\"") && value.count >= 2 { value = String(value.dropFirst().dropLast()) }
                return value.isEmpty ? nil : value
            }
        }
        return nil
    }

    private func mac(_ payload: String, credential: String, listener: CouchFrontDoor.Listener) -> [UInt8] {
        var h = HMAC<SHA256>(key: secret)
        h.update(data: Array(payload.utf8) + [0] + Array(credential.utf8) + [0] + Array(Self.tag(listener).utf8))
        return Array(h.finalize())
    }

    /// The listener's name inside the mac.
    static func tag(_ listener: CouchFrontDoor.Listener) -> String {
        switch listener {
        case .loopback: return "listener=loopback"
        case .lan: return "listener=lan"
        }
    }

    static func base64url(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func base64urlDecode(_ text: String) -> [UInt8]? {
        guard text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else { return nil }
        var s = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while s.count % 4 != 0 { s.append("=") }
        return Data(base64Encoded: s).map(Array.init)
    }
}
