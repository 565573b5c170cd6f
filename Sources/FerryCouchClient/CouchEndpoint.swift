import FerryCore
import FerryCouchDocuments
import Foundation

/// A CouchDB-protocol database to replicate with: where it is, who to log in as, and how
/// to trust its TLS certificate. Never logs or prints its password (`redacted`).
public struct CouchEndpoint: Sendable, Equatable, CustomStringConvertible {
    /// How the server's TLS certificate is trusted.
    public enum Trust: Sendable, Equatable {
        /// The system's trust store (Debian's ca-certificates), with host-name checks.
        case system
        /// Exactly the certificate whose DER has this SHA-256 (64 lowercase hex): for a
        /// self-signed CouchDB. Host names are not checked.
        case pinned(String)
    }

    /// `http` or `https`.
    public var scheme: String
    public var host: String
    public var port: Int
    /// The database name, unescaped.
    public var database: String
    public var credentials: CouchCredentials?
    public var trust: Trust = .system
    /// Create the database when it does not exist (a push target only); otherwise a
    /// missing database is a permanent error.
    public var createTarget = false

    /// `scheme://host:port`, without credentials.
    public var serverURL: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return "\(scheme)://\(h):\(port)"
    }

    /// The database's URL without credentials: what logs, status and checkpoints show.
    public var redacted: String { serverURL + "/" + Self.escapeDatabase(database) }
    public var description: String { redacted }

    /// Whether `text` names a CouchDB-protocol database (an http or https URL).
    public static func isCouchURL(_ text: String) -> Bool {
        let lower = text.lowercased()
        return lower.hasPrefix("http://") || lower.hasPrefix("https://")
    }

    /// Parses `http(s)://[user:pass@]host[:port]/db`; credentials in the URL are percent-decoded.
    public static func parse(_ text: String) throws(CouchClientError) -> CouchEndpoint {
        guard isCouchURL(text), let url = URLComponents(string: text), let scheme = url.scheme?.lowercased(),
            let host = url.host, !host.isEmpty
        else {
            throw .badEndpoint("\(Self.redact(text)) is not an http(s)://[user:password@]host[:port]/database URL")
        }
        let path = url.percentEncodedPath
        var name = path.hasPrefix("/") ? String(path.dropFirst()) : path
        if name.hasSuffix("/") { name.removeLast() }
        guard !name.isEmpty, !name.contains("/"), let database = name.removingPercentEncoding, !database.isEmpty else {
            throw .badEndpoint("\(Self.redact(text)) names no database: give http(s)://host:port/DATABASE")
        }
        guard url.query == nil, url.fragment == nil else {
            throw .badEndpoint("\(Self.redact(text)): a database URL takes no query or fragment")
        }
        var endpoint = CouchEndpoint(
            scheme: scheme, host: host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host,
            port: url.port ?? (scheme == "https" ? 443 : 80), database: database)
        if let user = url.user {
            endpoint.credentials = CouchCredentials(user: user.removingPercentEncoding ?? user, password: (url.password ?? "").removingPercentEncoding ?? "")
        }
        return endpoint
    }

    public init(scheme: String, host: String, port: Int, database: String, credentials: CouchCredentials? = nil) {
        self.scheme = scheme
        self.host = host
        self.port = port
        self.database = database
        self.credentials = credentials
    }

    /// A certificate fingerprint as `--pin` takes it: 64 hex digits, upper or lower case,
    /// optionally in pairs separated by `:` (as `openssl x509 -fingerprint -sha256` prints
    /// it); returned as 64 lowercase hex.
    public static func normalizedPin(_ text: String) throws(CouchClientError) -> String {
        var t = text.trimmingCharacters(in: .whitespaces).lowercased()
        if t.hasPrefix("sha256:") { t.removeFirst(7) }
        if t.hasPrefix("sha256 fingerprint=") { t.removeFirst(19) }
        let hex = t.replacingOccurrences(of: ":", with: "")
        guard hex.utf8.count == 64, hex.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) }) else {
            throw .badEndpoint("\(text) is not a SHA-256 certificate fingerprint (64 hex digits)")
        }
        return hex
    }

    /// `text` with any password replaced by `***`.
    public static func redact(_ text: String) -> String {
        guard var url = URLComponents(string: text), url.password != nil else { return text }
        url.password = "***"
        return url.string ?? text
    }

    /// A database name as one path segment (CouchDB names may hold `/`, `+`, `$`, `(`, `)`).
    public static func escapeDatabase(_ name: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-_.~")
        return name.addingPercentEncoding(withAllowedCharacters: allowed) ?? name
    }
}

