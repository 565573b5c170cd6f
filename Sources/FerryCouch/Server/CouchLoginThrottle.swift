import Foundation
import Logging
import Synchronization

/// Counts failed logins per client address and refuses further attempts from an address
/// past `maxFailures` within `window`; it logs a summary at most once per `logInterval`,
/// never a name's password.
public final class CouchLoginThrottle: Sendable {
    private struct State {
        var failures: [String: [Date]] = [:]
        var lastLog: Date?
        var unlogged = 0
        var unloggedAddresses: Set<String> = []
    }

    public let maxFailures: Int
    public let window: TimeInterval
    public let logInterval: TimeInterval
    private let state = Mutex(State())
    private let logger: Logger
    static let maxTrackedAddresses = 10_000

    public init(maxFailures: Int = 10, window: TimeInterval = 60, logInterval: TimeInterval = 60, logger: Logger) {
        self.maxFailures = maxFailures
        self.window = window
        self.logInterval = logInterval
        self.logger = logger
    }

    /// Whether `address` has failed `maxFailures` times within the window before `now`.
    public func isBlocked(_ address: String, now: Date) -> Bool {
        state.withLock { s in
            let recent = (s.failures[address] ?? []).filter { now.timeIntervalSince($0) < window }
            s.failures[address] = recent.isEmpty ? nil : recent
            return recent.count >= maxFailures
        }
    }

    /// Records a failed login from `address`.
    public func recordFailure(_ address: String, now: Date) {
        let summary = state.withLock { s -> (Int, Int)? in
            if s.failures.count >= Self.maxTrackedAddresses {
                s.failures = s.failures.filter { $0.value.contains { now.timeIntervalSince($0) < window } }
            }
            var list = (s.failures[address] ?? []).filter { now.timeIntervalSince($0) < window }
            list.append(now)
            s.failures[address] = list
            s.unlogged += 1
            s.unloggedAddresses.insert(address)
            if let last = s.lastLog, now.timeIntervalSince(last) < logInterval { return nil }
            let out = (s.unlogged, s.unloggedAddresses.count)
            s.lastLog = now
            s.unlogged = 0
            s.unloggedAddresses = []
            return out
        }
        if let (count, addresses) = summary {
            logger.warning(
                "failed CouchDB API logins",
                metadata: ["failures": "\(count)", "addresses": "\(addresses)", "latest": "\(address)"])
        }
    }
}
