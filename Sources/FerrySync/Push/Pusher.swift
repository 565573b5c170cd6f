import FerryCore
import FerryStore

/// The push worker: reads the local changes feed after the push checkpoint, asks the other
/// side which leaf revisions it lacks, sends them (as deltas against what it holds, when
/// smaller) with their blobs first, and advances the checkpoint; once caught up, it waits
/// for local commits and sends small fresh revisions without asking first.
final class Pusher: Sendable {
    let context: ReplicationContext
    let remote: any RemoteDatabase
    let blobs: BlobTransfer
    /// The push has caught up with the local feed at least once (it went live).
    private let wentLive = Locked(false)
    var hasGoneLive: Bool { wentLive.withLock { $0 } }

    init(context: ReplicationContext, remote: any RemoteDatabase) {
        self.context = context
        self.remote = remote
        blobs = BlobTransfer(context: context, remote: remote)
    }

    var configuration: ReplicatorConfiguration { context.configuration }
    var progress: ReplicationProgress { context.progress }
    var store: DocumentStore { context.store }

    /// Runs the push; `reached` is told each sequence pushed through, before its checkpoint is written.
    func run(checkpointKey key: String, reached: @Sendable (UInt64) -> Void) async throws {
        var checkpoint = Checkpointer<UInt64>(
            key: key, store: store, remote: remote, delay: configuration.remoteCheckpointDelay, clock: context.clock)
        let reset = context.resetsCheckpoint(.push)
        var since = try await checkpoint.start(reset: reset)
        if reset { context.checkpointWasReset(.push) }
        var caughtUp = false
        let inline = remote.identity.inline
        reached(since)
        // Pages whose documents with blobs are still being sent, beside the pages that follow.
        let backlog = BlobBacklog<UInt64>()
        // However the loop ends, the local copy covers what the other side acknowledged.
        defer {
            backlog.cancelAll()
            checkpoint.saveLocalIfBehind()
        }
        /// Moves the checkpoint over the backlog's pages that are sent (all of them, waiting,
        /// when `wait`).
        func settleBacklog(wait: Bool) async throws {
            guard !backlog.isEmpty, let sent = try await backlog.settle(wait: wait) else { return }
            checkpoint.advance(to: sent)
            reached(sent)
            try checkpoint.saveLocal()
            checkpoint.deferRemote()
        }
        while true {
            if context.stopRequested { return }
            // Cancelled when the pull side failed: end here (an idle wait returns at once
            // once cancelled, so the loop must not go round again).
            try Task.checkCancellation()
            try await settleBacklog(wait: false)
            try await reofferSkipped()
            // Once caught up, the page's trees come with it: the inline push needs them.
            var trees: [DocumentID: RevisionTree]?
            let page: [(Change, [RevisionID])]
            if inline && caughtUp {
                let withTrees = try store.changesWithTrees(since: since, limit: configuration.batchSize)
                page = withTrees.map { ($0.0, $0.1.leaves.map(\.id)) }
                trees = Dictionary(withTrees.map { ($0.0.id, $0.1) }, uniquingKeysWith: { $1 })
            } else if caughtUp {
                page = try store.changesWithLeaves(since: since, limit: configuration.batchSize)
            } else {
                // A catch-up page is read on threads made for blocking work, off the cooperative pool.
                let (store, limit) = (store, configuration.batchSize)
                page = try await BlockingIO.run { [since] in try store.changesWithLeaves(since: since, limit: limit) }
            }
            guard let last = page.last else {
                if !backlog.isEmpty {
                    // Blobs still on their way: a one-shot push ends once they are there; a
                    // live one goes on with new local changes meanwhile, and is not idle.
                    guard configuration.continuous else {
                        try await settleBacklog(wait: true)
                        continue
                    }
                    if let ended = backlog.workEnded() {
                        try await waitForLocalChange(after: since, or: ended)
                        continue
                    }
                    try await settleBacklog(wait: false)
                    continue
                }
                if checkpoint.remoteLags {
                    if caughtUp, let remaining = checkpoint.remaining, remaining > .zero {
                        progress.markIdleIfCaughtUp()
                        try await waitForLocalChange(after: since, atMost: remaining)
                        continue
                    }
                    try await checkpoint.saveBoth()
                }
                if !configuration.continuous { return }
                caughtUp = true
                wentLive.withLock { $0 = true }
                progress.markIdleIfCaughtUp()
                try await waitForLocalChange(after: since)
                continue
            }
            progress.update {
                $0.activity = .busy
                $0.total += page.count
            }
            let (skipped, withBlobs) = try await push(page, caughtUp: caughtUp, inline: inline && caughtUp, trees: trees)
            checkpoint.reportSkipped(skipped)
            since = last.0.sequence
            if withBlobs != nil || !backlog.isEmpty {
                backlog.add(through: since, work: withBlobs)
                progress.update { $0.completed += page.count }
                try await settleBacklog(wait: false)
                continue
            }
            checkpoint.advance(to: since)
            reached(since)
            if caughtUp {
                // Both copies wait for the deferred write: a lag only re-reads changes
                // that revsDiff then skips.
                checkpoint.deferRemote()
            } else {
                try await checkpoint.saveBoth()
            }
            progress.update { $0.completed += page.count }
            progress.markIdleIfCaughtUp()
        }
    }

