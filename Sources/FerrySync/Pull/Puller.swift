import FerryCore
import FerryStore

/// The pull worker: reads the other side's changes after the pull checkpoint, fetches
/// what this store lacks, judges it at the trust boundary, stores it, resolves conflicts
/// and advances the checkpoint, until caught up (one-shot) or stopped (continuous).
///
/// A bulk pull is a pipeline whose only serial stage is the insert: while chunk i is
/// inserted, chunk i+1 is received and judged and the other side prepares chunk i+2; the
/// next page of changes is asked for as soon as a page arrives, and planned beside the
/// current page's last chunk (`PullPlan.swift`), never on the insert path.
final class Puller: Sendable {
    let context: ReplicationContext
    let remote: any RemoteDatabase
    let blobs: BlobTransfer
    let resolution: ConflictResolutionStep
    /// The pull has caught up with the other side's feed at least once (it went live).
    private let wentLive = Locked(false)
    var hasGoneLive: Bool { wentLive.withLock { $0 } }

    init(context: ReplicationContext, remote: any RemoteDatabase) {
        self.context = context
        self.remote = remote
        blobs = BlobTransfer(context: context, remote: remote)
        resolution = ConflictResolutionStep(
            store: context.store, resolvers: context.configuration.resolvers, progress: context.progress, logger: context.logger)
    }

    var configuration: ReplicatorConfiguration { context.configuration }
    var progress: ReplicationProgress { context.progress }

    /// Whether this node asks the peer which of the documents it holds it may no longer read
    /// (`accessCheck`): its reading is narrowed by content, and the peer's word could count.
    var asksHeldAccess: Bool {
        configuration.checksHeldAccess && remote.identity.acceptsRemovals
            && AccessRemovalApplier.mayTell(writer: configuration.remotePolicy, own: configuration.ownRead())
    }

