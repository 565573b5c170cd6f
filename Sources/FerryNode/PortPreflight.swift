import FerryCore
import Foundation

/// A service that binds a TCP address the node's configuration fixed.
protocol BindingService {
    /// What it binds: where, on which port, and the flag (or setting) that chooses it; nil
    /// for an ephemeral port or a Unix socket, which cannot clash.
    var tcpAddress: PortPreflight.Address? { get }
}

extension StartupGuard {
    var tcpAddress: PortPreflight.Address? {
        switch role {
        case .listener(let h, let p): PortPreflight.Address(name: "port \(p)", host: h, port: p, flag: "--port")
        case .admin(let h, let p): PortPreflight.Address(name: "admin port \(p)", host: h, port: p, flag: "--admin-port")
        case .couch(let h, let p): PortPreflight.Address(name: "CouchDB API port \(p)", host: h, port: p, flag: "--couch-port")
        case .couchLAN(let h, let p): PortPreflight.Address(name: "CouchDB API LAN port \(p)", host: h, port: p, flag: "couch.lan.port")
        case .unixSocket: nil
        }
    }
}

/// Checks, before a node starts anything, that every fixed TCP port it needs is free, and
/// reports every clash in one error with the flags that avoid them (a second node on this
/// machine otherwise found its clashes one start at a time).
enum PortPreflight {
    struct Address: Sendable, Equatable {
        let name: String
        let host: String
        let port: Int
        let flag: String
    }

    /// Throws `startFailed` naming every address of `addresses` that is in use.
    static func check(_ addresses: [Address]) throws(NodeError) {
        let taken = addresses.filter { $0.port != 0 && isInUse(host: $0.host, port: $0.port) }
        guard !taken.isEmpty else { return }
        let names = taken.map(\.name).joined(separator: ", ")
        let flags = taken.map(\.flag)
        let fix: String
        if flags.contains("couch.lan.port") {
            let others = flags.filter { $0 != "couch.lan.port" }.map { "\($0) 0" }
            fix = "set another couch.lan.port in the config" + (others.isEmpty ? "" : ", and pass " + others.joined(separator: " "))
        } else {
            fix = "pass --ports auto for free ports, or " + flags.map { "\($0) 0" }.joined(separator: " ")
        }
        let verb = taken.count == 1 ? "is" : "are"
        throw .startFailed("\(names) \(verb) in use (another ferry serve? \(fix))")
    }

    /// Whether binding `host:port` fails because the address is in use (any other failure is
    /// left for the real bind to report with its own explanation).
    static func isInUse(host: String, port: Int) -> Bool {
        var hints = addrinfo()
        hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let info = list else { return false }
        defer { freeaddrinfo(list) }
        let fd = socket(info.pointee.ai_family, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        // As the listeners do: a port left in TIME_WAIT by an earlier run is not in use.
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        return bind(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) != 0 && errno == EADDRINUSE
    }
}