    /// Returns after a local commit past `since`, a stop, `atMost` of the clock, or when
    /// documents skipped for the peer are due to be offered again.
    private func waitForLocalChange(
        after since: UInt64, atMost limit: Duration? = nil, or other: (@Sendable () async -> Void)? = nil
    ) async throws {
        let store = self.store
        let poll = LiveChanges.Poll(interval: configuration.localPollInterval, clock: context.clock)
        let relayDelay = configuration.relayDelay
        var reoffer: AsyncStream<Void>?
        if let mesh = configuration.wiring.mesh {
            let target = remote.identity.peerID
            reoffer = mesh.ledger.reofferSignal(for: target)
            if mesh.ledger.hasReoffers(for: target) { return }
        }
        var racers: [@Sendable () async throws -> Void] = [
            { try await store.waitForChangeToPassOn(past: since, poll: poll, relayDelay: relayDelay) }
        ]
        if let reoffer { racers.append { for await _ in reoffer { return } } }
        if let other { racers.append { await other() } }
        let waits = racers
        _ = try await context.race(timeout: limit) { try await Race.first(of: waits) }
    }

    /// Offers the peer every document of the local feed from its start, ignoring checkpoints
    /// and floors, and sends what it lacks (anti-entropy). Returns the revisions it stored.
    func sweep() async throws -> Int {
        let before = progress.summary.pushed
        var since: UInt64 = 0
        while !context.stopRequested {
            try Task.checkCancellation()
            let (store, limit) = (store, configuration.batchSize)
            let page = try await BlockingIO.run { [since] in try store.changesWithLeaves(since: since, limit: limit) }
            guard let last = page.last else { break }
            var docs: [DocumentID: [RevisionID]] = [:]
            for (change, leaves) in page where configuration.documentIDs?.contains(change.id) ?? true { docs[change.id] = leaves }
            try await announce(docs)
            since = last.0.sequence
        }
        return progress.summary.pushed - before
    }

    /// Offers the peer again, through revsDiff, the documents skipped for it whose skip no
    /// longer holds (its link to the sender went): it answers what it still lacks.
    private func reofferSkipped() async throws {
        guard let mesh = configuration.wiring.mesh else { return }
        var ids = mesh.ledger.takeReoffers(for: remote.identity.peerID)
        if let only = configuration.documentIDs { ids = ids.filter(only.contains) }
        guard !ids.isEmpty else { return }
        let trees = try store.revisionTrees(Array(ids))
        var docs: [DocumentID: [RevisionID]] = [:]
        for (id, tree) in trees { docs[id] = tree.leaves.map(\.id) }
        context.logger.debug("offering skipped relays again", metadata: ["documents": "\(docs.count)"])
        try await announce(docs)
    }