    func run(checkpointKey key: String) async throws {
        var checkpoint = Checkpointer<RemoteSequence>(
            key: key, store: context.store, remote: remote, delay: configuration.remoteCheckpointDelay, clock: context.clock)
        // Catch-up coordination (docs/protocol.md, "Join catch-up"): wait for the node's
        // lease, then start no lower than what this store already holds of the remote's feed.
        let remoteDB = remote.identity.databaseID
        let intakeComplete = configuration.pullIntakeIsComplete(from: remote.identity)
        if intakeComplete { checkpoint.coverage = remoteDB }
        // Only a pull that leaves coverage behind takes part: one that does not (filtered,
        // restricted, or from a peer stating none) would hold the others up for nothing.
        let gate = intakeComplete ? configuration.wiring.catchUpGate : nil
        let ticket = gate?.ticket(label: "pull from \(LogText.escape(remote.identity.peerID))")
        defer { if let gate, let ticket { gate.release(ticket) } }
        if let gate, let ticket { try await gate.acquire(ticket) }
        let floor = try Coverage.of(remoteDB, in: context.store)
        let reset = context.resetsCheckpoint(.pull)
        var since = try await checkpoint.start(reset: reset, floor: floor)
        if reset { context.checkpointWasReset(.pull) }
        if asksHeldAccess, let ferry = remote as? FerryRemote { try await checkHeldAccess(ferry) }
        var catchingUp = true
        /// The first catch-up of this connection ended: take over the remote's coverage
        /// (this store now holds everything the remote held at hello) and pass the lease on.
        func caughtUpFirstTime() throws {
            guard catchingUp else { return }
            catchingUp = false
            // Taken over only when nothing the remote skipped as a relay is still missing here:
            // its coverage counts those, and this store would claim what it lacks.
            if intakeComplete, let snapshot = remote.identity.coverage,
                try checkpoint.hold.coverable(through: checkpoint.position.number ?? 0, store: context.store) >= 0,
                checkpoint.hold.isClear
            {
                let raised = try Coverage.adopt(snapshot, in: context.store)
                if raised > 0 { context.logger.debug("caught up; took over the peer's coverage", metadata: ["raised": "\(raised)"]) }
            }
            if let gate, let ticket { gate.release(ticket) }
        }
        var caughtUp = false
        var prefetched: (since: RemoteSequence, task: Task<RemoteChanges, any Error>)?
        var planned: (since: RemoteSequence, task: Task<PullPlan?, any Error>)?
        let backlog = BlobBacklog<RemoteSequence>()
        defer {
            prefetched?.task.cancel()
            if let planned { PullPlan.discard(planned.task) }
            backlog.cancelAll()
            checkpoint.saveLocalIfBehind()
        }
        /// Moves the checkpoint to `position`, or, while pages before it still wait for
        /// blobs, queues the move behind them. True when it moved now.
        func reach(_ position: RemoteSequence) -> Bool {
            guard backlog.isEmpty else {
                backlog.add(through: position, work: nil)
                return false
            }
            checkpoint.advance(to: position)
            return true
        }
        /// Moves the checkpoint over the backlog's pages that are stored (all of them,
        /// waiting, when `wait`).
        func settleBacklog(wait: Bool) async throws {
            guard !backlog.isEmpty, let reached = try await backlog.settle(wait: wait) else { return }
            checkpoint.advance(to: reached)
            try checkpoint.saveLocal()
            checkpoint.deferRemote()
        }
        let remote = self.remote
        while true {
            if context.stopRequested { return }
            try Task.checkCancellation()
            try await settleBacklog(wait: false)
            if checkpoint.remoteLags && checkpoint.isDue { try await checkpoint.saveBoth() }
            let live = configuration.continuous && caughtUp
            var request = RemoteChangesRequest(since: since, limit: configuration.batchSize, live: live, timeout: configuration.heartbeat)
            // A deferred checkpoint write must not wait a whole heartbeat.
            if live && checkpoint.remoteLags, let remaining = checkpoint.remaining {
                request.timeout = min(request.timeout, max(remaining, .milliseconds(1)))
            }
            if live && remote.identity.inline { request.inlineLimit = configuration.inlineLimit }
            if !configuration.deltas && request.inlineLimit != nil { request.noDeltas = true }
            request.documentIDs = configuration.documentIDs
            request.selector = configuration.remoteSelector
            let asked = request
            // A live request may wait a whole heartbeat; a stop must not.
            let page: RemoteChanges
            if let prefetched, prefetched.since == since {
                page = try await prefetched.task.value
            } else if let p = live ? try await context.race({ try await remote.changes(asked) }) : try await remote.changes(asked) {
                page = p
            } else {
                return
            }
            prefetched = nil
            if !page.removed.isEmpty {
                progress.accessRemoved(try AccessRemovalApplier.apply(page.removed, writer: configuration.remotePolicy, own: configuration.ownRead(), store: context.store))
            }
            // A document purged here that the peer offers with a revision newer than any this
            // node knew is readable again, whole: its purged revisions may come back.
            try context.store.liftAccessRefusals(offered: Dictionary(page.changes.map { ($0.id, $0.leaves) }, uniquingKeysWith: +))
            let lastSeq = page.lastSequence
            // Relays the other side left out (live pages only): coverage waits until they are held.
            if intakeComplete && (!page.skipped.isEmpty || page.skipsLost) {
                checkpoint.hold.note(page.skipped, lostFrom: page.skipsLost ? (since.number ?? 0) + 1 : nil)
            }
            if page.changes.isEmpty {
                // The end of the feed: before coverage is taken over or a one-shot pull
                // ends, everything read is stored.
                if !caughtUp || !configuration.continuous { try await settleBacklog(wait: true) }
                if lastSeq != since {
                    // Only documents left out changed (hidden from this peer, or revisions
                    // it sent itself): nothing to store, but the feed moved on. Once live,
                    // both copies wait for the deferred write: in a mesh this happens on
                    // every link for every write, and a lag only means a re-read on restart.
                    since = lastSeq
                    if reach(since) {
                        if !live { try checkpoint.saveLocal() }
                        checkpoint.deferRemote()
                    }
                }
                if checkpoint.remoteLags && (!live || checkpoint.isDue) { try await checkpoint.saveBoth() }
                // Nothing for this side on a page that did not end the feed (everything on it
                // left out): not the end yet, read on from past it.
                if !page.caughtUp && lastSeq != asked.since { continue }
                try caughtUpFirstTime()
                if !configuration.continuous { return }
                caughtUp = true
                wentLive.withLock { $0 = true }
                progress.markIdleIfCaughtUp()
                continue
            }
            progress.update {
                $0.activity = .busy
                // The whole feed's size when the other side tells it; else page by page.
                $0.total = max($0.total, $0.completed + page.changes.count + (page.pending ?? 0))
            }
            // A continuous replication whose page ended the other side's feed goes live
            // next; otherwise the other side already reads the next page while this batch is inserted.
            let endsFeed = configuration.continuous && page.caughtUp
            if !endsFeed {
                var next = request
                next.since = lastSeq
                next.live = false
                next.inlineLimit = nil
                let nextRequest = next
                prefetched = (lastSeq, Task { try await remote.changes(nextRequest) })
            }
            let plan: PullPlan
            if let p = planned, p.since == since, let ready = try await p.task.value {
                plan = ready
            } else {
                if let planned { PullPlan.discard(planned.task) }
                plan = try PullPlan(page.changes, puller: self)
            }
            planned = nil
            let waiting = try await pull(plan) {
                // The next page was asked for when this one arrived: plan it beside this page's
                // last chunk (never on the insert path), so that the other side prepares its
                // first chunks while that one is inserted.
                guard let next = prefetched, next.since == lastSeq, !context.stopRequested else { return }
                let nextPage = next.task
                planned = (
                    lastSeq,
                    Task {
                        let changes = try await nextPage.value.changes
                        return changes.isEmpty ? nil : try PullPlan(changes, puller: self)
                    }
                )
            }
            since = lastSeq
            if !waiting.isEmpty || !backlog.isEmpty {
                // This page's documents with blobs still to fetch are stored beside the pages
                // that follow; the checkpoint passes the page once they are.
                let work: (@Sendable () async throws -> Void)?
                if waiting.isEmpty {
                    work = nil
                } else {
                    let revisions = waiting
                    work = { [self] in try await self.storeAfterBlobs(revisions) }
                }
                backlog.add(through: lastSeq, work: work)
                if !(endsFeed && !caughtUp) {
                    try await settleBacklog(wait: false)
                    progress.update { $0.completed += page.changes.count }
                    continue
                }
                // The first end of the feed takes over coverage: everything read is stored first.
                try await settleBacklog(wait: true)
            }
            checkpoint.advance(to: since)
            if caughtUp {
                try checkpoint.saveLocal()
                checkpoint.deferRemote()
            } else {
                try await checkpoint.saveBoth()
                caughtUp = endsFeed
                if endsFeed {
                    try caughtUpFirstTime()
                    wentLive.withLock { $0 = true }
                }
            }
            progress.update { $0.completed += page.changes.count }
            progress.markIdleIfCaughtUp()
        }
    }

