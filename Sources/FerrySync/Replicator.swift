import Crypto
import FerryCore
import FerryStore
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// The active side of replication: connects to a peer through a connector, then pulls
/// and/or pushes until caught up (one-shot) or stopped (continuous), retrying transient
/// failures with backoff. Reports status, document events and pending documents.
public final class Replicator: Sendable {
    /// Opens a new endpoint to the peer; called once per connection attempt.
    public typealias Connector = @Sendable () async throws -> any MessageEndpoint

    public let configuration: ReplicatorConfiguration
    let store: DocumentStore
    let connector: Connector
    let clock: any Clock<Duration>
    let logger: Logger
    private let state = Mutex(RunState())
    private let statusBroadcaster = Broadcaster<ReplicatorStatus>()
    private let eventBroadcaster = Broadcaster<DocumentEvent>()
    /// Totals of finished connections, and the connection up now (its traffic counts live).
    private let summaryState = LockedBox(SummaryState())
    /// Revisions pulled from or pushed to the current connection's peer: not pushed back.
    private let peerHeld = PeerHeldRevisions()

    /// Status and lifecycle of a replicator, behind the mutex.
    struct RunState {
        var status = ReplicatorStatus.initial
        var stopRequested = false
        var task: Task<Void, Never>?
        var remoteDatabase: String?
        /// How far the push loop of the current connection has pushed, ahead of a deferred local checkpoint.
        var pushedThrough: UInt64 = 0
        /// `retryNow()` was called; the next wait before an attempt ends at once.
        var retryRequested = false
    }

    public init(
        store: DocumentStore, connector: @escaping Connector, configuration: ReplicatorConfiguration = .init(),
        clock: any Clock<Duration> = ContinuousClock(), logger: Logger = Logger(label: "ferry.sync.replicator")
    ) {
        self.store = store
        self.connector = connector
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
    }

    // MARK: Observing

    public var status: ReplicatorStatus { state.withLock { $0.status } }
    /// Totals so far; the traffic of the connection up now is included as it happens.
    public var summary: ReplicationSummary { summaryState.read(\.current) }

    /// Every status change from now on; finishes when the replicator stops for good.
    public func statusChanges() -> AsyncStream<ReplicatorStatus> { statusBroadcaster.subscribe() }

    /// Every document pushed, pulled or refused from now on.
    public func documentEvents() -> AsyncStream<DocumentEvent> { eventBroadcaster.subscribe() }

    private func update(_ change: (inout ReplicatorStatus) -> Void) {
        let old = status
        let new = statusBox.modify { s -> ReplicatorStatus in
            change(&s)
            return s
        }
        state.withLock { $0.status = new }
        if old != new { statusBroadcaster.send(new) }
    }
    private let statusBox = LockedBox(ReplicatorStatus.initial)

    private func setActivity(_ activity: ReplicatorStatus.Activity, error: SyncError? = nil) {
        update {
            $0.activity = activity
            if activity != .idle && activity != .busy || error != nil { $0.error = error }
        }
    }

    /// Updates the summary and reports the difference to the metrics.
    private func count(_ change: (inout ReplicationSummary) -> Void) {
        let (old, new) = summaryState.modify { s -> (ReplicationSummary, ReplicationSummary) in
            let old = s.totals
            change(&s.totals)
            return (old, s.totals)
        }
        guard let m = configuration.metrics else { return }
        m.pushed(new.pushed - old.pushed)
        m.pulled(new.pulled - old.pulled)
        m.conflicts(new.conflicts - old.conflicts)
        m.deltas(sent: new.deltasSent - old.deltasSent, received: new.deltasReceived - old.deltasReceived)
    }

    // MARK: Running

    /// Runs until one-shot replication completes, `stop()` is called, a permanent error
    /// occurs, or the attempts run out. The final status says which.
    public func run() async {
        await withGracefulShutdownHandler {
            await self.runUntilDone()
        } onGracefulShutdown: {
            self.stop()
        }
    }

    private func runUntilDone() async {
        state.withLock {
            $0.stopRequested = false
            $0.retryRequested = false
        }
        var attempt = 0
        var refusals = 0
        while true {
            if stopRequested || Task.isCancelled { break }
            setActivity(.connecting)
            let progressBefore = summary.documentProgress
            do {
                try await connectAndReplicate()
                setActivity(.stopped)
                break
            } catch {
                let e = SyncError.from(error)
                if stopRequested || Task.isCancelled {
                    setActivity(.stopped)
                    break
                }
                configuration.metrics?.replicationError(transient: e.isTransient)
                let wait: Duration
                if e.isNotTrustedByPeer && configuration.continuous {
                    // Trust is set up on both sides by hand, one after the other: the peer
                    // may trust this node in a moment, and only a new attempt can tell.
                    refusals += 1
                    attempt = 0
                    if refusals == 1 {
                        logger.notice(
                            "the peer does not trust this node (yet); retrying until it does",
                            metadata: ["error": "\(LogText.escape(describing: e))"])
                    } else {
                        logger.debug("the peer still does not trust this node", metadata: ["attempt": "\(refusals)"])
                    }
                    wait = notTrustedBackoff(refusal: refusals)
                } else if !e.isTransient {
                    logger.error("replication stopped", metadata: ["error": "\(LogText.escape(describing: e))"])
                    setActivity(.stopped, error: e)
                    break
                } else {
                    refusals = 0
                    attempt = summary.documentProgress == progressBefore ? attempt + 1 : 1
                    if attempt >= configuration.effectiveMaxAttempts {
                        logger.error(
                            "replication gave up", metadata: ["error": "\(LogText.escape(describing: e))", "attempts": "\(attempt)"])
                        setActivity(.stopped, error: e)
                        break
                    }
                    logger.info(
                        "replication offline, will retry", metadata: ["error": "\(LogText.escape(describing: e))", "attempt": "\(attempt)"])
                    wait = backoff(attempt: attempt)
                }
                setActivity(.offline, error: e)
                switch await retryWait(wait) {
                case .stopped:
                    setActivity(.stopped)
                case .elapsed:
                    continue
                case .retryNow:
                    attempt = 0
                    refusals = 0
                    continue
                }
                break
            }
        }
        if status.activity != .stopped { setActivity(.stopped) }
        statusBroadcaster.finish()
        eventBroadcaster.finish()
    }

