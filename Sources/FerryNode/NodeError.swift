import FerryCore

/// Errors of node configuration and start-up.
public enum NodeError: FerryError, Equatable {
    case badConfiguration(String)
    case locked(String)
    /// The request contradicts what is configured (for example, removing a config-file entry).
    case conflict(String)
    /// A service could not start (a port in use, a socket it may not bind): what and how to fix it.
    case startFailed(String)
    /// The data directory was deleted or replaced while the node ran.
    case dataDirectoryGone(String)

    public var domain: String { "node" }
    public var code: String {
        switch self {
        case .badConfiguration: return "bad_configuration"
        case .locked: return "locked"
        case .conflict: return "conflict"
        case .startFailed: return "start_failed"
        case .dataDirectoryGone: return "data_directory_gone"
        }
    }
    public var failure: FailureKind {
        switch self {
        case .badConfiguration: .invalidRequest
        case .conflict: .conflict
        case .locked: .unavailable
        case .startFailed, .dataDirectoryGone: .internalFailure
        }
    }
    public var isTransient: Bool { false }
    public var description: String {
        switch self {
        case .badConfiguration(let why): return why
        case .locked(let why): return why
        case .conflict(let why): return why
        case .startFailed(let why): return why
        case .dataDirectoryGone(let why): return why
        }
    }
}
