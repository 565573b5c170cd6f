import FerryCore

/// A replication error: a domain, a typed code, a message, and whether retrying may help.
public struct SyncError: FerryError, Equatable {
    /// Which replication error this is. Callers branch on these cases; the wire and logs
    /// carry `name`.
    public enum Code: Hashable, Sendable {
        /// The connection closed or failed.
        case disconnected
        /// The peer sent something that does not follow the protocol.
        case protocolViolation
        case incompatibleVersion
        case forbidden
        case timeout
        /// The peer's listener refused this node's certificate (docs/protocol.md §2).
        case notTrustedByPeer
        case notFound
        case busy
        case unavailable
        case io
        case unknownRequest
        case badRequest
        case internalFailure
        /// The peer's link carried nothing for longer than liveness allows.
        case peerSilent
        /// A blob's content does not match its digest.
        case blobCorrupt
        case invalidBlobPolicy
        /// An error of another subsystem (its own error rides along as `cause`), or one a
        /// peer named that this side does not know: kept under its own name.
        case other(String)

        private static let names: [(Code, String)] = [
            (.disconnected, "disconnected"), (.protocolViolation, "protocol_error"), (.incompatibleVersion, "incompatible_version"),
            (.forbidden, "forbidden"), (.timeout, "timeout"), (.notTrustedByPeer, "not_trusted_by_peer"), (.notFound, "not_found"),
            (.busy, "busy"), (.unavailable, "unavailable"), (.io, "io"), (.unknownRequest, "unknown_request"),
            (.badRequest, "bad_request"), (.internalFailure, "internal"), (.peerSilent, "peer_silent"),
            (.blobCorrupt, "blob_corrupt"), (.invalidBlobPolicy, "invalid_blob_policy"),
        ]

        /// The code a name on the wire stands for.
        public init(name: String) {
            self = Self.names.first { $0.1 == name }?.0 ?? .other(name)
        }

        /// The stable name the wire and logs carry.
        public var name: String {
            if case .other(let name) = self { return name }
            return Self.names.first { $0.0 == self }!.1
        }
    }

    public let domain: String
    public let kind: Code
    public let message: String
    public let isTransient: Bool
    /// The error of another subsystem this one stands for, when it was raised on this side.
    public let cause: (any FerryError)?

    public init(domain: String = "sync", _ kind: Code, message: String, isTransient: Bool, cause: (any FerryError)? = nil) {
        self.domain = domain
        self.kind = kind
        self.message = message
        self.isTransient = isTransient
        self.cause = cause
    }

    public var code: String { kind.name }
    public var description: String { "\(domain)/\(code): \(message)" }

    public var failure: FailureKind {
        switch kind {
        case .forbidden, .notTrustedByPeer: .forbidden
        case .notFound: .notFound
        case .busy, .unavailable, .timeout, .disconnected, .peerSilent: .unavailable
        case .protocolViolation, .incompatibleVersion, .unknownRequest, .badRequest, .blobCorrupt, .invalidBlobPolicy: .invalidRequest
        case .io, .internalFailure: .internalFailure
        case .other: cause?.failure ?? .invalidRequest
        }
    }

    public static func == (a: SyncError, b: SyncError) -> Bool {
        a.domain == b.domain && a.kind == b.kind && a.message == b.message && a.isTransient == b.isTransient
    }

    /// The connection closed or failed; reconnecting may help.
    public static func disconnected(_ why: String) -> SyncError {
        SyncError(.disconnected, message: why, isTransient: true)
    }
    /// The peer sent something that does not follow the protocol.
    public static func protocolViolation(_ why: String) -> SyncError {
        SyncError(.protocolViolation, message: why, isTransient: false)
    }
    public static func incompatibleVersion(_ why: String) -> SyncError {
        SyncError(.incompatibleVersion, message: why, isTransient: false)
    }
    public static func forbidden(_ why: String) -> SyncError {
        SyncError(.forbidden, message: why, isTransient: false)
    }
    public static func timeout(_ why: String) -> SyncError {
        SyncError(.timeout, message: why, isTransient: true)
    }
    public static func notFound(_ why: String) -> SyncError {
        SyncError(.notFound, message: why, isTransient: false)
    }

    /// Whether the peer refused this node as not trusted. Permanent for one attempt, but the
    /// peer's operator may add this node's ID at any moment: a continuous replication keeps
    /// retrying it promptly, with a short capped backoff.
    public var isNotTrustedByPeer: Bool { kind == .notTrustedByPeer }

    /// Maps any error to a SyncError, keeping the domain, code, transience and (as `cause`)
    /// the error itself of Ferry errors.
    public static func from(_ error: any Error) -> SyncError {
        if let e = error as? SyncError { return e }
        if let e = error as? any FerryError {
            return SyncError(domain: e.domain, Code(name: e.code), message: e.description, isTransient: e.isTransient, cause: e)
        }
        if error is CancellationError { return .disconnected("cancelled") }
        return SyncError(.internalFailure, message: "\(error)", isTransient: false)
    }
}