    /// Pushes a page; returns the revisions left out as relays. Relays are skipped only once
    /// caught up: a peer catching up from this node must get everything this node holds, as
    /// its coverage will take over this node's (docs/architecture.md, "Coverage").
    /// The revisions with blobs are not sent here: the second value sends their blobs, then
    /// them, and the caller runs it beside the pages that follow (nil: the page had none).
    private func push(_ page: [(Change, [RevisionID])], caughtUp: Bool, inline: Bool, trees known: [DocumentID: RevisionTree]?)
        async throws -> (skipped: [SkippedRelay], withBlobs: BlobWork?)
    {
        let target = remote.identity.peerID
        var page = page
        var skipped: [SkippedRelay] = []
        if let ids = configuration.documentIDs { page = page.filter { ids.contains($0.0.id) } }
        // A restricted peer is skipped only for what it may read (every leaf), so that a skip
        // report names nothing else: the rest goes the usual way (dropped, or noticed removed).
        let access = DocumentAccess(configuration.remotePolicy)
        var judged: [DocumentID: RevisionTree] = [:]
        if caughtUp, !access.readsEverything, configuration.wiring.mesh != nil {
            judged = try known ?? store.revisionTrees(page.map(\.0.id))
        }
        page = page.filter { change, leaves in
            if context.peerHeld.peerHolds(change.id, leaves: leaves) { return false }
            guard caughtUp else { return true }
            if !access.readsEverything {
                guard let tree = judged[change.id], access.mayRead(change.id, revisions: leaves, in: tree) else { return true }
            }
            guard let relied = context.relaySkip(change.id, leaves: leaves, to: target) else { return true }
            skipped.append(contentsOf: relied.map { SkippedRelay(sequence: change.sequence, id: change.id, revision: $0) })
            return false
        }
        var inlineBlobs: BlobWork?
        if inline { (page, inlineBlobs) = try await pushInline(page, trees: known, deferBlobs: true) }
        var docs: [DocumentID: [RevisionID]] = [:]
        for (change, leaves) in page { docs[change.id] = leaves }
        let announcedBlobs = try await announce(docs, deferBlobs: true)
        switch (inlineBlobs, announcedBlobs) {
        case (nil, nil): return (skipped, nil)
        case (let one?, nil), (nil, let one?): return (skipped, one)
        case (let first?, let second?):
            return (skipped, {
                try await first()
                try await second()
            })
        }
    }

    /// Sends some revisions' blobs, then the revisions.
    typealias BlobWork = @Sendable () async throws -> Void

    /// Asks the peer which of these leaves it lacks, then sends those (as deltas when smaller).
    /// With `deferBlobs`, the revisions with blobs are returned as work to run later.
    @discardableResult
    private func announce(_ docs: [DocumentID: [RevisionID]], deferBlobs: Bool = false) async throws -> BlobWork? {
        let access = DocumentAccess(configuration.remotePolicy)
        try await sendRemovalNotices(docs, access)
        let docs = try readableByPeer(docs, access)
        guard !docs.isEmpty else { return nil }
        let answer = try await remote.revsDiff(docs)
        let trees = try store.revisionTrees(answer.keys)
        var wires: [(WireRevision, Bool)] = []
        for id in answer.keys.sorted() {
            guard let tree = trees[id], let entry = answer[id] else { continue }
            for rev in entry.missing {
                // Judged again on the tree read now: the document may have changed since.
                guard access.readsEverything || access.mayRead(id, revision: rev, in: tree),
                    let made = WireRevision.make(
                        id: id, revision: rev, tree: tree, receiverHas: Self.readableBases(entry.possibleAncestors, id, tree, access),
                        useDeltas: configuration.deltas, maxHistory: configuration.maxHistory)
                else { continue }
                if !pushFilterAdmits(made.0, id: id, revision: rev, tree: tree) { continue }
                wires.append(made)
            }
        }
        return try await putInChunks(wires, trees: trees, deferBlobs: deferBlobs)
    }

    /// Pushes the page's small single-leaf revisions straight away, without asking revsDiff
    /// first (the other side answers "exists" for any it already holds, "needFull" for a
    /// delta whose base it lacks); returns the rest of the page for the usual path.
    private func pushInline(_ page: [(Change, [RevisionID])], trees known: [DocumentID: RevisionTree]?, deferBlobs: Bool) async throws
        -> ([(Change, [RevisionID])], BlobWork?)
    {
        let trees = try known ?? store.revisionTrees(page.filter { $0.1.count == 1 }.map(\.0.id))
        let access = DocumentAccess(configuration.remotePolicy)
        var wires: [(WireRevision, Bool)] = []
        var rest: [(Change, [RevisionID])] = []
        for (change, leaves) in page {
            guard leaves.count == 1, let tree = trees[change.id],
                let wire = WireRevision.inline(
                    id: change.id, revision: leaves[0], tree: tree, useDeltas: configuration.deltas && access.readsEverything,
                    limit: configuration.inlineLimit)
            else {
                rest.append((change, leaves))
                continue
            }
            // What the peer may not read is never named to it here (the usual path drops it, or
            // sends a removal notice when the peer may have held it).
            guard access.readsEverything || access.mayRead(change.id, revision: leaves[0], in: tree) else {
                rest.append((change, leaves))
                continue
            }
            if pushFilterAdmits(wire, id: change.id, revision: leaves[0], tree: tree) { wires.append((wire, wire.isDelta)) }
        }
        let withBlobs = try await putInChunks(wires, trees: trees, deferBlobs: deferBlobs)
        return (rest, withBlobs)
    }

