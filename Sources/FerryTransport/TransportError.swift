import FerryCore
import FerrySync

/// Errors of identity, TLS and connection handling, each saying whether a retry may help.
public struct TransportError: FerryError, Equatable {
    public let domain = "transport"
    public let code: String
    public let message: String
    public let isTransient: Bool

    public init(code: String, message: String, isTransient: Bool) {
        self.code = code
        self.message = message
        self.isTransient = isTransient
    }

    public var description: String { message }

    public static func identity(_ why: String) -> TransportError {
        TransportError(code: "identity", message: why, isTransient: false)
    }
    /// The peer's certificate is not the pinned one (client) or not trusted (listener).
    public static func untrustedPeer(_ why: String) -> TransportError {
        TransportError(code: "untrusted_peer", message: why, isTransient: false)
    }
    /// The peer's listener refused this node's certificate: it does not trust this node
    /// (yet). Permanent for this attempt; continuous replications retry it promptly.
    public static func notTrustedByPeer(_ why: String) -> TransportError {
        TransportError(code: SyncError.notTrustedByPeerCode, message: why, isTransient: false)
    }
    public static func refused(_ why: String) -> TransportError {
        TransportError(code: "refused", message: why, isTransient: false)
    }
    public static func connectFailed(_ why: String) -> TransportError {
        TransportError(code: "connect_failed", message: why, isTransient: true)
    }
    public static func badURL(_ why: String) -> TransportError {
        TransportError(code: "bad_url", message: why, isTransient: false)
    }
}
