import FerryCore
import IntegrationHarness
import Logging
import Testing

@testable import FerryNode

/// The scheduler lag probe: it wakes every interval of its clock and records how late each
/// wake came, warning once per stall. The manual clock stands for a blocked pool by moving
/// past a deadline in one step.
@Suite struct SchedulerLagProbeTests {
    @Test func aLateWakeIsRecordedInTheHistogramAndWarnedOncePerStall() async throws {
        let clock = ManualClock()
        let metrics = NodeMetrics()
        let log = CapturedLog()
        let probe = SchedulerLagProbe(clock: clock, histogram: metrics.schedulerLag, logger: log.logger)
        let running = Task { try await probe.run() }
        defer { running.cancel() }
        func wake(after d: Duration, wakes: Int) async throws {
            try await yieldUntil("the probe sleeps") { clock.pendingDeadlines.count == 1 }
            clock.advance(by: d)
            try await yieldUntil("the probe woke") { probe.snapshot.wakes == wakes }
        }
        try await wake(after: .milliseconds(100), wakes: 1)  // on time
        #expect(probe.snapshot.last == .zero && probe.snapshot.slowWakes == 0)
        try await wake(after: .milliseconds(800), wakes: 2)  // 700 ms late
        try await wake(after: .milliseconds(700), wakes: 3)  // 600 ms late, the same stall
        #expect(probe.snapshot.last == .milliseconds(600) && probe.snapshot.worst == .milliseconds(700))
        #expect(probe.snapshot.slowWakes == 2)
        #expect(log.all.filter { $0.level == .warning }.count == 1, "one warning for one stall: \(log.lines)")
        try await wake(after: .milliseconds(100), wakes: 4)  // recovered
        try await wake(after: .milliseconds(900), wakes: 5)  // a new stall
        #expect(log.all.filter { $0.level == .warning }.count == 2, "\(log.lines)")
        #expect(log.all.last?.metadata["lag_ms"] == "800")
        let text = metrics.registry.emitToString()
        #expect(text.contains("ferry_scheduler_lag_seconds_count 5"), "\(text)")
        #expect(text.contains(#"ferry_scheduler_lag_seconds_bucket{le="0.5"} 2"#), "\(text)")
        #expect(text.contains("# HELP ferry_scheduler_lag_seconds "))
    }
}