/// A CouchDB user name and password, sent as HTTP Basic credentials.
public struct CouchCredentials: Sendable, Equatable, CustomStringConvertible {
    public var user: String
    public var password: String
    public init(user: String, password: String) {
        self.user = user
        self.password = password
    }
    public var description: String { "\(user):***" }

    /// `USER:PASSWORD` as read from a file (first line; trailing newline ignored) or an
    /// environment variable.
    public static func parse(_ text: String, source: String) throws(CouchClientError) -> CouchCredentials {
        // "\r\n" is one Character in Swift: split on either line ending.
        let trimmed = text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" || $0 == "\r" })
            .first.map(String.init) ?? ""
        guard let colon = trimmed.firstIndex(of: ":"), colon != trimmed.startIndex else {
            throw .badEndpoint("\(source) must hold USER:PASSWORD")
        }
        return CouchCredentials(user: String(trimmed[..<colon]), password: String(trimmed[trimmed.index(after: colon)...]))
    }

    /// Reads `USER:PASSWORD` from a file (which should be readable by its owner only).
    public static func fromFile(_ path: String) throws(CouchClientError) -> CouchCredentials {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw .badEndpoint("cannot read the credentials file \(path)")
        }
        return try parse(String(decoding: data, as: UTF8.self), source: "the credentials file \(path)")
    }

    /// Reads `USER:PASSWORD` from an environment variable.
    public static func fromEnvironment(_ name: String) throws(CouchClientError) -> CouchCredentials {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else {
            throw .badEndpoint("the environment variable \(name) is not set (it should hold USER:PASSWORD)")
        }
        return try parse(value, source: "the environment variable \(name)")
    }
}

/// A failure talking to a CouchDB-protocol server; says whether retrying may help.
public struct CouchClientError: FerryError, Equatable {
    /// Which failure this is; callers branch on these cases.
    public enum Kind: Hashable, Sendable {
        case badEndpoint, connectFailed, timeout, stalled, stopped, tlsFailed, pinMismatch, openssl, noPort
        case badResponse, notCouchDB, databaseMissing, badCheckpoint, badLocalDocument, blobMissing, noConflicts
        case unauthorized, forbidden, notFound, serverBusy, localWriteFailed, internalFailure
        /// Another error the server named in its answer (its `error` member).
        case server(String)

        private static let names: [(Kind, String)] = [
            (.badEndpoint, "bad_endpoint"), (.connectFailed, "connect_failed"), (.timeout, "timeout"), (.stalled, "stalled"),
            (.stopped, "stopped"), (.tlsFailed, "tls_failed"), (.pinMismatch, "pin_mismatch"), (.openssl, "openssl"),
            (.noPort, "no_port"), (.badResponse, "bad_response"), (.notCouchDB, "not_couchdb"), (.databaseMissing, "database_missing"),
            (.badCheckpoint, "bad_checkpoint"), (.badLocalDocument, "bad_local_document"), (.blobMissing, "blob_missing"),
            (.noConflicts, "no_conflicts"), (.unauthorized, "unauthorized"), (.forbidden, "forbidden"), (.notFound, "not_found"),
            (.serverBusy, "server_busy"), (.localWriteFailed, "local_write_failed"), (.internalFailure, "internal"),
        ]

        /// The stable name logs and status show.
        public var name: String {
            if case .server(let name) = self { return name }
            return Self.names.first { $0.0 == self }!.1
        }
    }

    public let kind: Kind
    public let message: String
    public let isTransient: Bool
    /// The HTTP status, when the server answered.
    public let status: Int?
    public var domain: String { "couch" }
    public var code: String { kind.name }
    /// The message alone: `SyncError` and logs show the domain and code beside it.
    public var description: String { message }

    public init(_ kind: Kind, message: String, isTransient: Bool, status: Int? = nil) {
        self.kind = kind
        self.message = message
        self.isTransient = isTransient
        self.status = status
    }

    public var failure: FailureKind {
        switch kind {
        case .unauthorized, .forbidden: .forbidden
        case .notFound, .databaseMissing: .notFound
        case .connectFailed, .timeout, .stalled, .stopped, .serverBusy: .unavailable
        case .localWriteFailed, .internalFailure: .internalFailure
        case .server:
            switch status ?? 400 {
            case 409, 412: .conflict
            case 413: .tooLarge
            default: .invalidRequest
            }
        default: .invalidRequest
        }
    }

    /// A URL, credentials or option that cannot work; fix the command or config.
    public static func badEndpoint(_ why: String) -> CouchClientError {
        CouchClientError(.badEndpoint, message: why, isTransient: false)
    }
}
