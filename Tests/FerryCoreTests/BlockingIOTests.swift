import Dispatch
import Foundation
import Testing

@testable import FerryCore

@Suite struct BlockingIOTests {
    /// More blocking calls than the cooperative pool has threads, all blocked at once, while a
    /// task on the pool still runs and releases them: were they on the pool, it would stall
    /// and the test would hit its time limit.
    @Test func blockedWorkLeavesTheCooperativePoolRunning() async throws {
        let n = ProcessInfo.processInfo.activeProcessorCount + 2
        let gate = DispatchSemaphore(value: 0)
        let started = Locked(0)
        // Were the pool stalled, nothing on it could end the test (not even a time limit): a
        // plain thread then opens the gate after a minute and the test fails instead of hanging.
        let releasedByPool = DispatchSemaphore(value: 0)
        let watchdogFired = Locked(false)
        Thread.detachNewThread {
            if releasedByPool.wait(timeout: .now() + 60) == .timedOut {
                watchdogFired.withLock { $0 = true }
                for _ in 0..<n { gate.signal() }
            }
        }
        defer { #expect(!watchdogFired.withLock { $0 }, "the blocked calls held the cooperative pool") }
        try await withThrowingTaskGroup(of: Int.self) { group in
            for i in 0..<n {
                group.addTask {
                    try await BlockingIO.run {
                        started.withLock { $0 += 1 }
                        gate.wait()
                        return i
                    }
                }
            }
            while started.withLock({ $0 }) < n { await Task.yield() }
            releasedByPool.signal()
            for _ in 0..<n { gate.signal() }
            var done = Set<Int>()
            for try await i in group { done.insert(i) }
            #expect(done == Set(0..<n))
        }
    }

    @Test func aThrownErrorReachesTheCaller() async {
        struct Broken: Error {}
        await #expect(throws: Broken.self) { try await BlockingIO.run { throw Broken() } }
    }
}