    /// Asks the peer, a page at a time, which of the live documents held here this node may no
    /// longer read, and purges those it names (within its write policy). Only documents the
    /// peer may read and write as held here are listed: the list names their revisions, and
    /// no other notice from it would count.
    func checkHeldAccess(_ ferry: FerryRemote) async throws {
        let peer = DocumentAccess(configuration.remotePolicy)
        var since: UInt64 = 0
        while true {
            let page = try context.store.changesWithLeaves(since: since, limit: AccessCheckRequest.maxHeld)
            guard let last = page.last else { return }
            since = last.0.sequence
            let ids = page.filter { !$0.0.deleted && !$0.0.id.rawValue.hasPrefix(ReservedNamespace.prefix) }.map(\.0.id)
            let trees = ids.isEmpty ? [:] : try context.store.revisionTrees(ids)
            let held = ids.compactMap { id -> AccessCheckRequest.HeldDocument? in
                guard let tree = trees[id], !tree.isEmpty, peer.mayRead(id, tree: tree),
                    DocumentAccess.admitsDocument(configuration.remotePolicy.write, id, tree: tree)
                else { return nil }
                return AccessCheckRequest.HeldDocument(id: id, tree: tree)
            }
            if !held.isEmpty {
                let notices = try await ferry.checkAccess(held)
                if !notices.isEmpty {
                    progress.accessRemoved(
                        try AccessRemovalApplier.apply(notices, writer: configuration.remotePolicy, own: configuration.ownRead(), store: context.store))
                }
            }
            if page.count < AccessCheckRequest.maxHeld { return }
        }
    }