    /// How a wait before the next connection attempt ended.
    enum RetryWaitEnd { case elapsed, retryNow, stopped }

    /// Waits `wait` on the clock; `stop()` and `retryNow()` end the wait at once.
    private func retryWait(_ wait: Duration) async -> RetryWaitEnd {
        let clock = self.clock
        let retry = retrySignal.subscribe()
        if state.withLock({ s -> Bool in
            defer { s.retryRequested = false }
            return s.retryRequested
        }) { return .retryNow }
        do {
            let end = try await untilStopped { () async throws -> RetryWaitEnd in
                try await withThrowingTaskGroup(of: RetryWaitEnd.self) { group in
                    group.addTask {
                        try await clock.sleep(for: wait)
                        return .elapsed
                    }
                    group.addTask {
                        for await _ in retry { return .retryNow }
                        return .elapsed
                    }
                    let first = try await group.next() ?? .elapsed
                    group.cancelAll()
                    return first
                }
            }
            state.withLock { $0.retryRequested = false }
            return end ?? .stopped
        } catch {
            return .stopped
        }
    }

    /// Ends a wait before the next connection attempt now and starts counting attempts
    /// afresh (for example, because this node's trust in the peer just changed). Does
    /// nothing to a connection that is up.
    public func retryNow() {
        state.withLock { $0.retryRequested = true }
        retrySignal.send(())
    }

    private let retrySignal = Broadcaster<Void>()

    /// Starts `run()` in a task of its own.
    public func start() {
        let task = Task { await self.run() }
        state.withLock { $0.task = task }
    }

    /// Asks the replicator to stop; a batch being inserted finishes and its checkpoint is
    /// saved locally first.
    public func stop() {
        let task = state.withLock { s -> Task<Void, Never>? in
            s.stopRequested = true
            return s.task
        }
        task?.cancel()
        stopSignal.send(())
    }

    /// Waits until a task started with `start()` has finished.
    public func waitUntilStopped() async {
        let task = state.withLock { $0.task }
        await task?.value
    }

    private let stopSignal = Broadcaster<Void>()
    var stopRequested: Bool { state.withLock { $0.stopRequested } }

    func backoff(attempt: Int) -> Duration {
        Self.jitteredBackoff(attempt: attempt, first: configuration.initialAttemptWait, cap: configuration.maxAttemptWait)
    }

    /// The wait after the peer refused this node as not trusted, for the `refusal`-th time in a row.
    func notTrustedBackoff(refusal: Int) -> Duration {
        Self.jitteredBackoff(attempt: refusal, first: configuration.notTrustedRetryWait, cap: configuration.maxNotTrustedRetryWait)
    }

    static func jitteredBackoff(attempt: Int, first: Duration, cap: Duration) -> Duration {
        let base = first * Int(min(1 << min(max(attempt, 1) - 1, 30), 1 << 30))
        let capped = min(base, cap)
        // Jitter in [0.5, 1.0) so peers that failed together do not retry together.
        return capped * Double.random(in: 0.5..<1.0)
    }

    private func connectAndReplicate() async throws {
        let endpoint: any MessageEndpoint
        do {
            endpoint = try await connector()
        } catch {
            throw SyncError.from(error)
        }
        let connection = Connection(endpoint: endpoint, metrics: configuration.metrics)
        peerHeld.reset()
        summaryState.modify { $0.live = connection }
        // However the connection ends, its traffic moves from live into the totals at once.
        defer {
            summaryState.modify { s in
                let c = connection.counters.withLock { $0 }
                s.totals.bytesSent += c.bytesSent
                s.totals.bytesReceived += c.bytesReceived
                s.live = nil
            }
        }
        connection.start()
        do {
            try await replicate(over: connection)
            await connection.close()
        } catch {
            await connection.close(error: SyncError.from(error))
            throw error
        }
    }

    private func replicate(over connection: Connection) async throws {
        let hello = try await connection.requestJSON(
            SyncProtocol.Profile.hello,
            [
                "nodeID": .string(configuration.nodeID), "database": .string(store.uuid),
                "protocol": .array(SyncProtocol.versions.map { .int(Int64($0)) }),
                "features": .array(SyncProtocol.features.map { .string($0) }),
            ])
        guard let remoteDB = hello["database"]?.stringValue else {
            throw SyncError.protocolViolation("hello reply lacks database")
        }
        state.withLock { $0.remoteDatabase = remoteDB }
        let direction = configuration.direction
        if direction.pulls && hello["allowPull"] != .bool(true) {
            throw SyncError.forbidden("the peer does not allow pull")
        }
        if direction.pushes && hello["allowPush"] != .bool(true) {
            throw SyncError.forbidden("the peer is read-only: push is refused")
        }
        setActivity(.busy)
        var peerFeatures = Set<String>()
        if case .array(let f)? = hello["features"] { peerFeatures = Set(f.compactMap(\.stringValue)) }
        let inline = configuration.inlineLimit > 0 && peerFeatures.contains("inline")
        try await withThrowingTaskGroup(of: Void.self) { group in
            if direction.pulls { group.addTask { try await self.pullLoop(connection, remoteDB: remoteDB, inline: inline) } }
            if direction.pushes { group.addTask { try await self.pushLoop(connection, remoteDB: remoteDB, inline: inline) } }
            // Not waitForAll(): it waits for every child before rethrowing, so a pull that
            // fails on a dropped connection would wait for an idle push loop's next local
            // change. The first error ends the group, which cancels the other loop.
            while try await group.next() != nil {}
        }
    }

    // MARK: Checkpoints

