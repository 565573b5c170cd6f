import FerryCore
import Logging
import Prometheus
import ServiceLifecycle

/// Asks to wake every `interval` of its clock and records how late each wake comes: the
/// cooperative pool has one thread per core, so a blocking call on it (a file write, a
/// lock held across I/O) delays every task of the process, and shows here first. Each
/// wake's lag goes to the `ferry_scheduler_lag_seconds` histogram and to `snapshot` (for
/// `ferry status`); a lag past `warnAfter` is logged once, and again only after the lag
/// fell below a tenth of it.
public final class SchedulerLagProbe: Service, Sendable {
    /// What the probe saw: the last wake's lag, the worst, and how many wakes passed `warnAfter`.
    public struct Snapshot: Sendable, Equatable {
        public var last: Duration = .zero
        public var worst: Duration = .zero
        public var slowWakes = 0
        public var wakes = 0
    }

    let clock: any Clock<Duration>
    let interval: Duration
    let warnAfter: Duration
    let histogram: DurationHistogram?
    let logger: Logger
    private let state = Locked((snapshot: Snapshot(), warned: false))

    /// The histogram's buckets, in seconds: from a healthy pool's few milliseconds up to
    /// the stalls of seconds a blocked pool shows.
    static let buckets: [Duration] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5].map { .milliseconds(Int64($0 * 1000)) }

    public init(
        clock: any Clock<Duration>, interval: Duration = .milliseconds(100), warnAfter: Duration = .milliseconds(500),
        histogram: DurationHistogram? = nil, logger: Logger = Logger(label: "ferry.scheduler")
    ) {
        self.clock = clock
        self.interval = interval
        self.warnAfter = warnAfter
        self.histogram = histogram
        self.logger = logger
    }

    public var snapshot: Snapshot { state.withLock { $0.snapshot } }

    public func run() async throws {
        await cancelWhenGracefulShutdown { await self.probe(self.clock) }
    }

    private func probe<C: Clock<Duration>>(_ clock: C) async {
        while !Task.isCancelled {
            let deadline = clock.now.advanced(by: interval)
            do { try await clock.sleep(until: deadline, tolerance: nil) } catch { return }
            record(max(.zero, deadline.duration(to: clock.now)))
        }
    }

    /// Records one wake's lag.
    func record(_ lag: Duration) {
        histogram?.record(lag)
        let warn: Bool = state.withLock { s in
            s.snapshot.last = lag
            s.snapshot.worst = max(s.snapshot.worst, lag)
            s.snapshot.wakes += 1
            if lag >= warnAfter {
                s.snapshot.slowWakes += 1
                if !s.warned {
                    s.warned = true
                    return true
                }
            } else if lag < warnAfter / 10 {
                s.warned = false
            }
            return false
        }
        if warn {
            logger.warning(
                "the scheduler woke a task late: something blocks the cooperative pool",
                metadata: ["lag_ms": "\(lag.milliseconds)", "threshold_ms": "\(warnAfter.milliseconds)"])
        }
    }
}

extension Duration {
    /// Whole milliseconds, rounded down.
    var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }
}
