import Foundation

/// Polls `condition` every `interval` until it holds or `timeout` seconds pass, and says
/// whether it held (it is tried once more at the deadline). Tests and the harness wait on
/// state this way, never on a fixed sleep. A cancelled wait ends at once, unheld.
public func eventually(
    _ timeout: Double = 60, every interval: Duration = .milliseconds(50), _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int(timeout * 1000))
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        do { try await Task.sleep(for: interval) } catch { return false }
    }
    return try await condition()
}

/// Polls like `eventually`, and throws a `HarnessError` naming `what` if it never holds.
public func waitUntil(
    _ what: String = "a condition", timeout: Double = 60, every interval: Duration = .milliseconds(50),
    _ condition: () async throws -> Bool
) async throws {
    guard try await eventually(timeout, every: interval, condition) else {
        throw HarnessError("timed out after \(timeout) s waiting for: \(what)")
    }
}

/// Yields until `condition` holds, for tests whose time is a manual clock: the first turns
/// only yield (what the manual clock's waiters need to move), then it checks every
/// millisecond, so a slow condition does not keep a thread of the cooperative pool spinning
/// (with two cores, two spinning tests stalled every other test of the process). A condition
/// that never holds fails after `timeout` seconds.
public func yieldUntil(_ what: String, timeout: Double = 120, _ condition: () -> Bool) async throws {
    for _ in 0..<1_000 {
        if condition() { return }
        await Task.yield()
    }
    let deadline = ContinuousClock.now + .milliseconds(Int(timeout * 1000))
    while ContinuousClock.now < deadline {
        if condition() { return }
        try await Task.sleep(for: .milliseconds(1))
    }
    if condition() { return }
    throw HarnessError("never happened: \(what)")
}