    func checkpointKey(remoteDB: String, direction: String) -> String {
        let filter = direction == "pull" ? configuration.pullFilter?.name : configuration.pushFilter?.name
        let ids = configuration.documentIDs.map { $0.map(\.rawValue).sorted().joined(separator: "\u{0}") } ?? ""
        var h = SHA256()
        h.update(data: Array("\(store.uuid)\u{0}\(remoteDB)\u{0}\(direction)\u{0}\(filter ?? "")\u{0}\(ids)".utf8))
        return Hex.encode(h.finalize())
    }

    func localCheckpoint(_ key: String) throws -> UInt64? {
        try store.localDocument("checkpoint/\(key)")?["seq"]?.intValue.map { UInt64(max(0, $0)) }
    }

    /// Where to resume: the local checkpoint if the peer's copy agrees, else the lower of the two.
    func startCheckpoint(_ connection: Connection, key: String) async throws -> UInt64 {
        if configuration.resetCheckpoint { return 0 }
        let local = try localCheckpoint(key)
        let remote = try await connection.requestJSON(SyncProtocol.Profile.getCheckpoint, ["id": .string(key)])["value"]?[
            "seq"]?.intValue.map { UInt64(max(0, $0)) }
        guard let local else { return 0 }
        guard let remote else { return 0 }
        return min(local, remote)
    }

    /// Saves the local copy of a checkpoint, and the peer's copy when `remote` is true.
    /// A peer copy that lags only makes a restart re-read changes the local trees (pull) or
    /// the peer's revsDiff (push) then skip: nothing is transferred twice because of it.
    func saveCheckpoint(_ connection: Connection, key: String, seq: UInt64, remote: Bool = true) async throws {
        let value: JSON = ["seq": .int(Int64(seq))]
        try saveLocalCheckpoint(key: key, seq: seq)
        if remote {
            _ = try await connection.requestJSON(SyncProtocol.Profile.setCheckpoint, ["id": .string(key), "value": value])
        }
    }

    func saveLocalCheckpoint(key: String, seq: UInt64) throws {
        // Relaxed like the batch it covers: a power loss can only take both back together.
        try store.putLocalDocument("checkpoint/\(key)", body: ["seq": .int(Int64(seq))], durability: .normal)
    }

    /// Counts batches between writes of the peer's copy of a checkpoint.
    struct RemoteCheckpointPacer {
        let every: Int
        var batches = 0
        /// True when this batch should also write the peer's copy.
        mutating func due() -> Bool {
            batches += 1
            if batches >= every {
                batches = 0
                return true
            }
            return false
        }
    }

    /// Defers the peer's copy of a checkpoint once a continuous replication has caught up:
    /// it is written at most `delay` after the first batch it covers.
    struct RemoteCheckpointDeferral {
        let delay: Duration
        let stopwatch: @Sendable () -> @Sendable () -> Duration
        /// Time since the first batch the peer's copy does not cover; nil when none.
        var elapsed: (@Sendable () -> Duration)?

        init(delay: Duration, clock: any Clock<Duration>) {
            self.delay = delay
            stopwatch = Self.stopwatches(on: clock)
        }

        static func stopwatches<C: Clock<Duration>>(on clock: C) -> @Sendable () -> @Sendable () -> Duration {
            {
                let start = clock.now
                return { start.duration(to: clock.now) }
            }
        }

        mutating func batchSaved() { if elapsed == nil { elapsed = stopwatch() } }
        mutating func saved() { elapsed = nil }
        /// Time left before the write is due; nil when nothing waits.
        var remaining: Duration? { elapsed.map { delay - $0() } }
        /// True when a write waits and its time has come.
        var isDue: Bool { remaining.map { $0 <= .zero } ?? false }
    }

    // MARK: Pull

