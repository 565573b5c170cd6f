import FerryCore
import FerrySync
import Foundation
import NIOCore

/// Errors of identity, TLS and connection handling, each saying whether a retry may help.
public struct TransportError: FerryError, Equatable {
    /// Which transport error this is; callers branch on these cases.
    public enum Kind: String, Sendable, CaseIterable {
        case identity
        /// The peer's certificate is not the pinned one (client) or not trusted (listener).
        case untrustedPeer = "untrusted_peer"
        /// The peer's listener refused this node's certificate.
        case notTrustedByPeer = "not_trusted_by_peer"
        case refused
        case connectFailed = "connect_failed"
        case badURL = "bad_url"
        case addressInUse = "address_in_use"
        case permissionDenied = "permission_denied"
        case addressNotAvailable = "address_not_available"
        case badAddress = "bad_address"
        case bindFailed = "bind_failed"
    }

    public let domain = "transport"
    public let kind: Kind
    public let message: String
    public let isTransient: Bool

    public init(_ kind: Kind, message: String, isTransient: Bool) {
        self.kind = kind
        self.message = message
        self.isTransient = isTransient
    }

    public var code: String { kind.rawValue }
    public var description: String { message }

    public var failure: FailureKind {
        switch kind {
        case .untrustedPeer, .notTrustedByPeer, .refused: .forbidden
        case .connectFailed: .unavailable
        case .addressInUse: .conflict
        case .identity: .internalFailure
        case .badURL, .permissionDenied, .addressNotAvailable, .badAddress, .bindFailed: .invalidRequest
        }
    }

    public static func identity(_ why: String) -> TransportError {
        TransportError(.identity, message: why, isTransient: false)
    }
    /// The peer's certificate is not the pinned one (client) or not trusted (listener).
    public static func untrustedPeer(_ why: String) -> TransportError {
        TransportError(.untrustedPeer, message: why, isTransient: false)
    }
    /// The peer's listener refused this node's certificate: it does not trust this node
    /// (yet). Permanent for this attempt; continuous replications retry it promptly.
    public static func notTrustedByPeer(_ why: String) -> TransportError {
        TransportError(.notTrustedByPeer, message: why, isTransient: false)
    }
    public static func refused(_ why: String) -> TransportError {
        TransportError(.refused, message: why, isTransient: false)
    }
    public static func connectFailed(_ why: String) -> TransportError {
        TransportError(.connectFailed, message: why, isTransient: true)
    }
    public static func badURL(_ why: String) -> TransportError {
        TransportError(.badURL, message: why, isTransient: false)
    }

    /// A socket that could not be bound, named by its cause: `address_in_use`,
    /// `permission_denied`, `address_not_available`, `bad_address` or `bind_failed`.
    /// `place` is what was bound, e.g. "port 4985" or "Unix socket /run/ferry.sock".
    public static func bindFailed(_ place: String, host: String? = nil, error: any Error) -> TransportError {
        if let e = error as? TransportError { return e }
        let on = host.map { " on \($0)" } ?? ""
        if let io = error as? IOError {
            switch io.errnoCode {
            case EADDRINUSE: return TransportError(.addressInUse, message: "\(place) is in use", isTransient: false)
            case EACCES, EPERM:
                return TransportError(.permissionDenied, message: "no permission to listen on \(place)\(on)", isTransient: false)
            case EADDRNOTAVAIL:
                return TransportError(
                    .addressNotAvailable, message: "cannot listen on \(host ?? place): not an address of this machine",
                    isTransient: false)
            default:
                return TransportError(
                    .bindFailed, message: "cannot listen on \(place)\(on): \(String(cString: strerror(io.errnoCode)))",
                    isTransient: false)
            }
        }
        if error is SocketAddressError {
            return TransportError(.badAddress, message: "cannot listen on \(host ?? place): not a usable address", isTransient: false)
        }
        return TransportError(.bindFailed, message: "cannot listen on \(place)\(on): \(error)", isTransient: false)
    }
}
