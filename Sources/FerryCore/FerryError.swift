/// What every Ferry error tells its caller: where it came from, which one it is, what kind
/// of failure it is to whoever asked, and whether trying again may help.
public protocol FerryError: Error, CustomStringConvertible, Sendable {
    /// The subsystem that raised the error, e.g. `"store"` or `"core"`.
    var domain: String { get }
    /// A stable, machine-readable name for the error, e.g. `"conflict"`: what clients and
    /// logs read. Code that branches on an error matches its cases, never this string.
    var code: String { get }
    /// What the failure is to whoever asked: every HTTP API answers its status.
    var failure: FailureKind { get }
    /// True when the same operation may succeed later without any change by the caller.
    var isTransient: Bool { get }
}

/// What a failure is to the one who asked, whichever subsystem raised it: the one
/// classification the admin API and the CouchDB API both turn into an HTTP status.
public enum FailureKind: Sendable, Equatable, CaseIterable {
    /// The request itself is wrong (malformed, invalid, unsupported): 400.
    case invalidRequest
    /// Who asked may not do this: 403.
    case forbidden
    /// What was asked for does not exist: 404.
    case notFound
    /// The request lost a race with another change (a stale revision, a name in use): 409.
    case conflict
    /// The request is larger than a limit allows: 413.
    case tooLarge
    /// Not possible now, possible later (busy, a peer that holds it unreachable): 503.
    case unavailable
    /// Too many attempts from the same side; wait before the next: 429.
    case rateLimited
    /// Another node this request needed failed or answered something unusable: 502.
    case peerFailed
    /// The node's own failure (I/O, a corrupt database): 500, and logged.
    case internalFailure

    /// The HTTP status of this kind of failure.
    public var httpStatus: Int {
        switch self {
        case .invalidRequest: 400
        case .forbidden: 403
        case .notFound: 404
        case .conflict: 409
        case .tooLarge: 413
        case .unavailable: 503
        case .rateLimited: 429
        case .peerFailed: 502
        case .internalFailure: 500
        }
    }
}