    /// Reads the other side's whole feed from its start, ignoring checkpoints and coverage,
    /// and fetches whatever this store lacks (anti-entropy). With `checkingHeldAccess`, first
    /// asks the peer which held documents this node may no longer read, as a session's start
    /// does (when it would). Returns the revisions stored.
    func sweep(checkingHeldAccess: Bool = false) async throws -> Int {
        let before = progress.summary.pulled
        if checkingHeldAccess, asksHeldAccess, let ferry = remote as? FerryRemote { try await checkHeldAccess(ferry) }
        var since = RemoteSequence.start
        while !context.stopRequested {
            try Task.checkCancellation()
            // Not live: the other side leaves no relays out of a page that is not.
            var request = RemoteChangesRequest(since: since, limit: configuration.batchSize, live: false, timeout: configuration.heartbeat)
            request.documentIDs = configuration.documentIDs
            request.selector = configuration.remoteSelector
            let page = try await remote.changes(request)
            if !page.changes.isEmpty {
                let waiting = try await pull(try PullPlan(page.changes, puller: self)) {}
                try await storeAfterBlobs(waiting)
            }
            if page.caughtUp || page.lastSequence == since { break }
            since = page.lastSequence
        }
        return progress.summary.pulled - before
    }

    /// Fetches, checks and inserts a planned page. `beforeLastChunk` runs once the last
    /// chunk is asked for (the caller plans the next page there, so the other side never idles).
    /// Returns the accepted revisions that wait for blobs, for the caller to fetch and store.
    private func pull(_ plan: PullPlan, beforeLastChunk: () async throws -> Void) async throws -> [IncomingRevision] {
        var waiting: [IncomingRevision] = []
        // Three stages overlap: the other side prepares chunk i+2, chunk i+1 is received and
        // judged, and chunk i is inserted.
        var checking = plan.firstChecked
        var fetching = plan.secondFetched
        defer {
            checking?.cancel()
            fetching?.cancel()
        }
        if !plan.inlined.isEmpty {
            try await store(PullPlan.check(plan.inlined, plan: plan, deltas: configuration.deltas), plan: plan, waiting: &waiting)
        }
        let chunks = plan.chunks
        guard !chunks.isEmpty else { return waiting }
        // The plan asked for the first two chunks.
        if chunks.count <= 2 { try await beforeLastChunk() }
        for i in chunks.indices {
            guard let judged = checking else { break }
            let checked = try await judged.value
            checking = nil
            if let reply = fetching {
                checking = plan.judge(reply, deltas: configuration.deltas)
                fetching = i + 2 < chunks.count ? fetch(chunks[i + 2], deltas: configuration.deltas) : nil
                if i + 3 == chunks.count { try await beforeLastChunk() }
            }
            try await store(checked, plan: plan, waiting: &waiting)
        }
        return waiting
    }

    /// Fetches the blobs `revisions` lack, then stores them.
    func storeAfterBlobs(_ revisions: [IncomingRevision]) async throws {
        guard !revisions.isEmpty else { return }
        try await blobs.fetchMissing(for: revisions)
        try await insert(revisions)
    }

    func fetch(_ chunk: [RevisionRequest], deltas: Bool) -> Task<[WireRevision], any Error> {
        let (remote, maxHistory) = (self.remote, configuration.maxHistory)
        return Task { try await remote.fetchRevisions(chunk, deltas: deltas, maxHistory: maxHistory) }
    }

    /// Stores what a chunk's check accepted, except revisions whose blobs are still to be
    /// fetched (added to `waiting`), reports what it refused, and fetches in full what arrived
    /// as an unusable delta.
    private func store(_ checked: CheckedChunk, plan: PullPlan, waiting: inout [IncomingRevision]) async throws {
        if checked.deltas > 0 { progress.count { $0.deltasReceived += checked.deltas } }
        for r in checked.rejected { progress.reject(.pull, id: r.id, rev: r.rev, deleted: r.deleted, r.rejection) }
        if checked.rejected.contains(where: { $0.rejection.stage == .policy }) {
            configuration.wiring.mesh?.view.withdrawMomentarily(remote.identity.peerID)
        }
        try await tellRefusedCopiesUnreadable(checked.rejected)
        // Revisions whose blobs are here (or left for later) are stored first: a document
        // never waits behind another document's blob.
        let (ready, blocked) = try blobs.partition(checked.accepted)
        try await insert(ready)
        waiting += blocked
        if !checked.retryFull.isEmpty {
            let fresh = try context.store.revisionTrees(checked.retryFull.map(\.id))
            let full = try await fetch(checked.retryFull, deltas: false).value
            let retried = PullPlan.check(full, pipeline: plan.pipeline, trees: fresh, deltas: false)
            try await self.store(retried, plan: plan, waiting: &waiting)
        }
    }

