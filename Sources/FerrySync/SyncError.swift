import FerryCore

/// A replication error: a domain, a stable code, a message, and whether retrying may help.
public struct SyncError: FerryError, Equatable {
    public let domain: String
    public let code: String
    public let message: String
    public let isTransient: Bool

    public init(domain: String = "sync", code: String, message: String, isTransient: Bool) {
        self.domain = domain
        self.code = code
        self.message = message
        self.isTransient = isTransient
    }

    public var description: String { "\(domain)/\(code): \(message)" }

    /// The connection closed or failed; reconnecting may help.
    public static func disconnected(_ why: String) -> SyncError {
        SyncError(code: "disconnected", message: why, isTransient: true)
    }
    /// The peer sent something that does not follow the protocol.
    public static func protocolViolation(_ why: String) -> SyncError {
        SyncError(code: "protocol_error", message: why, isTransient: false)
    }
    public static func incompatibleVersion(_ why: String) -> SyncError {
        SyncError(code: "incompatible_version", message: why, isTransient: false)
    }
    public static func forbidden(_ why: String) -> SyncError {
        SyncError(code: "forbidden", message: why, isTransient: false)
    }
    public static func timeout(_ why: String) -> SyncError {
        SyncError(code: "timeout", message: why, isTransient: true)
    }

    /// The code of a refusal because the peer does not trust this node (its listener
    /// refused this node's certificate). Permanent for one attempt, but the peer's operator
    /// may add this node's ID at any moment: a continuous replication keeps retrying it
    /// promptly, with a short capped backoff.
    public static let notTrustedByPeerCode = "not_trusted_by_peer"

    /// Whether the peer refused this node as not trusted.
    public var isNotTrustedByPeer: Bool { code == Self.notTrustedByPeerCode }

    /// Maps any error to a SyncError, keeping the domain, code and transience of Ferry errors.
    public static func from(_ error: any Error) -> SyncError {
        if let e = error as? SyncError { return e }
        if let e = error as? any FerryError {
            return SyncError(domain: e.domain, code: e.code, message: e.description, isTransient: e.isTransient)
        }
        if error is CancellationError { return .disconnected("cancelled") }
        return SyncError(code: "internal", message: "\(error)", isTransient: false)
    }
}
