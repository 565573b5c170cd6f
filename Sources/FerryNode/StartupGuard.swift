import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import FerryDiscovery
import Foundation
import Logging
import ServiceLifecycle

/// Runs a service of the node and turns its failure to start into a NodeError that says
/// what failed and how to fix it (a port in use, a missing permission, a bad address).
struct StartupGuard<Wrapped: Service>: Service, BindingService {
    /// What the wrapped service binds.
    enum Role: Sendable {
        case listener(String, Int)
        case admin(String, Int)
        case unixSocket(String)
        /// The CouchDB API's loopback and LAN listeners.
        case couch(String, Int)
        case couchLAN(String, Int)
    }

    let role: Role
    let service: Wrapped

    func run() async throws {
        do {
            try await service.run()
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            throw Self.explain(error, role: role)
        }
    }

    /// The user's view of a service failure; errors other than binding pass unchanged.
    static func explain(_ error: any Error, role: Role) -> any Error {
        let place: String
        let host: String?
        let flag: String
        switch role {
        case .listener(let h, let port): (place, host, flag) = ("port \(port)", h, "--port")
        case .admin(let h, let port): (place, host, flag) = ("admin port \(port)", h, "--admin-port")
        case .unixSocket(let path): (place, host, flag) = ("Unix socket \(path)", nil, "--unix")
        case .couch(let h, let port): (place, host, flag) = ("CouchDB API port \(port)", h, "--couch-port")
        case .couchLAN(let h, let port): (place, host, flag) = ("CouchDB API LAN port \(port)", h, "couch.lan.port")
        }
        let bind = error as? TransportError ?? TransportError.bindFailed(place, host: host, error: error)
        let fix: String
        switch bind.kind {
        case .addressInUse:
            fix = flag == "--unix" ? "another ferry serve? pass another --unix path"
                : flag == "couch.lan.port" ? "another ferry serve or a CouchDB? set another couch.lan.port in the config"
                : "another ferry serve? pass --ports auto for free ports, or \(flag) 0"
            return NodeError.startFailed("\(place) is in use (\(fix))")
        case .permissionDenied:
            fix = flag == "--unix" ? "pass a --unix path in a directory you may write"
                : flag == "couch.lan.port" ? "ports below 1024 need root: set a higher couch.lan.port"
                : "ports below 1024 need root: pass \(flag) 0 or a higher port"
            return NodeError.startFailed("\(bind.message) (\(fix))")
        case .addressNotAvailable, .badAddress:
            fix = flag == "--unix" ? "pass a shorter --unix path" : flag == "--port" ? "pass --interface 0.0.0.0"
                : flag == "couch.lan.port" ? "set couch.lan.interface to an address of this host or 0.0.0.0"
                : flag == "--couch-port" ? "the CouchDB API's own listener is on 127.0.0.1" : "the admin API needs 127.0.0.1 or ::1"
            return NodeError.startFailed("\(bind.message) (\(fix))")
        case .bindFailed:
            return NodeError.startFailed(bind.message)
        default:
            return error
        }
    }
}