    /// Tells a peer that takes them which of these documents it may have held and may no
    /// longer read (their bodies changed), so that it purges them.
    private func sendRemovalNotices(_ docs: [DocumentID: [RevisionID]], _ access: DocumentAccess) async throws {
        guard remote.identity.acceptsRemovals, access.policy.read.needsBodies, let ferry = remote as? FerryRemote, !docs.isEmpty
        else { return }
        let trees = try store.revisionTrees(Array(docs.keys))
        let notices = docs.keys.sorted().compactMap { id in trees[id].flatMap { access.removalNotice(id, tree: $0) } }
        guard !notices.isEmpty else { return }
        try await ferry.tellAccessRemoved(notices)
    }

    /// The documents of `docs` that the peer's read policy admits (all of them for a peer
    /// that may read everything, without reading a tree), each with every leaf, as a changes
    /// feed lists them: an unreadable leaf (a deleted branch, say) is named, never sent, and
    /// tells a peer that purged the document that this node knows more than it did.
    private func readableByPeer(_ docs: [DocumentID: [RevisionID]], _ access: DocumentAccess) throws -> [DocumentID: [RevisionID]] {
        guard !access.readsEverything, !docs.isEmpty else { return docs }
        let trees = try store.revisionTrees(Array(docs.keys))
        return docs.filter { id, _ in trees[id].map { access.mayRead(id, tree: $0) } ?? false }
    }

    /// Delta bases the peer says it holds, less any it may not read: a delta against a
    /// revision would reveal what that revision holds.
    static func readableBases(_ bases: [RevisionID], _ id: DocumentID, _ tree: RevisionTree, _ access: DocumentAccess) -> [RevisionID] {
        access.readsEverything ? bases : bases.filter { access.mayRead(id, revision: $0, in: tree) }
    }

    private func pushFilterAdmits(_ wire: WireRevision, id: DocumentID, revision: RevisionID, tree: RevisionTree) -> Bool {
        guard let filter = configuration.pushFilter else { return true }
        let body = tree.revision(revision)?.body.flatMap { try? JSON.parse($0) } ?? [:]
        return filter.admits(FilterInput(id: id, revision: revision, deleted: wire.deleted, body: body))
    }

    /// Sends revisions in requests bounded by count and bytes: first those of documents that
    /// refer to no blob, so that none waits behind another document's blob, then the blobs
    /// the rest refer to, then the rest. A document's revisions stay together.
    /// With `deferBlobs` (a Ferry peer, which serves requests side by side), the revisions
    /// with blobs are returned as work to run later, so that a large blob holds up no other
    /// document; otherwise they are sent here, after their blobs.
    @discardableResult
    private func putInChunks(_ wires: [(WireRevision, Bool)], trees: [DocumentID: RevisionTree], deferBlobs: Bool = false)
        async throws -> BlobWork?
    {
        guard !wires.isEmpty else { return nil }
        var withBlobs = Set<String>()
        for (wire, _) in wires where !withBlobs.contains(wire.id) {
            guard let id = try? DocumentID(wire.id, allowReserved: true), let rev = try? RevisionID(wire.rev),
                let body = trees[id]?.revision(rev)?.body
            else { continue }
            if DocumentStore.mayReferenceBlobs(body) { withBlobs.insert(wire.id) }
        }
        guard !withBlobs.isEmpty else {
            try await putBounded(wires, trees: trees)
            return nil
        }
        try await putBounded(wires.filter { !withBlobs.contains($0.0.id) }, trees: trees)
        let rest = wires.filter { withBlobs.contains($0.0.id) }
        let restTrees = trees.filter { withBlobs.contains($0.key.rawValue) }
        let work: BlobWork = { [self] in
            try await blobs.sendMissing(for: rest.map(\.0), trees: restTrees)
            try await putBounded(rest, trees: restTrees)
        }
        guard deferBlobs && remote is FerryRemote else {
            try await work()
            return nil
        }
        return work
    }

