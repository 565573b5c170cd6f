import FerryCore
import FerryStore
import Foundation
import Logging
import ServiceLifecycle

/// The active side of replication and the owner of its lifecycle: connects to a peer
/// through a connector, opens the remote database there, runs the pull and push workers
/// until caught up (one-shot) or stopped (continuous), and retries transient failures with
/// backoff. Status, summary and document events are published through its one
/// `ReplicationProgress`.
public final class Replicator: Sendable {
    /// Opens a new endpoint to the peer; called once per connection attempt.
    public typealias Connector = @Sendable () async throws -> any MessageEndpoint
    /// Opens the other side as a remote database (one speaking another protocol, such as
    /// CouchDB's over HTTP); called once per connection attempt, closed when it ends.
    package typealias RemoteOpener = @Sendable () async throws -> any RemoteDatabase

    /// How each connection attempt reaches the other side.
    enum Source: Sendable {
        /// A message endpoint that speaks Ferry's protocol.
        case endpoint(Connector)
        /// A remote database opened by other means.
        case remote(RemoteOpener)
    }

    public let configuration: ReplicatorConfiguration
    let store: DocumentStore
    let source: Source
    let clock: any Clock<Duration>
    let logger: Logger
    let context: ReplicationContext
    private let state = Locked(RunState())
    private let retrySignal = Broadcaster<Void>()

    /// The lifecycle's own state, behind the mutex (status lives in `ReplicationProgress`).
    struct RunState {
        var task: Task<Void, Never>?
        var remoteDatabase: String?
        /// The other side's access epoch as its last hello said.
        var remoteEpoch: Int64?
        var remoteStamp: String?
        /// How far the push worker of the current connection has pushed, ahead of a deferred local checkpoint.
        var pushedThrough: UInt64 = 0
        /// `retryNow()` was called; the next wait before an attempt ends at once.
        var retryRequested = false
        /// The remote of the attempt running now, while its workers run.
        var liveRemote: (any RemoteDatabase)?
    }

    public init(
        store: DocumentStore, connector: @escaping Connector, configuration: ReplicatorConfiguration = .init(),
        clock: any Clock<Duration> = ContinuousClock(), logger: Logger = Logger(label: "ferry.sync.replicator")
    ) {
        self.store = store
        source = .endpoint(connector)
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        context = ReplicationContext(store: store, configuration: configuration, clock: clock, logger: logger)
    }

    /// A replicator whose other side is a remote database `opener` opens for each attempt.
    package init(
        store: DocumentStore, remote opener: @escaping RemoteOpener, configuration: ReplicatorConfiguration = .init(),
        clock: any Clock<Duration> = ContinuousClock(), logger: Logger = Logger(label: "ferry.sync.replicator")
    ) {
        self.store = store
        source = .remote(opener)
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        context = ReplicationContext(store: store, configuration: configuration, clock: clock, logger: logger)
    }

    // MARK: Observing

    public var status: ReplicatorStatus { context.progress.status }
    /// Totals so far; the traffic of the connection up now is included as it happens.
    public var summary: ReplicationSummary { context.progress.summary }

    /// Every status change from now on; finishes when the replicator stops for good.
    public func statusChanges() -> AsyncStream<ReplicatorStatus> { context.progress.statusBroadcaster.subscribe() }

    /// Every document pushed, pulled or refused from now on.
    public func documentEvents() -> AsyncStream<DocumentEvent> { context.progress.eventBroadcaster.subscribe() }

    private func setActivity(_ activity: ReplicatorStatus.Activity, error: SyncError? = nil) {
        context.progress.setActivity(activity, error: error)
    }

    // MARK: Running

    /// Runs until one-shot replication completes, `stop()` is called, a permanent error
    /// occurs, or the attempts run out. The final status says which.
    public func run() async {
        // Cleared before the handler is installed: a shutdown already under way calls it at once.
        context.clearStop()
        await withGracefulShutdownHandler {
            await self.runUntilDone()
        } onGracefulShutdown: {
            self.stop()
        }
    }

    private func runUntilDone() async {
        state.withLock { $0.retryRequested = false }
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
                configuration.wiring.metrics?.replicationError(transient: e.isTransient)
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
        context.progress.finish()
    }

    /// How a wait before the next connection attempt ended.
    enum RetryWaitEnd { case elapsed, retryNow, stopped }