    private func pullLoop(_ connection: Connection, remoteDB: String, inline: Bool) async throws {
        let key = checkpointKey(remoteDB: remoteDB, direction: "pull")
        var since = try await startCheckpoint(connection, key: key)
        var caughtUp = false
        var pacer = RemoteCheckpointPacer(every: configuration.remoteCheckpointEvery)
        var deferral = RemoteCheckpointDeferral(delay: configuration.remoteCheckpointDelay, clock: clock)
        var remoteSaved = since
        var localSaved = since
        var prefetched: (since: UInt64, task: Task<JSON, any Error>)?
        var planned: (since: UInt64, task: Task<PlannedBatch?, any Error>)?
        defer {
            prefetched?.task.cancel()
            if let planned { Self.discard(planned.task) }
            // However the loop ends, the local copy covers what was stored (no network needed).
            if localSaved < since { try? saveLocalCheckpoint(key: key, seq: since) }
        }
        while true {
            if stopRequested { return }
            try Task.checkCancellation()
            if remoteSaved < since && deferral.isDue {
                try await saveCheckpoint(connection, key: key, seq: since)
                remoteSaved = since
                localSaved = since
                deferral.saved()
            }
            let live = configuration.continuous && caughtUp
            var wait = configuration.heartbeat
            // A deferred checkpoint write must not wait a whole heartbeat.
            if live && remoteSaved < since, let remaining = deferral.remaining { wait = min(wait, max(remaining, .milliseconds(1))) }
            var request: [String: JSON] = [
                "since": .int(Int64(since)), "limit": .int(Int64(configuration.batchSize)), "live": .bool(live),
                "timeoutMs": .int(Int64(wait.components.seconds * 1000 + wait.components.attoseconds / 1_000_000_000_000_000)),
            ]
            if live && inline {
                request["inline"] = .int(Int64(configuration.inlineLimit))
                if !configuration.deltas { request["noDeltas"] = true }
            }
            if let ids = configuration.documentIDs { request["docIDs"] = .array(ids.map { .string($0.rawValue) }) }
            let body = JSON.object(request)
            let ask: @Sendable () async throws -> JSON = {
                try await connection.requestJSON(SyncProtocol.Profile.changes, body)
            }
            // A live request may wait a whole heartbeat; a stop must not.
            let reply: JSON
            if let prefetched, prefetched.since == since {
                reply = try await prefetched.task.value
            } else if let r = live ? try await untilStopped(ask) : try await ask() {
                reply = r
            } else {
                return
            }
            prefetched = nil
            let (entries, lastSeq) = try Self.changesPage(reply)
            if entries.isEmpty {
                if lastSeq > since {
                    // Only documents left out changed (hidden from this peer, or revisions
                    // it sent itself): nothing to store, but the feed moved on. Once live,
                    // both copies wait for the deferred write: in a mesh this happens on
                    // every link for every write, and a lag only means a re-read on restart.
                    since = lastSeq
                    if !live {
                        try saveLocalCheckpoint(key: key, seq: since)
                        localSaved = since
                    }
                    deferral.batchSaved()
                }
                if remoteSaved < since && (!live || deferral.isDue) {
                    try await saveCheckpoint(connection, key: key, seq: since)
                    remoteSaved = since
                    localSaved = since
                    deferral.saved()
                }
                if !configuration.continuous { return }
                caughtUp = true
                markIdleIfCaughtUp()
                continue
            }
            update {
                $0.activity = .busy
                $0.total += entries.count
            }
            // A continuous replication whose page ended the peer's feed goes live next;
            // otherwise the peer already reads the next page while this batch is inserted.
            let endsFeed = configuration.continuous && reply["caughtUp"] == .bool(true)
            if !endsFeed {
                var nextRequest = request
                nextRequest["since"] = .int(Int64(lastSeq))
                nextRequest["live"] = false
                nextRequest["inline"] = nil
                let nextBody = JSON.object(nextRequest)
                prefetched = (lastSeq, Task { try await connection.requestJSON(SyncProtocol.Profile.changes, nextBody) })
            }
            let plan: PlannedBatch
            if let p = planned, p.since == since, let ready = try await p.task.value {
                plan = ready
            } else {
                if let planned { Self.discard(planned.task) }
                plan = try planBatch(entries, since: since, connection)
            }
            planned = nil
            try await pullBatch(plan, connection) {
                // The next page was asked for when this one arrived: plan it beside this page's
                // last chunk (never on the insert path), so that the peer prepares its first
                // chunks while that one is inserted.
                guard let next = prefetched, next.since == lastSeq, !stopRequested else { return }
                let page = next.task
                planned = (lastSeq, Task {
                    let (nextEntries, _) = try Self.changesPage(try await page.value)
                    return nextEntries.isEmpty ? nil : try self.planBatch(nextEntries, since: lastSeq, connection)
                })
            }
            since = lastSeq
            if caughtUp {
                try saveLocalCheckpoint(key: key, seq: since)
                localSaved = since
                deferral.batchSaved()
            } else {
                let remote = pacer.due() || endsFeed
                try await saveCheckpoint(connection, key: key, seq: since, remote: remote)
                localSaved = since
                if remote { remoteSaved = since }
                caughtUp = endsFeed
            }
            update { $0.completed += entries.count }
            markIdleIfCaughtUp()
        }
    }

    /// Drops a page planned ahead but not used: stops the planning, and the requests a
    /// finished plan already has in flight.
    private static func discard(_ planning: Task<PlannedBatch?, any Error>) {
        planning.cancel()
        Task { if case let plan?? = try? await planning.value { plan.cancel() } }
    }

    /// The entries and last sequence of a `changes` reply.
    private static func changesPage(_ reply: JSON) throws(SyncError) -> (entries: [JSON], lastSeq: UInt64) {
        guard case .array(let entries)? = reply["changes"], let last = reply["lastSeq"]?.intValue else {
            throw .protocolViolation("changes reply is malformed")
        }
        return (entries, UInt64(max(0, last)))
    }