    /// Tells the peer which of the revisions its write policy refused here belong to documents
    /// it may not read here (`accessRemoved`). Such a copy is the peer's own edit of a
    /// document that, as it stands here, is not its to hold (made concurrently with an
    /// admin's move to another ward, say): every node holding the document refuses it, and
    /// without a word the peer would keep it, and offer it again, for ever. It purges the copy
    /// when these are all the leaves it holds and this node may delete the document there; the
    /// notice goes only when this node holds a revision the peer lacks (it is not merely
    /// behind it), and names none of this node's revisions.
    private func tellRefusedCopiesUnreadable(
        _ rejected: [(id: String, rev: String, deleted: Bool, rejection: Rejection, history: [String])]
    ) async throws {
        let access = DocumentAccess(configuration.remotePolicy)
        guard !access.readsEverything, remote.identity.acceptsRemovals, remote.identity.allowsPush, let ferry = remote as? FerryRemote
        else { return }
        var refused: [DocumentID: [(rev: RevisionID, history: [RevisionID])]] = [:]
        for r in rejected where r.rejection.stage == .policy {
            if let id = try? DocumentID(r.id), let rev = try? RevisionID(r.rev) {
                refused[id, default: []].append((rev, r.history.compactMap { try? RevisionID($0) }))
            }
        }
        guard !refused.isEmpty else { return }
        let trees = try context.store.revisionTrees(Array(refused.keys))
        let notices = refused.keys.sorted().compactMap { id -> RemovalNotice? in
            guard let tree = trees[id], !tree.isEmpty, !access.mayRead(id, tree: tree), let revs = refused[id] else { return nil }
            guard DocumentAccess.holdsRevisionBeyond(revs.map(\.rev), histories: revs.map(\.history), in: tree) else { return nil }
            return RemovalNotice(id: id.rawValue, revisions: revs.map(\.rev.description))
        }
        guard !notices.isEmpty else { return }
        context.logger.debug("told the peer its refused copies are not its to hold", metadata: ["documents": "\(notices.count)"])
        try await ferry.tellAccessRemoved(notices)
    }

    /// Stores accepted revisions, reports each outcome and resolves the conflicts they made.
    private func insert(_ accepted: [IncomingRevision]) async throws {
        guard !accepted.isEmpty else { return }
        let store = context.store
        // Who sent them is recorded before the commit a relay reads (the plan fetched only
        // revisions this store lacked).
        for rev in accepted { context.recordRelayed(rev.id, rev.revision, from: remote.identity.peerID) }
        // A bulk chunk is inserted on the database's thread, so that judging the next chunk
        // keeps a cooperative thread; a live change or two is inserted in place, where two
        // thread hand-offs would cost more than the insert (the first-peer latency, P2).
        let outcomes =
            accepted.count >= ReplicatorTuning.suspendingInsertThreshold
            ? try await store.insertRevisionsSuspending(accepted, durability: .normal)
            : try store.insertRevisions(accepted, durability: .normal)
        var touched = Set<DocumentID>()
        // Counted once per chunk (each count takes a lock and feeds the metrics), before the events.
        let pulled = outcomes.reduce(0) { n, o in if case .inserted = o { n + 1 } else { n } }
        progress.count { $0.pulled += pulled }
        configuration.wiring.metrics?.unverifiable(stored: accepted, outcomes: outcomes)
        for (rev, outcome) in zip(accepted, outcomes) {
            // Only a replicator that also pushes could offer it back.
            if configuration.direction.pushes {
                if case .rejected = outcome {} else { context.peerHeld.record(rev.id, rev.revision) }
            }
            switch outcome {
            case .inserted(_, let branched):
                // A document left with one leaf has nothing to resolve (nor to count as a conflict).
                if branched { touched.insert(rev.id) }
                progress.moved(.pull, id: rev.id.rawValue, rev: rev.revision.description, deleted: rev.deleted)
            case .alreadyPresent: configuration.wiring.metrics?.duplicates(1)
            case .rejected(let e):
                progress.reject(.pull, id: rev.id.rawValue, rev: rev.revision.description, deleted: rev.deleted, Rejection(storeError: e))
            }
        }
        try resolution.run(on: touched)
    }
}
