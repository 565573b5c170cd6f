import FerryCore

/// The pages a replication has read whose revisions still wait for their blobs: a pull's
/// are fetched and stored, a push's sent, in page order, one page after another, beside
/// the pages that follow, so that no document waits behind another document's blob. The
/// checkpoint moves past a page only once everything before it is done (the coverage
/// invariant).
final class BlobBacklog<Position: Sendable> {
    private struct Entry {
        /// Where the checkpoint may go once this entry and every earlier one are done.
        let position: Position
        /// Fetches the page's blobs and stores its waiting revisions; nil when the page had
        /// none (it only waits for the pages before it).
        let task: Task<Void, any Error>?
        let finished: Locked<Bool>
    }
    private var entries: [Entry] = []
    /// Told each time a page's blob work ends.
    private let ended = Broadcaster<Void>()

    /// Pages whose blob work is queued or running, beyond which the pull waits for the oldest
    /// (what they hold stays in memory until stored).
    static var maxPages: Int { 8 }

    var isEmpty: Bool { entries.isEmpty }
    /// Entries with blob work not yet known to be done.
    var pending: Int { entries.filter { $0.task != nil && !$0.finished.withLock { $0 } }.count }

    /// Queues a page read through `position`: `work` (its blobs and revisions) runs once the
    /// work of every earlier page has ended, and nil work only keeps the page's place.
    func add(through position: Position, work: (@Sendable () async throws -> Void)?) {
        let finished = Locked(work == nil)
        guard let work else {
            entries.append(Entry(position: position, task: nil, finished: finished))
            return
        }
        let previous = entries.last(where: { $0.task != nil })?.task
        let ended = self.ended
        let task = Task {
            defer {
                finished.withLock { $0 = true }
                ended.send(())
            }
            // In order: a page's revisions are stored after those of the pages before it.
            try await previous?.value
            try await work()
        }
        entries.append(Entry(position: position, task: task, finished: finished))
    }

    /// Removes the finished pages at the front (all of them, waiting, when `wait`; else the
    /// oldest too when more than `maxPages` are pending) and returns the furthest position
    /// now stored, nil when none moved. A page whose work failed throws its error.
    func settle(wait: Bool) async throws -> Position? {
        var reached: Position?
        while let first = entries.first {
            let mustWait = wait || pending > Self.maxPages
            if let task = first.task {
                guard mustWait || first.finished.withLock({ $0 }) else { break }
                // The work runs in a task of its own: a stop of the pull must reach it.
                try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() }
            }
            reached = first.position
            entries.removeFirst()
        }
        return reached
    }

    /// A wait that returns once the blob work queued so far has ended, however it ended
    /// (`settle` then says how), or when cancelled; nil when none is running. A live push
    /// races it against new local changes.
    func workEnded() -> (@Sendable () async -> Void)? {
        let flags = entries.compactMap { $0.task == nil ? nil : $0.finished }
        // Subscribed before the flags are read: an end in between is not missed.
        let ends = ended.subscribe()
        guard flags.contains(where: { !$0.withLock { $0 } }) else { return nil }
        return {
            if flags.allSatisfy({ $0.withLock { $0 } }) { return }
            for await _ in ends where flags.allSatisfy({ $0.withLock { $0 } }) { return }
        }
    }

    /// Cancels the blob work of every page still queued (a stop or a failure: those pages
    /// were not checkpointed, so they are read again next time).
    func cancelAll() {
        for entry in entries { entry.task?.cancel() }
    }
}