    /// Waits `wait` on the clock; `stop()` and `retryNow()` end the wait at once.
    private func retryWait(_ wait: Duration) async -> RetryWaitEnd {
        let retry = retrySignal.subscribe()
        if state.withLock({ s -> Bool in
            defer { s.retryRequested = false }
            return s.retryRequested
        }) { return .retryNow }
        do {
            let retried = try await context.race(timeout: wait) { () async -> Bool in
                for await _ in retry { return true }
                return false
            }
            state.withLock { $0.retryRequested = false }
            if retried == true { return .retryNow }
            return stopRequested ? .stopped : .elapsed
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

    /// Starts `run()` in a task of its own.
    public func start() {
        let task = Task { await self.run() }
        state.withLock { $0.task = task }
    }

    /// Asks the replicator to stop; a batch being inserted finishes and its checkpoint is
    /// saved locally first.
    public func stop() {
        let task = state.withLock { $0.task }
        context.requestStop()
        task?.cancel()
    }

    /// Waits until a task started with `start()` has finished.
    public func waitUntilStopped() async {
        let task = state.withLock { $0.task }
        await task?.value
    }

    var stopRequested: Bool { context.stopRequested }

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
        let connector: Connector
        switch source {
        case .endpoint(let c): connector = c
        case .remote(let opener): return try await openAndReplicate(opener)
        }
        let endpoint: any MessageEndpoint
        do {
            endpoint = try await connector()
        } catch {
            throw SyncError.from(error)
        }
        if stopRequested || Task.isCancelled {
            // Stopped while dialling: the new connection must not outlive the replicator.
            await endpoint.close(error: nil)
            throw CancellationError()
        }
        let connection = Connection(endpoint: endpoint, metrics: configuration.wiring.metrics)
        context.peerHeld.reset()
        context.progress.connected(connection)
        // However the connection ends, its traffic moves from live into the totals at once.
        defer { context.progress.disconnected() }
        connection.start()
        do {
            let remote = try await FerryRemote.open(
                connection, nodeID: configuration.wiring.nodeID, localDatabase: store.uuid, inlineWanted: configuration.inlineLimit > 0,
                features: SyncProtocol.features(liveness: configuration.wiring.liveness), coverage: configuration.coverageForHello(store))
            context.startLiveness(on: connection, remote: remote.identity)
            try await replicate(with: remote, connection: connection)
            await connection.close()
        } catch {
            await connection.close(error: SyncError.from(error))
            throw error
        }
    }

    /// One attempt with a remote database from `opener`: open it, run the workers, close it.
    private func openAndReplicate(_ opener: RemoteOpener) async throws {
        let remote: any RemoteDatabase
        do {
            remote = try await opener()
        } catch {
            throw SyncError.from(error)
        }
        context.peerHeld.reset()
        let progress = context.progress
        remote.countBlobs { change in progress.count(change) }
        if let traffic = remote.traffic {
            context.progress.connected(traffic: traffic)
        }
        defer { if remote.traffic != nil { context.progress.disconnected() } }
        do {
            try await replicate(with: remote)
            await remote.close(error: nil)
        } catch {
            await remote.close(error: SyncError.from(error))
            throw error
        }
    }

    /// The node ID of the peer connected now; nil while not connected.
    public var remotePeerID: String? { state.withLock { $0.liveRemote?.identity.peerID } }

    /// Fetches a deferred blob (left for first read by a lazy policy) from this replicator's
    /// peer over its open connection; false when no connection is open, this replicator
    /// does not pull, or the peer does not have the blob (or may not give it).
    public func fetchDeferredBlob(_ ref: BlobReference) async throws(SyncError) -> Bool {
        guard configuration.direction.pulls, let remote = state.withLock({ $0.liveRemote }), remote.identity.allowsPull else {
            return false
        }
        do {
            try await BlobTransfer(context: context, remote: remote).fetch(ref)
            return context.store.blobs.has(ref.digest)
        } catch let error as SyncError where error.kind == .notFound {
            return false
        } catch {
            throw SyncError.from(error)
        }
    }

    /// Runs the workers the direction asks for against an open remote.
    func replicate(with remote: any RemoteDatabase, connection: Connection? = nil) async throws {
        let remoteDB = remote.identity.databaseID
        state.withLock {
            $0.remoteDatabase = remoteDB
            $0.remoteEpoch = remote.identity.accessEpoch
            $0.remoteStamp = remote.identity.accessStamp
            $0.liveRemote = remote
        }
        defer { state.withLock { $0.liveRemote = nil } }
        let direction = configuration.direction
        if direction.pulls && !remote.identity.allowsPull {
            throw SyncError.forbidden("the peer does not allow pull")
        }
        if direction.pushes && !remote.identity.allowsPush {
            throw SyncError.forbidden("the peer is read-only: push is refused")
        }
        // Changes a failed attempt saw but did not finish are listed again from the
        // checkpoint: uncounted, or a continuous replication would never show idle again.
        context.progress.update { $0.total = $0.completed }
        setActivity(.busy)
        let context = self.context
        let puller = Puller(context: context, remote: remote)
        let pusher = Pusher(context: context, remote: remote)
        // Each task says whether it was a worker: the reconciler only lives as long as they do.
        try await withThrowingTaskGroup(of: Bool.self) { group in
            var workers = 0
            if direction.pulls {
                let key = checkpointKey(remoteDB: remoteDB, direction: .pull, remoteEpoch: remote.identity.accessEpoch)
                group.addTask {
                    try await puller.run(checkpointKey: key)
                    return true
                }
                workers += 1
            }
            if direction.pushes {
                let key = checkpointKey(
                    remoteDB: remoteDB, direction: .push, remoteEpoch: remote.identity.accessEpoch, remoteStamp: remote.identity.accessStamp)
                group.addTask {
                    try await pusher.run(checkpointKey: key) { seq in
                        self.state.withLock { $0.pushedThrough = seq }
                    }
                    return true
                }
                workers += 1
            }
            // Anti-entropy, on a continuous link both ways with heartbeats (Reconciler.swift).
            if let connection, let digests = configuration.wiring.digests, configuration.wiring.antiEntropy.enabled, configuration.continuous,
                direction == .pushAndPull, remote.identity.heartbeat
            {
                let reconciler = Reconciler(
                    context: context, connection: connection, digests: digests, peerID: remote.identity.peerID, puller: puller,
                    pusher: pusher)
                group.addTask {
                    try await reconciler.run()
                    return false
                }
            }
            // Not waitForAll(): it waits for every child before rethrowing, so a pull that
            // fails on a dropped connection would wait for an idle push loop's next local
            // change. The first error ends the group, which cancels the other worker.
            while workers > 0, let wasWorker = try await group.next() {
                if wasWorker { workers -= 1 }
            }
            group.cancelAll()
        }
    }

    // MARK: Checkpoints

    /// `remoteEpoch`: how many documents the other side ever purged for access (its hello);
    /// `remoteStamp`: what its own roles let it hold (its hello).
    func checkpointKey(remoteDB: String, direction: CheckpointDirection, remoteEpoch: Int64?, remoteStamp: String? = nil) -> String {
        var filter = direction == .pull ? configuration.pullFilter?.name : configuration.pushFilter?.name
        // A restricted peer's policy is part of the key: widening it starts over, so what it
        // newly admits moves (a trusted peer's key has no such part, and never restarts).
        let rule = direction == .pull ? configuration.remotePolicy.write : configuration.remotePolicy.read
        if !rule.admitsEverything { filter = (filter ?? "") + "\u{0}policy:" + rule.fingerprint }
        if direction == .pull, let own = configuration.ownReadFingerprint { filter = (filter ?? "") + "\u{0}own:" + own }
        // A side that purged documents for access holds less than its checkpoints say: a new
        // key after each purge re-examines the feed (revsDiff keeps what it holds from moving).
        let epoch = direction == .push ? remoteEpoch : (try? store.accessRemovals().total)
        if let epoch, epoch > 0 { filter = (filter ?? "") + "\u{0}epoch:\(epoch)" }
        // A receiver refuses what its own roles do not admit yet (its roles may reach it after
        // the documents do): once they change, what it refused is offered again.
        if direction == .push, let remoteStamp { filter = (filter ?? "") + "\u{0}holds:" + remoteStamp }
        return Checkpointer<UInt64>.key(
            localDatabase: store.uuid, remoteDatabase: remoteDB, direction: direction, filterName: filter,
            documentIDs: configuration.documentIDs)
    }

    /// The local copy of a checkpoint of local sequences (push).
    func localCheckpoint(_ key: String) throws -> UInt64? { try Checkpointer<UInt64>.local(store, key: key) }

    // MARK: Pending documents

    /// Documents with local changes not yet pushed (after the push checkpoint, passing the
    /// document-ID list and push filter). Before the first connection, every document is pending.
    public func pendingDocumentIDs() throws -> Set<DocumentID> {
        var since: UInt64 = 0
        let (remote, pushed, epoch, stamp) = state.withLock { ($0.remoteDatabase, $0.pushedThrough, $0.remoteEpoch, $0.remoteStamp) }
        if let remote {
            let key = checkpointKey(remoteDB: remote, direction: .push, remoteEpoch: epoch, remoteStamp: stamp)
            since = max(try localCheckpoint(key) ?? 0, pushed)
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

extension DocumentStore {
    /// `waitForCommit`, then, when every commit past `sequence` only stored revisions
    /// relayed from other peers, `relayDelay` more on the poll's clock: what a push or a
    /// live changes reply waits before passing changes on (local edits go at once).
    func waitForChangeToPassOn(past sequence: UInt64, poll: LiveChanges.Poll, relayDelay: Duration) async throws {
        try await waitForCommit(past: sequence, poll: poll)
        if relayDelay > .zero && lastLocalCommit <= sequence { try await poll.clock.sleep(for: relayDelay) }
    }
}
