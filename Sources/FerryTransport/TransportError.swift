import FerryCore
import FerrySync
import Foundation
import NIOCore

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

    /// A socket that could not be bound, named by its cause: `address_in_use`,
    /// `permission_denied`, `address_not_available`, `bad_address` or `bind_failed`.
    /// `place` is what was bound, e.g. "port 4985" or "Unix socket /run/ferry.sock".
    public static func bindFailed(_ place: String, host: String? = nil, error: any Error) -> TransportError {
        if let e = error as? TransportError { return e }
        let on = host.map { " on \($0)" } ?? ""
        if let io = error as? IOError {
            switch io.errnoCode {
            case EADDRINUSE: return TransportError(code: "address_in_use", message: "\(place) is in use", isTransient: false)
            case EACCES, EPERM:
                return TransportError(code: "permission_denied", message: "no permission to listen on \(place)\(on)", isTransient: false)
            case EADDRNOTAVAIL:
                return TransportError(
                    code: "address_not_available", message: "cannot listen on \(host ?? place): not an address of this machine",
                    isTransient: false)
            default:
                return TransportError(
                    code: "bind_failed", message: "cannot listen on \(place)\(on): \(String(cString: strerror(io.errnoCode)))",
                    isTransient: false)
            }
        }
        if error is SocketAddressError {
            return TransportError(code: "bad_address", message: "cannot listen on \(host ?? place): not a usable address", isTransient: false)
        }
        return TransportError(code: "bind_failed", message: "cannot listen on \(place)\(on): \(error)", isTransient: false)
    }
}