    /// Runs `operation`, or returns nil as soon as a stop is requested.
    private func untilStopped<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T) async throws -> T? {
        let stop = stopSignal.subscribe()
        if stopRequested { return nil }
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await operation() }
            group.addTask {
                for await _ in stop { return nil }
                return nil
            }
            let first = try await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    private func markIdleIfCaughtUp() {
        update {
            if $0.completed >= $0.total && configuration.continuous { $0.activity = .idle }
        }
    }

    /// One page of the peer's changes feed turned into requests, with its first `getRevs`
    /// already asked, so that the peer prepares it while the previous page is inserted.
    private struct PlannedBatch {
        /// The `since` of the page this plans.
        let since: UInt64
        let trees: [DocumentID: RevisionTree]
        let pipeline: IncomingPipeline
        /// Revisions that came inline in the changes reply.
        let inlined: [WireRevision]
        /// `getRevs` requests of at most `maxRevisionsPerRequest` revisions each.
        let chunks: [[JSON]]
        /// `chunks[0]` asked for and judged as it arrives.
        var firstChecked: Task<CheckedChunk, any Error>?
        /// The reply to `chunks[1]`, asked when planned.
        var secondFetched: Task<Message, any Error>?

        func cancel() {
            firstChecked?.cancel()
            secondFetched?.cancel()
        }
    }

    /// Reads the trees of a page's documents and asks for the first chunk of what is missing.
    /// Planned before the previous page is fully inserted, a tree may miss a revision of that
    /// page: the request then names fewer ancestors, which costs bytes, never correctness.
    private func planBatch(_ entries: [JSON], since: UInt64, _ connection: Connection) throws -> PlannedBatch {
        var parsed: [(DocumentID, [RevisionID], inline: JSON?)] = []
        for e in entries {
            guard case .array(let f) = e, f.count >= 3, let idText = f[1].stringValue,
                let id = try? DocumentID(idText, allowReserved: true), case .array(let revs) = f[2]
            else { throw SyncError.protocolViolation("changes entry is malformed") }
            let leaves = revs.compactMap { $0.stringValue.flatMap { try? RevisionID($0) } }
            if let ids = configuration.documentIDs, !ids.contains(id) { continue }
            parsed.append((id, leaves, f.count >= 6 ? f[5] : nil))
        }
        let trees = try store.revisionTrees(parsed.map(\.0))
        var requests: [JSON] = []
        var inlined: [WireRevision] = []
        for (id, leaves, inline) in parsed {
            let tree = trees[id]
            for rev in leaves where !(tree?.contains(rev) ?? false) {
                // Carried in the changes reply: judged below like any fetched revision.
                if let inline, leaves.count == 1, let wire = WireRevision(inline: inline, id: id.rawValue, rev: rev.description) {
                    inlined.append(wire)
                    continue
                }
                var known: [JSON] = []
                if let tree {
                    let w = tree.winnerIndex
                    known = tree.revisions.enumerated()
                        .filter { ($0.element.body != nil || $0.offset == w) && $0.element.id.generation < rev.generation }
                        .map(\.element.id).sorted(by: >).prefix(10).map { .string($0.description) }
                }
                requests.append(["id": .string(id.rawValue), "rev": .string(rev.description), "ancestors": .array(known)])
            }
        }
        let size = configuration.maxRevisionsPerRequest
        let chunks = stride(from: 0, to: requests.count, by: size).map { Array(requests[$0..<min($0 + size, requests.count)]) }
        let pipeline = IncomingPipeline(
            policy: configuration.remotePolicy, filter: configuration.pullFilter,
            maxBodyBytes: store.options.maxBodyBytes)
        var plan = PlannedBatch(since: since, trees: trees, pipeline: pipeline, inlined: inlined, chunks: chunks)
        if let first = chunks.first {
            plan.firstChecked = checkedChunk(fetchRevs(first, connection, deltas: configuration.deltas), plan)
        }
        if chunks.count > 1 { plan.secondFetched = fetchRevs(chunks[1], connection, deltas: configuration.deltas) }
        return plan
    }

    /// A chunk judged as soon as its reply arrives.
    private func checkedChunk(_ reply: Task<Message, any Error>, _ plan: PlannedBatch) -> Task<CheckedChunk, any Error> {
        let (pipeline, trees, deltas) = (plan.pipeline, plan.trees, configuration.deltas)
        return Task {
            let message = try await withTaskCancellationHandler { try await reply.value } onCancel: { reply.cancel() }
            return Self.check(try WireRevision.decodeBatch(message.body), pipeline: pipeline, trees: trees, deltas: deltas)
        }
    }

    /// Fetches, checks and inserts a planned page. `beforeLastChunk` runs once the last
    /// chunk is asked for (the caller plans the next page there, so the peer never idles).
    private func pullBatch(
        _ plan: PlannedBatch, _ connection: Connection, beforeLastChunk: () async throws -> Void
    ) async throws {
        // Three stages overlap: the peer prepares chunk i+2, chunk i+1 is received and judged,
        // and chunk i is inserted.
        var checking = plan.firstChecked
        var fetching = plan.secondFetched
        defer {
            checking?.cancel()
            fetching?.cancel()
        }
        if !plan.inlined.isEmpty {
            try await pullChunk(plan.inlined, connection, pipeline: plan.pipeline, trees: plan.trees, deltas: configuration.deltas)
        }
        let chunks = plan.chunks
        guard !chunks.isEmpty else { return }
        // The plan asked for the first two chunks.
        if chunks.count <= 2 { try await beforeLastChunk() }
        for i in chunks.indices {
            guard let judged = checking else { break }
            let checked = try await judged.value
            checking = nil
            if let reply = fetching {
                checking = checkedChunk(reply, plan)
                fetching = i + 2 < chunks.count ? fetchRevs(chunks[i + 2], connection, deltas: configuration.deltas) : nil
                if i + 3 == chunks.count { try await beforeLastChunk() }
            }
            try await storeChunk(checked, connection, pipeline: plan.pipeline)
        }
    }

    private func fetchRevs(_ chunk: [JSON], _ connection: Connection, deltas: Bool) -> Task<Message, any Error> {
        let request: JSON = ["revs": .array(chunk), "deltas": .bool(deltas), "maxHistory": .int(Int64(configuration.maxHistory))]
        return Task { try await connection.request(SyncProtocol.Profile.getRevs, body: request.canonicalBytes) }
    }

    /// The trust boundary's verdicts on one chunk, reached apart from storing it.
    private struct CheckedChunk: Sendable {
        var accepted: [IncomingRevision] = []
        var rejected: [(id: String, rev: String, deleted: Bool, reason: String)] = []
        /// Deltas that could not be applied, to be fetched again in full.
        var retryFull: [JSON] = []
        var deltas = 0
    }

    /// Judges each revision of a chunk. It touches neither the store nor the network, so
    /// the next chunk is judged while this one is inserted.
    private static func check(
        _ revs: [WireRevision], pipeline: IncomingPipeline, trees: [DocumentID: RevisionTree], deltas: Bool
    ) -> CheckedChunk {
        var checked = CheckedChunk()
        for wire in revs {
            if wire.missing { continue }  // superseded; a later change brings the new leaf
            if wire.isDelta { checked.deltas += 1 }
            let outcome = pipeline.check(wire) { id, base in
                trees[id]?.revision(base)?.body.flatMap { try? JSON.parse($0).objectValue }
            }
            switch outcome {
            case .accepted(let rev): checked.accepted.append(rev)
            case .rejected(let id, let rev, let rejection):
                checked.rejected.append((id, rev, wire.deleted, rejection.description))
            case .needFull(let id, let rev):
                if deltas {
                    checked.retryFull.append(["id": .string(id), "rev": .string(rev), "ancestors": .array([])])
                } else {
                    checked.rejected.append((id, rev, wire.deleted, "structure: body could not be reconstructed"))
                }
            }
        }
        return checked
    }

    private func pullChunk(
        _ revs: [WireRevision], _ connection: Connection, pipeline: IncomingPipeline, trees: [DocumentID: RevisionTree],
        deltas: Bool
    ) async throws {
        try await storeChunk(Self.check(revs, pipeline: pipeline, trees: trees, deltas: deltas), connection, pipeline: pipeline)
    }

    /// Stores what a chunk's check accepted, reports what it refused, and fetches in full
    /// what arrived as an unusable delta.
    private func storeChunk(_ checked: CheckedChunk, _ connection: Connection, pipeline: IncomingPipeline) async throws {
        if checked.deltas > 0 { count { $0.deltasReceived += checked.deltas } }
        for r in checked.rejected { reject(.pull, id: r.id, rev: r.rev, deleted: r.deleted, r.reason) }
        let accepted = checked.accepted
        let retryFull = checked.retryFull
        try await fetchMissingBlobs(for: accepted, connection)
        // A bulk chunk is inserted on the database's thread, so that judging the next chunk
        // keeps a cooperative thread; a live change or two is inserted in place, where two
        // thread hand-offs would cost more than the insert (the first-peer latency, P2).
        let outcomes =
            accepted.count >= configuration.suspendingInsertThreshold
            ? try await store.insertRevisionsSuspending(accepted, durability: .normal)
            : try store.insertRevisions(accepted, durability: .normal)
        var touched = Set<DocumentID>()
        // Counted once per chunk (each count takes a lock and feeds the metrics), before the events.
        let pulled = outcomes.reduce(0) { n, o in if case .inserted = o { n + 1 } else { n } }
        count { $0.pulled += pulled }
        for (rev, outcome) in zip(accepted, outcomes) {
            // Only a replicator that also pushes could offer it back.
            if configuration.direction.pushes {
                if case .rejected = outcome {} else { peerHeld.record(rev.id, rev.revision) }
            }
            switch outcome {
            case .inserted(_, let branched):
                // A document left with one leaf has nothing to resolve (nor to count as a conflict).
                if branched { touched.insert(rev.id) }
                eventBroadcaster.send(
                    DocumentEvent(direction: .pull, id: rev.id.rawValue, revision: rev.revision.description, deleted: rev.deleted, rejection: nil))
            case .alreadyPresent: configuration.metrics?.duplicates(1)
            case .rejected(let e):
                let stage = e.code == "rejected" ? "validation" : "structure"
                reject(.pull, id: rev.id.rawValue, rev: rev.revision.description, deleted: rev.deleted, "\(stage): \(e.description)")
            }
        }
        try resolveConflicts(in: touched)
        if !retryFull.isEmpty {
            let fresh = try store.revisionTrees(retryFull.compactMap { $0["id"]?.stringValue.flatMap { try? DocumentID($0, allowReserved: true) } })
            let full = try await fetchRevs(retryFull, connection, deltas: false).value
            try await pullChunk(try WireRevision.decodeBatch(full.body), connection, pipeline: pipeline, trees: fresh, deltas: false)
        }
    }

    private func reject(_ direction: DocumentEvent.Direction, id: String, rev: String, deleted: Bool, _ reason: String) {
        count { $0.rejected += 1 }
        let stage = reason.prefix { $0 != ":" }
        configuration.metrics?.rejected(stage: stage.isEmpty ? "other" : String(stage), direction: direction.rawValue)
        logger.warning(
            "revision rejected",
            metadata: [
                "direction": "\(direction.rawValue)", "id": "\(LogText.escape(id))", "rev": "\(LogText.escape(rev))",
                "reason": "\(LogText.escape(reason))",
            ])
        eventBroadcaster.send(DocumentEvent(direction: direction, id: id, revision: rev, deleted: deleted, rejection: reason))
    }

    private func fetchMissingBlobs(for revisions: [IncomingRevision], _ connection: Connection) async throws {
        var needed = Set<BlobDigest>()
        for rev in revisions {
            if let bytes = rev.canonicalBody, !DocumentStore.mayReferenceBlobs(bytes) { continue }
            for ref in (try? rev.body.blobReferences()) ?? [] where !store.blobs.has(ref.digest) { needed.insert(ref.digest) }
        }
        for digest in needed.sorted() {
            let reply = try await connection.request(SyncProtocol.Profile.getBlob, properties: [("Digest", digest.description)])
            guard BlobDigest.of(reply.body) == digest else {
                throw SyncError.protocolViolation("blob \(digest) arrived with content that does not match its digest")
            }
            try store.blobs.put(reply.body)
            count { $0.blobsReceived += 1 }
        }
    }

    /// Runs the configured resolvers on documents that pulled revisions put in conflict.
    func resolveConflicts(in ids: Set<DocumentID>) throws {
        let (conflicts, written) = try store.resolveConflicts(in: ids, using: configuration.resolvers, logger: logger)
        count {
            $0.conflicts += conflicts
            $0.resolved += written
        }
    }

    // MARK: Push

    private func pushLoop(_ connection: Connection, remoteDB: String, inline: Bool) async throws {
        let key = checkpointKey(remoteDB: remoteDB, direction: "push")
        var since = try await startCheckpoint(connection, key: key)
        var caughtUp = false
        var pacer = RemoteCheckpointPacer(every: configuration.remoteCheckpointEvery)
        var deferral = RemoteCheckpointDeferral(delay: configuration.remoteCheckpointDelay, clock: clock)
        var remoteSaved = since
        var localSaved = since
        state.withLock { $0.pushedThrough = since }
        // However the loop ends, the local copy covers what the peer acknowledged.
        defer { if localSaved < since { try? saveLocalCheckpoint(key: key, seq: since) } }
        while true {
            if stopRequested { return }
            // Cancelled when the pull side failed: end here (an idle wait returns at once
            // once cancelled, so the loop must not go round again).
            try Task.checkCancellation()
            // Once caught up, the page's trees come with it: the inline push needs them.
            var trees: [DocumentID: RevisionTree]?
            let page: [(Change, [RevisionID])]
            if inline && caughtUp {
                let withTrees = try store.changesWithTrees(since: since, limit: configuration.batchSize)
                page = withTrees.map { ($0.0, $0.1.leaves.map(\.id)) }
                trees = Dictionary(withTrees.map { ($0.0.id, $0.1) }, uniquingKeysWith: { $1 })
            } else {
                page = try store.changesWithLeaves(since: since, limit: configuration.batchSize)
            }
            guard let last = page.last else {
                if remoteSaved < since {
                    if caughtUp, let remaining = deferral.remaining, remaining > .zero {
                        markIdleIfCaughtUp()
                        try await waitForLocalChange(after: since, atMost: remaining)
                        continue
                    }
                    try await saveCheckpoint(connection, key: key, seq: since)
                    remoteSaved = since
                    localSaved = since
                    deferral.saved()
                }
                if !configuration.continuous { return }
                caughtUp = true
                markIdleIfCaughtUp()
                try await waitForLocalChange(after: since)
                continue
            }
            update {
                $0.activity = .busy
                $0.total += page.count
            }
            try await pushBatch(page, connection, inline: inline && caughtUp, trees: trees)
            since = last.0.sequence
            let pushed = since
            state.withLock { $0.pushedThrough = pushed }
            if caughtUp {
                // Both copies wait for the deferred write: a lag only re-reads changes
                // that revsDiff then skips.
                deferral.batchSaved()
            } else {
                let remote = pacer.due()
                try await saveCheckpoint(connection, key: key, seq: since, remote: remote)
                localSaved = since
                if remote { remoteSaved = since }
            }
            update { $0.completed += page.count }
            markIdleIfCaughtUp()
        }
    }

    /// Returns after a local commit past `since`, a stop, or `atMost` of the clock.
    private func waitForLocalChange(after since: UInt64, atMost limit: Duration? = nil) async throws {
        let store = self.store
        let clock = self.clock
        let stop = stopSignal.subscribe()
        let poll = LiveChanges.Poll(interval: configuration.localPollInterval, clock: clock)
        let relayDelay = configuration.relayDelay
        if stopRequested { return }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await store.waitForChangeToPassOn(past: since, poll: poll, relayDelay: relayDelay)
            }
            group.addTask { for await _ in stop { return } }
            if let limit { group.addTask { try await clock.sleep(for: limit) } }
            try await group.next()
            group.cancelAll()
        }
    }

    private func pushBatch(
        _ page: [(Change, [RevisionID])], _ connection: Connection, inline: Bool, trees known: [DocumentID: RevisionTree]? = nil
    ) async throws {
        var page = page.filter { !peerHeld.peerHolds($0.0.id, leaves: $0.1) }
        if let ids = configuration.documentIDs { page = page.filter { ids.contains($0.0.id) } }
        if inline { page = try await pushInline(page, connection, trees: known) }
        var docs: [String: JSON] = [:]
        for (change, leaves) in page {
            docs[change.id.rawValue] = .array(leaves.map { .string($0.description) })
        }
        guard !docs.isEmpty else { return }
        let diff = try await connection.requestJSON(SyncProtocol.Profile.revsDiff, ["docs": .object(docs)])
        guard let answer = diff.objectValue else { throw SyncError.protocolViolation("revsDiff reply is malformed") }
        let ids = answer.keys.compactMap { try? DocumentID($0, allowReserved: true) }
        let trees = try store.revisionTrees(ids)
        var wires: [(WireRevision, Bool)] = []
        for id in ids.sorted() {
            guard let tree = trees[id], let entry = answer[id.rawValue] else { continue }
            guard case .array(let missing)? = entry["missing"] else { continue }
            var ancestors: [RevisionID] = []
            if case .array(let a)? = entry["ancestors"] { ancestors = a.compactMap { $0.stringValue.flatMap { try? RevisionID($0) } } }
            for m in missing {
                guard let rev = m.stringValue.flatMap({ try? RevisionID($0) }) else { continue }
                guard let made = WireRevision.make(
                    id: id, revision: rev, tree: tree, receiverHas: ancestors, useDeltas: configuration.deltas,
                    maxHistory: configuration.maxHistory)
                else { continue }
                if !pushFilterAdmits(made.0, id: id, revision: rev, tree: tree) { continue }
                wires.append(made)
            }
        }
        try await putInChunks(wires, trees: trees, connection)
    }

    /// Pushes the page's small single-leaf revisions straight away, without asking revsDiff
    /// first (the peer answers "exists" for any it already holds, "needFull" for a delta
    /// whose base it lacks); returns the rest of the page for the usual path.
    private func pushInline(
        _ page: [(Change, [RevisionID])], _ connection: Connection, trees known: [DocumentID: RevisionTree]?
    ) async throws -> [(Change, [RevisionID])] {
        let trees = try known ?? store.revisionTrees(page.filter { $0.1.count == 1 }.map(\.0.id))
        var wires: [(WireRevision, Bool)] = []
        var rest: [(Change, [RevisionID])] = []
        for (change, leaves) in page {
            guard leaves.count == 1, let tree = trees[change.id],
                let wire = WireRevision.inline(
                    id: change.id, revision: leaves[0], tree: tree, useDeltas: configuration.deltas, limit: configuration.inlineLimit)
            else {
                rest.append((change, leaves))
                continue
            }
            if pushFilterAdmits(wire, id: change.id, revision: leaves[0], tree: tree) { wires.append((wire, wire.isDelta)) }
        }
        try await putInChunks(wires, trees: trees, connection)
        return rest
    }

    private func pushFilterAdmits(_ wire: WireRevision, id: DocumentID, revision: RevisionID, tree: RevisionTree) -> Bool {
        guard let filter = configuration.pushFilter else { return true }
        let body = tree.revision(revision)?.body.flatMap { try? JSON.parse($0) } ?? [:]
        return filter.admits(FilterInput(id: id, revision: revision, deleted: wire.deleted, body: body))
    }

    /// Sends revisions in putRevs requests bounded by count and bytes, blobs first.
    private func putInChunks(_ wires: [(WireRevision, Bool)], trees: [DocumentID: RevisionTree], _ connection: Connection) async throws {
        guard !wires.isEmpty else { return }
        try await pushBlobs(for: wires.map(\.0), trees: trees, connection)
        var bytes = 0
        var chunk: [(WireRevision, Bool)] = []
        for w in wires {
            let size = w.0.content.count
            if !chunk.isEmpty && (chunk.count >= configuration.maxRevisionsPerRequest || bytes + size > configuration.maxBytesPerRequest) {
                try await putChunk(chunk, trees: trees, connection)
                chunk = []
                bytes = 0
            }
            chunk.append(w)
            bytes += size
        }
        if !chunk.isEmpty { try await putChunk(chunk, trees: trees, connection) }
    }

    private func putChunk(_ chunk: [(WireRevision, Bool)], trees: [DocumentID: RevisionTree], _ connection: Connection) async throws {
        let reply = try await connection.request(SyncProtocol.Profile.putRevs, body: WireRevision.encodeBatch(chunk.map(\.0))).json()
        guard case .array(let results)? = reply["results"], results.count == chunk.count else {
            throw SyncError.protocolViolation("putRevs reply does not answer every revision")
        }
        var resend: [(WireRevision, Bool)] = []
        for ((wire, usedDelta), result) in zip(chunk, results) {
            switch result["status"]?.stringValue {
            case "ok", "exists":
                if let id = try? DocumentID(wire.id, allowReserved: true), let rev = try? RevisionID(wire.rev) { peerHeld.record(id, rev) }
                guard result["status"]?.stringValue == "ok" else { break }
                count {
                    $0.pushed += 1
                    if usedDelta { $0.deltasSent += 1 }
                }
                eventBroadcaster.send(DocumentEvent(direction: .push, id: wire.id, revision: wire.rev, deleted: wire.deleted, rejection: nil))
            case "needFull":
                guard usedDelta, let id = try? DocumentID(wire.id, allowReserved: true), let rev = try? RevisionID(wire.rev),
                    let tree = trees[id],
                    let full = WireRevision.make(id: id, revision: rev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: configuration.maxHistory)
                else {
                    reject(.push, id: wire.id, rev: wire.rev, deleted: wire.deleted, "peer could not rebuild the revision")
                    continue
                }
                resend.append(full)
            default:
                reject(.push, id: wire.id, rev: wire.rev, deleted: wire.deleted, result["reason"]?.stringValue ?? "refused by peer")
            }
        }
        if !resend.isEmpty { try await putChunk(resend, trees: trees, connection) }
    }

    private func pushBlobs(for wires: [WireRevision], trees: [DocumentID: RevisionTree], _ connection: Connection) async throws {
        var digests = Set<BlobDigest>()
        for w in wires {
            guard let id = try? DocumentID(w.id, allowReserved: true), let rev = try? RevisionID(w.rev),
                let bytes = trees[id]?.revision(rev)?.body, DocumentStore.mayReferenceBlobs(bytes),
                let body = try? JSON.parse(bytes)
            else { continue }
            for ref in (try? body.blobReferences()) ?? [] { digests.insert(ref.digest) }
        }
        guard !digests.isEmpty else { return }
        let reply = try await connection.requestJSON(
            SyncProtocol.Profile.hasBlobs, ["digests": .array(digests.sorted().map { .string($0.description) })])
        guard case .array(let missing)? = reply["missing"] else { throw SyncError.protocolViolation("hasBlobs reply is malformed") }
        for m in missing {
            guard let digest = m.stringValue.flatMap({ try? BlobDigest($0) }), let content = try store.blobs.get(digest) else { continue }
            _ = try await connection.request(SyncProtocol.Profile.putBlob, properties: [("Digest", digest.description)], body: content)
            count { $0.blobsSent += 1 }
        }
    }

    // MARK: Pending documents

    /// Documents with local changes not yet pushed (after the push checkpoint, passing the
    /// document-ID list and push filter). Before the first connection, every document is pending.
    public func pendingDocumentIDs() throws -> Set<DocumentID> {
        var since: UInt64 = 0
        let (remote, pushed) = state.withLock { ($0.remoteDatabase, $0.pushedThrough) }
        if let remote {
            since = max(try localCheckpoint(checkpointKey(remoteDB: remote, direction: "push")) ?? 0, pushed)
        }
        var pending = Set<DocumentID>()
        while true {
            let page = try store.changes(since: since, limit: 1000)
            guard let last = page.last else { break }
            for change in page {
                if let ids = configuration.documentIDs, !ids.contains(change.id) { continue }
                if let filter = configuration.pushFilter {
                    guard let doc = try store.document(change.id) else { continue }
                    if !filter.admits(FilterInput(id: change.id, revision: doc.revision, deleted: doc.deleted, body: doc.body)) { continue }
                }
                pending.insert(change.id)
            }
            since = last.sequence
        }
        return pending
    }

    public func isDocumentPending(_ id: DocumentID) throws -> Bool {
        try pendingDocumentIDs().contains(id)
    }
}

