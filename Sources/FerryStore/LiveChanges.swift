import FerryCore

/// Wakes waiting change streams when a commit advances the sequence.
final class ChangeNotifier: Sendable {
    /// Last announced sequence and the waiting streams.
    private struct State {
        var sequence: UInt64 = 0
        /// The last sequence announced by a commit that made a revision here.
        var localSequence: UInt64 = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextToken = 0
    }
    private let state = Locked(State())

    /// The last announced sequence.
    var current: UInt64 { state.withLock { $0.sequence } }

    /// How many streams are waiting now.
    var waiterCount: Int { state.withLock { $0.waiters.count } }

    /// The last sequence announced as `local`.
    var localSequence: UInt64 { state.withLock { $0.localSequence } }

    /// Announces commits through `sequence`; `local` unless they only stored replicated
    /// revisions (commits by other processes, seen by polling, count as local).
    func advance(to sequence: UInt64, local: Bool = true) {
        let woken = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            guard sequence > s.sequence else { return [] }
            s.sequence = sequence
            if local { s.localSequence = sequence }
            let w = Array(s.waiters.values)
            s.waiters.removeAll()
            return w
        }
        for c in woken { c.resume() }
    }

    /// Returns once the sequence is past `sequence`, or the task is cancelled.
    func wait(past sequence: UInt64) async {
        let token = state.withLock { s -> Int in
            s.nextToken += 1
            return s.nextToken
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { s -> Bool in
                    if s.sequence > sequence || Task.isCancelled { return true }
                    s.waiters[token] = c
                    return false
                }
                if resumeNow { c.resume() }
            }
        } onCancel: {
            let c = state.withLock { $0.waiters.removeValue(forKey: token) }
            c?.resume()
        }
    }
}

/// Re-reads a store's last sequence every poll interval while anything waits with a poll,
/// so that commits by other processes wake the waiters: one loop per store, where a timer
/// and two tasks per wait used to cost every wake of a caught-up replication.
final class ForeignCommitPoller: Sendable {
    private struct State {
        var running = false
        var interval: Duration = .zero
        /// Set by each waiter that asks; lets the loop run one more round for a waiter
        /// that asked but is not registered with the notifier yet.
        var asked = false
    }
    private let state = Locked(State())

    /// Starts the loop unless it runs; a shorter interval applies from its next round.
    func keepPolling(_ store: DocumentStore, _ poll: LiveChanges.Poll) {
        let start = state.withLock { s -> Bool in
            s.asked = true
            if s.running {
                s.interval = Swift.min(s.interval, poll.interval)
                return false
            }
            s.running = true
            s.interval = poll.interval
            return true
        }
        guard start else { return }
        let clock = poll.clock
        // Unowned: the poll ends by itself once no feed waits and nobody asked again (`running`).
        Task {
            while true {
                try? await clock.sleep(for: self.state.withLock { $0.interval })
                if let last = try? store.lastSequence { store.notifier.advance(to: last) }
                let goOn = self.state.withLock { s -> Bool in
                    defer { s.asked = false }
                    if s.asked || store.notifier.waiterCount > 0 { return true }
                    s.running = false
                    return false
                }
                if !goOn { return }
            }
        }
    }
}

/// A gap-free async sequence of changes: the stored backlog page by page, then live
/// commits. It holds at most one page in memory.
///
/// Commits by this process wake it at once. Commits by other processes on the same
/// database are seen when `poll` is set: the stream re-reads the feed every `interval`
/// of the given clock while idle.
public struct LiveChanges: AsyncSequence, Sendable {
    public typealias Element = Change
    let store: DocumentStore
    let since: UInt64
    let pageSize: Int
    let poll: Poll?
    /// Only changes to documents whose IDs begin with one of these (nil: every change).
    var idPrefixes: [String]? = nil

    /// How often an idle stream re-reads the feed, on which clock.
    public struct Poll: Sendable {
        public let interval: Duration
        public let clock: any Clock<Duration>
        public init(interval: Duration, clock: any Clock<Duration> = ContinuousClock()) {
            self.interval = interval
            self.clock = clock
        }
    }

    public func makeAsyncIterator() -> Iterator {
        Iterator(store: store, cursor: since, pageSize: pageSize, poll: poll, idPrefixes: idPrefixes)
    }

    /// Pages through the feed, then waits for commits.
    public struct Iterator: AsyncIteratorProtocol {
        let store: DocumentStore
        var cursor: UInt64
        let pageSize: Int
        let poll: Poll?
        let idPrefixes: [String]?
        var buffer: [Change] = []
        var position = 0

        func idle(past sequence: UInt64) async { await store.idle(past: sequence, poll: poll) }

        /// The next change, or nil when the task is cancelled. Throws on store errors.
        public mutating func next() async throws -> Change? {
            while true {
                if position < buffer.count {
                    let c = buffer[position]
                    position += 1
                    cursor = c.sequence
                    return c
                }
                if Task.isCancelled { return nil }
                // Read the last sequence before the page so no commit slips between them.
                let last = try store.lastSequence
                store.notifier.advance(to: last)
                if let idPrefixes {
                    buffer = try store.changes(since: cursor, limit: pageSize, idPrefixes: idPrefixes)
                    // None of them past the cursor up to `last` (read before the page): the
                    // cursor moves past the other documents' changes.
                    if buffer.isEmpty { cursor = Swift.max(cursor, last) }
                } else {
                    buffer = try store.changes(since: cursor, limit: pageSize)
                }
                position = 0
                if buffer.isEmpty {
                    await idle(past: Swift.max(last, cursor))
                }
            }
        }
    }
}

extension DocumentStore {
    /// How many waits for a commit are pending on this store, for tests that must act
    /// only once something waits.
    package var commitWaiters: Int { notifier.waiterCount }

    /// The sequence of this process's latest commit that made a revision here (a put,
    /// delete or merge) rather than only storing replicated ones. Commits past it and up
    /// to `lastSequence` are relays of other nodes' changes.
    public var lastLocalCommit: UInt64 { notifier.localSequence }

    /// The sequence of the latest commit this process has announced (its own, or another
    /// process's once a poll found it), from memory: no read, so callers on a timing-critical
    /// path (heartbeats) may ask. 0 until the first commit after opening.
    public var lastAnnouncedSequence: UInt64 { notifier.current }

    /// Returns once a commit past `sequence` exists: at once if there is one, on this
    /// process's next commit, or, with `poll`, when a re-read of the feed finds one made by
    /// another process. Returns early when the task is cancelled.
    ///
    /// For waiters that read the feed themselves afterwards: unlike `liveChanges`, a wake
    /// by this process's commit costs no read at all.
    public func waitForCommit(past sequence: UInt64, poll: LiveChanges.Poll? = nil) async throws(StoreError) {
        while !Task.isCancelled {
            if notifier.current > sequence { return }
            let last = try lastSequence
            notifier.advance(to: last)
            if last > sequence { return }
            await idle(past: sequence, poll: poll)
        }
    }

    /// Waits for the notifier past `sequence`; with `poll`, the store's poller also
    /// announces commits made by other processes.
    func idle(past sequence: UInt64, poll: LiveChanges.Poll?) async {
        if let poll { poller.keepPolling(self, poll) }
        await notifier.wait(past: sequence)
    }
}
