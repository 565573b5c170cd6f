import FerryCore
import Logging
import NIOCore

/// Admits a listener's TCP connections from the moment they are accepted (before TLS or any
/// HTTP), at most `total` at once and at most `perAddress` from one remote address; a
/// connection over either cap is closed at once, and what it closed is logged at most once
/// per `logWindow`, with counts, so a flood never floods the log too.
public final class ListenerGate: Sendable {
    /// The caps of one listener, counted from accept.
    public struct Limits: Sendable, Equatable {
        /// Connections open at once, whatever their state.
        public var total: Int
        /// Connections open at once from one remote IP address.
        public var perAddress: Int
        public init(total: Int, perAddress: Int) {
            self.total = max(1, total)
            self.perAddress = max(1, perAddress)
        }
    }

    /// What the gate decided for one accepted connection.
    public enum Admission: Sendable, Equatable {
        case admitted
        case overTotal
        case overAddress
    }

    /// What the gate has closed since it was made.
    public struct Closed: Sendable, Equatable {
        public var overTotal = 0
        public var overAddress = 0
        /// Admitted connections closed because their handshake did not finish in time.
        public var handshakeTimeouts = 0
        public var all: Int { overTotal + overAddress + handshakeTimeouts }
    }

    private struct State {
        var open = 0
        var byAddress: [String: Int] = [:]
        var closed = Closed()
        /// Closed since the last log line.
        var unreported = Closed()
        var lastReport: ContinuousClock.Instant?
    }

    /// Names the listener in log lines ("replication", "couch").
    public let name: String
    public let limits: Limits
    let logger: Logger
    let logWindow: Duration
    private let state = Locked(State())

    public init(name: String, limits: Limits, logger: Logger, logWindow: Duration = .seconds(60)) {
        self.name = name
        self.limits = limits
        self.logger = logger
        self.logWindow = logWindow
    }

    /// Connections admitted and not yet closed.
    public var openConnections: Int { state.withLock { $0.open } }
    /// Admitted connections from `address` not yet closed.
    public func openConnections(from address: String) -> Int { state.withLock { $0.byAddress[address] ?? 0 } }
    public var closed: Closed { state.withLock { $0.closed } }

    /// Counts one more connection from `address` if it fits under both caps.
    public func admit(address: String) -> Admission {
        let verdict = state.withLock { s -> Admission in
            if s.open >= limits.total { return .overTotal }
            if s.byAddress[address, default: 0] >= limits.perAddress { return .overAddress }
            s.open += 1
            s.byAddress[address, default: 0] += 1
            return .admitted
        }
        switch verdict {
        case .admitted: break
        case .overTotal: record(address: address) { $0.overTotal += 1 }
        case .overAddress: record(address: address) { $0.overAddress += 1 }
        }
        return verdict
    }

    /// Uncounts a connection that `admit(address:)` admitted.
    public func release(address: String) {
        state.withLock { s in
            s.open = max(0, s.open - 1)
            let left = (s.byAddress[address] ?? 1) - 1
            s.byAddress[address] = left > 0 ? left : nil
        }
    }

    /// Admits an accepted channel, or closes it at once and returns false; an admitted channel
    /// is released when it closes. Call it first thing in the child channel's initializer.
    public func admit(_ channel: any Channel) -> Bool {
        let address = channel.remoteAddress?.ipAddress ?? "local"
        guard admit(address: address) == .admitted else {
            channel.close(mode: .all, promise: nil)
            return false
        }
        channel.closeFuture.whenComplete { _ in self.release(address: address) }
        return true
    }

    /// Closes `channel` unless `handshake` completes (either way) within `timeout`: a client
    /// that opens a connection and then sends nothing, or trickles its handshake, holds its slot
    /// only that long.
    public func closeUnless<T: Sendable>(_ channel: any Channel, finishes handshake: EventLoopFuture<T>, within timeout: TimeAmount) {
        let address = channel.remoteAddress?.ipAddress ?? "local"
        let expiry = channel.eventLoop.scheduleTask(in: timeout) {
            self.record(address: address) { $0.handshakeTimeouts += 1 }
            channel.close(mode: .all, promise: nil)
        }
        handshake.whenComplete { _ in expiry.cancel() }
        channel.closeFuture.whenComplete { _ in expiry.cancel() }
    }

    /// Counts a closure, and logs the counts since the last line when a window has passed.
    private func record(address: String, _ count: (inout Closed) -> Void) {
        let now = ContinuousClock.now
        let report = state.withLock { s -> (Closed, Int)? in
            count(&s.closed)
            count(&s.unreported)
            if let last = s.lastReport, now - last < logWindow { return nil }
            s.lastReport = now
            defer { s.unreported = Closed() }
            return (s.unreported, s.open)
        }
        guard let (counts, open) = report else { return }
        logger.warning(
            "closing connections at the listener's limits",
            metadata: [
                "listener": "\(name)", "overTotal": "\(counts.overTotal)", "overPerAddress": "\(counts.overAddress)",
                "handshakeTimeouts": "\(counts.handshakeTimeouts)", "open": "\(open)", "maxTotal": "\(limits.total)",
                "maxPerAddress": "\(limits.perAddress)", "lastRemote": "\(address)",
                "window": "\(logWindow)",
            ])
    }
}