/// A replicator's totals, and the connection whose traffic is not in them yet.
struct SummaryState {
    var totals = ReplicationSummary()
    var live: Connection?

    var current: ReplicationSummary {
        guard let live else { return totals }
        var s = totals
        let c = live.counters.withLock { $0 }
        s.bytesSent += c.bytesSent
        s.bytesReceived += c.bytesReceived
        return s
    }
}

extension ReplicationSummary {
    /// The document counts only: what says an attempt got somewhere (traffic alone does not).
    var documentProgress: [Int] { [pushed, pulled, rejected, conflicts, resolved, blobsSent, blobsReceived] }
}

/// A value behind an NSLock, for read-modify-write with non-escaping closures.
final class LockedBox<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T
    init(_ value: T) { self.value = value }

    func read<R>(_ body: (T) -> R) -> R {
        lock.lock()
        defer { lock.unlock() }
        return body(value)
    }

    @discardableResult
    func modify<R>(_ body: (inout T) -> R) -> R {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}

extension DocumentStore {
    /// `waitForCommit`, then, when every commit past `sequence` only stored revisions
    /// relayed from other peers, `relayDelay` more on the poll's clock: what a push or a
    /// live changes reply waits before passing changes on (local edits go at once).
    func waitForChangeToPassOn(past sequence: UInt64, poll: LiveChanges.Poll, relayDelay: Duration) async throws {
        try await waitForCommit(past: sequence, poll: poll)
        if relayDelay > .zero && lastLocalCommit <= sequence { try await poll.clock.sleep(for: relayDelay) }
    }
}
