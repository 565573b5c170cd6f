import Foundation
import Logging

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How the process's open-file limit is shared: a part is kept back for everything that is
/// not a listener's connection (the store and its blobs, outgoing links, the admin API,
/// DNS-SD, logs), and the rest is split among the listeners, so that a flood on one door
/// can take at most its share of descriptors and the admin API keeps answering.
public struct DescriptorBudget: Sendable, Equatable {
    /// The soft RLIMIT_NOFILE in force.
    public let limit: Int

    public init(limit: Int) { self.limit = max(0, limit) }

    /// The budget of this process as it is now.
    public static var current: DescriptorBudget {
        var r = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r) == 0 else { return DescriptorBudget(limit: 1024) }
        return DescriptorBudget(limit: r.rlim_cur == rlim_t.max ? Int(Int32.max) : Int(clamping: r.rlim_cur))
    }

    /// Raises the soft open-file limit to the hard one (any process may), so that the budget
    /// is as large as the administrator allows; returns the budget in force afterwards.
    @discardableResult
    public static func raiseSoftLimit(logger: Logger) -> DescriptorBudget {
        var r = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r) == 0 else { return current }
        // An unlimited hard limit (all ones) still has the kernel's nr_open ceiling; 1 Mi is Linux's default one.
        let target = r.rlim_max == rlim_t.max ? rlim_t(1 << 20) : r.rlim_max
        if r.rlim_cur < target {
            let before = r.rlim_cur
            r.rlim_cur = target
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &r) == 0 {
                logger.debug("raised the open-file limit", metadata: ["from": "\(before)", "to": "\(target)"])
            }
        }
        let budget = current
        if budget.limit < 1024 {
            logger.warning(
                "the open-file limit is low: listeners get few connections (set LimitNOFILE or ulimit -n)",
                metadata: ["limit": "\(budget.limit)"])
        }
        return budget
    }

    /// Descriptors never given to listener connections: a quarter of the limit and at least
    /// 256 (the store's files, a few hundred outgoing links, the admin API), but never more
    /// than half, so that a tiny limit still leaves listeners something.
    public var reserved: Int { min(max(256, limit / 4), limit / 2) }

    /// What all listener connections together may hold.
    public var forListeners: Int { max(0, limit - reserved) }

    /// The replication listener's cap on open connections: `configured`, lowered to half of
    /// `forListeners` (the CouchDB listeners share the other half).
    public func replicationTotal(configured: Int) -> Int { max(1, min(configured, forListeners / 2)) }

    /// One CouchDB listener's cap: `configured`, lowered to its part of the CouchDB half
    /// (`listeners` of them share it).
    public func couchTotal(configured: Int, listeners: Int) -> Int {
        max(1, min(configured, forListeners / 2 / max(1, listeners)))
    }
}