    private func putBounded(_ wires: [(WireRevision, Bool)], trees: [DocumentID: RevisionTree]) async throws {
        guard !wires.isEmpty else { return }
        var bytes = 0
        var chunk: [(WireRevision, Bool)] = []
        for w in wires {
            let size = w.0.content.count
            if !chunk.isEmpty && (chunk.count >= configuration.maxRevisionsPerRequest || bytes + size > configuration.maxBytesPerRequest) {
                try await putChunk(chunk, trees: trees)
                chunk = []
                bytes = 0
            }
            chunk.append(w)
            bytes += size
        }
        if !chunk.isEmpty { try await putChunk(chunk, trees: trees) }
    }

    private func putChunk(_ chunk: [(WireRevision, Bool)], trees: [DocumentID: RevisionTree]) async throws {
        let results = try await remote.storeRevisions(chunk.map(\.0))
        guard results.count == chunk.count else { throw SyncError.protocolViolation("the other side did not answer every revision") }
        var resend: [(WireRevision, Bool)] = []
        var refused = Set<String>()
        for ((wire, usedDelta), result) in zip(chunk, results) {
            switch result.status {
            case .stored, .exists:
                if let id = try? DocumentID(wire.id, allowReserved: true), let rev = try? RevisionID(wire.rev) {
                    context.peerHeld.record(id, rev)
                }
                guard result.status == .stored else { break }
                progress.count {
                    $0.pushed += 1
                    if usedDelta { $0.deltasSent += 1 }
                }
                progress.moved(.push, id: wire.id, rev: wire.rev, deleted: wire.deleted)
            case .needFull:
                guard usedDelta, let id = try? DocumentID(wire.id, allowReserved: true), let rev = try? RevisionID(wire.rev),
                    let tree = trees[id],
                    let full = WireRevision.make(
                        id: id, revision: rev, tree: tree, receiverHas: [], useDeltas: false, maxHistory: configuration.maxHistory)
                else {
                    progress.reject(
                        .push, id: wire.id, rev: wire.rev, deleted: wire.deleted,
                        Rejection(stage: .peer, reason: "peer could not rebuild the revision"))
                    continue
                }
                resend.append(full)
            case .rejected(let rejection):
                progress.reject(.push, id: wire.id, rev: wire.rev, deleted: wire.deleted, rejection)
                if rejection.stage == .policy { refused.insert(wire.id) }
            }
        }
        if !resend.isEmpty { try await putChunk(resend, trees: trees) }
        try await checkAccess(ofRefused: refused)
    }

    /// Asks the peer (`accessCheck`) whether this node may still read the documents whose
    /// revisions its write policy refused, and purges those it names. Such a revision is this
    /// node's own edit of a document that, as the peer holds it, is not this node's to hold (an
    /// admin moved it to another ward meanwhile, say): every node holding the document refuses
    /// it, and without asking this node would keep it, and offer it again, for ever.
    private func checkAccess(ofRefused refused: Set<String>) async throws {
        guard !refused.isEmpty, configuration.checksHeldAccess, configuration.direction.pulls, remote.identity.acceptsRemovals,
            AccessRemovalApplier.mayTell(writer: configuration.remotePolicy, own: configuration.ownRead()),
            remote.identity.allowsPull, let ferry = remote as? FerryRemote
        else { return }
        let ids = refused.compactMap { try? DocumentID($0) }
        let trees = try store.revisionTrees(ids)
        // Only what the peer may read and write as held here: the list names its revisions.
        let peer = DocumentAccess(configuration.remotePolicy)
        let held = ids.sorted().compactMap { id -> AccessCheckRequest.HeldDocument? in
            guard let tree = trees[id], !tree.isEmpty, peer.mayRead(id, tree: tree),
                DocumentAccess.admitsDocument(configuration.remotePolicy.write, id, tree: tree)
            else { return nil }
            return AccessCheckRequest.HeldDocument(id: id, tree: tree)
        }
        guard !held.isEmpty else { return }
        let notices = try await ferry.checkAccess(held)
        guard !notices.isEmpty else { return }
        progress.accessRemoved(try AccessRemovalApplier.apply(notices, writer: configuration.remotePolicy, own: configuration.ownRead(), store: store))
    }
}
