import FerryCore
import FerryStore

/// The responder's answer to `changes`: one page of the feed the peer may read, with small
/// fresh revisions inline, or a long-poll that waits for a commit worth sending.
extension ResponderSession {
    /// Changes after `since`, with every leaf; hidden documents are skipped but `lastSeq`
    /// still advances past them. A `live` request waits up to `timeoutMs` for a change.
    func changes(_ request: Message) async throws -> Message {
        try requirePull()
        let asked = ChangesRequest(try request.json())
        let since = asked.since
        let limit = Int(min(max(1, asked.limit), 5000))
        let live = asked.live
        let timeout = Duration.milliseconds(min(max(0, asked.timeoutMs), 600_000))
        let docIDs = asked.docIDs.map(Set.init)
        // Small fresh revisions ride along in the reply, so a caught-up peer needs no getRevs.
        let inlineLimit = Int(min(max(0, asked.inline ?? 0), SyncProtocol.maxInlineBytes))
        let inlineDeltas = !asked.noDeltas
        let wait = min(timeout, options.maxLongPoll)
        let elapsed = Stopwatch.start(on: responder.clock).elapsed
        var scanned = since
        // A catch-up page (up to `limit` rows with their trees and bodies) is read on threads
        // made for blocking work; a live request's read, of a change or two, in place.
        var page = live ? try readChanges(since: since, limit: limit) : try await readChangesOffPool(since: since, limit: limit)
        var rowsRead = page.count
        var entries: [ChangeEntry] = []
        var skipped: [SkippedRelay] = []
        var removed: [RemovalNotice] = []
        // Documents skipped earlier whose skip no longer holds (docs/protocol.md §6.6).
        var reoffered = try reofferedEntries(at: since, docIDs: docIDs)
        var readOn = ReplicatorTuning.maxPagesReadOn
        // The echo of what this peer pushed in earlier sessions (a connection's own pushes
        // are left out through `peerHeld`).
        let echoes = try echoKey.map { try store.echoRanges($0) } ?? EchoRanges()
        while true {
            if page.isEmpty && live && reoffered.isEmpty {
                page = try await waitForChanges(since: scanned, limit: limit, for: wait - elapsed())
                rowsRead += page.count
                reoffered = try reofferedEntries(at: scanned, docIDs: docIDs)
            }
            entries = try changeEntries(
                page, docIDs: docIDs, inlineLimit: inlineLimit, inlineDeltas: inlineDeltas, skipRelays: live, echoes: echoes,
                skipped: &skipped, removed: &removed)
            scanned = page.last?.0.sequence ?? scanned
            // A full page whose every entry is left out (hidden from the peer, or the echo of
            // its own push) is not the end of the feed: read on here, for a bounded number of
            // pages, rather than answer nothing and cost the peer a round trip per page.
            if entries.isEmpty, reoffered.isEmpty, removed.isEmpty, page.count == limit, readOn > 0 {
                readOn -= 1
                page = live ? try readChanges(since: scanned, limit: limit) : try await readChangesOffPool(since: scanned, limit: limit)
                rowsRead += page.count
                continue
            }
            // A live wait answers only with something to send: a short page whose every
            // change is hidden or already held by the peer (in a mesh, the echo of what it
            // just sent us) goes on waiting from past it, instead of costing the peer a
            // round trip per change for nothing.
            guard live, entries.isEmpty, reoffered.isEmpty, removed.isEmpty, !page.isEmpty, page.count < limit, elapsed() < wait else { break }
            page = []  // the wait reads the next page, at once if a commit is already past it
        }
        if !reoffered.isEmpty {
            for i in reoffered.indices { reoffered[i].sequence = scanned }
            entries = reoffered + entries
        }
        // A short page ends the feed as it stood: the peer need not ask again before going live.
        var answer = ChangesReply(changes: entries, lastSeq: scanned, caughtUp: page.count < limit)
        // The rest of the feed, for the peer's progress total: counted only where it tells
        // nothing the peer may not know (it reads everything, unfiltered).
        if !live, !answer.caughtUp, docIDs == nil, policy.read.admitsEverything {
            answer.pending = try await BlockingIO.run { [scanned, rowsRead] in self.pendingChanges(after: scanned, since: since, rowsRead: rowsRead) }
        }
        answer.skipped = Array(skipped.prefix(SkippedRelay.maxReported))
        answer.skipsLost = skipped.count > SkippedRelay.maxReported
        answer.removed = Array(removed.prefix(RemovalNotice.maxPerMessage))
        return reply(request, answer.json)
    }

    /// A page of the feed with each document's tree, winner bodies up to the cache's limit
    /// restored: the entries, their inline revisions and the getRevs that follow are all
    /// answered from this one read (`ResponderTreeCache`).
    func readChanges(since: UInt64, limit: Int) throws -> [(Change, RevisionTree)] {
        let page = try store.changesWithTrees(since: since, limit: limit, winnerBodiesUpTo: ResponderTreeCache.maxBodyBytes)
        let purges = store.contentVersion.purges
        recentTrees.withLock { $0.keep(page, purges: purges) }
        return page
    }

    /// `readChanges` on `BlockingIO` threads.
    func readChangesOffPool(since: UInt64, limit: Int) async throws -> [(Change, RevisionTree)] {
        try await BlockingIO.run { try self.readChanges(since: since, limit: limit) }
    }

    /// The feed's length past `scanned`, for the peer's progress total. Counting it is a scan
    /// of the rest of the feed (7 % of a bulk pull's serving CPU when done for every page), so
    /// a request that follows the last one on from where it ended subtracts what it read, and
    /// the count is taken again every `pendingRecount` pages (writes made meanwhile show then).
    func pendingChanges(after scanned: UInt64, since: UInt64, rowsRead: Int) -> Int? {
        let reused = pendingEstimate.withLock { estimate -> Int? in
            guard let e = estimate, e.after == since, e.reused < Self.pendingRecount else { return nil }
            estimate = PendingEstimate(after: scanned, count: max(0, e.count - rowsRead), reused: e.reused + 1)
            return estimate?.count
        }
        if let reused { return reused }
        guard let counted = try? store.changeCount(after: scanned) else { return nil }
        pendingEstimate.withLock { $0 = PendingEstimate(after: scanned, count: counted, reused: 0) }
        return counted
    }

    static let pendingRecount = ReplicatorTuning.pendingRecount

    /// The changes entries the peer may see, with small revisions inlined. With `skipRelays`
    /// (live requests only: a peer catching up must get everything, as its coverage will take
    /// over this node's), what the peer gets over its own link to the sender is left out and
    /// added to `skipped`. Entries in `echoes` hold a single leaf the peer pushed: left out.
    func changeEntries(
        _ page: [(Change, RevisionTree)], docIDs: Set<String>?, inlineLimit: Int, inlineDeltas: Bool, skipRelays: Bool,
        echoes: EchoRanges = EchoRanges(), skipped: inout [SkippedRelay], removed: inout [RemovalNotice]
    ) throws -> [ChangeEntry] {
        var entries: [ChangeEntry] = []
        // Read per page, after any wait: a policy changed during a long-poll applies to its answer.
        let policy = self.policy
        let access = DocumentAccess(policy)
        let readRule = policy.read
        let rules = policy.groupRules?.version
        func skipsRelay(_ change: Change, _ leaves: [RevisionID]) -> Bool {
            guard skipRelays, let relied = relaySkip(change.id, leaves: leaves, rules: rules) else { return false }
            skipped.append(contentsOf: relied.map { SkippedRelay(sequence: change.sequence, id: change.id, revision: $0) })
            return true
        }
        // A peer that reads everything is skipped before anything is read; a restricted one
        // only for what it may read (every leaf), so that a skip report names nothing else.
        var candidates: [(Change, [RevisionID])] = []
        var pageTrees: [DocumentID: RevisionTree] = [:]
        for (change, tree) in page {
            let leaves = tree.leaves.map(\.id)
            guard (docIDs?.contains(change.id.rawValue) ?? true) && !peerHeld.peerHolds(change.id, leaves: leaves) else { continue }
            if leaves.count == 1 && echoes.contains(change.sequence) { continue }
            if access.readsEverything && skipsRelay(change, leaves) { continue }
            candidates.append((change, leaves))
            pageTrees[change.id] = tree
        }
        // The page's trees hold the winner's body unless it is large: only those are read again.
        var trees: [DocumentID: RevisionTree] = [:]
        var reread = Set<DocumentID>()
        if !candidates.isEmpty && (DocumentAccess.needsBodies(readRule) || inlineLimit > 0) {
            for (change, _) in candidates {
                if let tree = pageTrees[change.id], tree.winnerIndex.map({ tree.revisions[$0].body != nil }) ?? true {
                    trees[change.id] = tree
                } else {
                    reread.insert(change.id)
                }
            }
            if !reread.isEmpty { trees.merge(try store.revisionTrees(reread)) { _, fresh in fresh } }
        }
        // Documents found readable as the kept trees hold them: getRevs need not judge them again.
        var readable: [(id: DocumentID, sequence: UInt64)] = []
        defer {
            if !readable.isEmpty {
                let fingerprint = readRule.fingerprint
                recentTrees.withLock { $0.markReadable(readable, under: fingerprint) }
            }
        }
        for (change, leaves) in candidates {
            if !access.readsEverything {
                if DocumentAccess.needsBodies(readRule) {
                    guard let tree = trees[change.id] else { continue }
                    guard access.mayRead(change.id, tree: tree) else {
                        // A document it may have held, no longer readable: it learns so and purges it.
                        if acceptsRemovals, let notice = access.removalNotice(change.id, tree: tree) { removed.append(notice) }
                        continue
                    }
                    if !reread.contains(change.id) { readable.append((change.id, change.sequence)) }
                    if skipRelays && access.mayRead(change.id, revisions: leaves, in: tree, documentJudged: true) && skipsRelay(change, leaves) {
                        continue
                    }
                } else if !access.mayRead(change.id, body: nil) {
                    continue
                } else if skipsRelay(change, leaves) {
                    continue
                }
            }
            var entry = ChangeEntry(
                sequence: change.sequence, id: change.id.rawValue, leaves: leaves.map(\.description), deleted: change.deleted,
                size: Int64(change.bodySize))
            if inlineLimit > 0, leaves.count == 1, let tree = trees[change.id],
                let inline = WireRevision.inline(id: change.id, revision: leaves[0], tree: tree, useDeltas: inlineDeltas && access.readsEverything, limit: inlineLimit)?.inlineJSON
            {
                entry.inline = inline
                if !access.readsEverything { grantBlobs(of: tree.revision(leaves[0])?.body) }
                counts.withLock { $0.pushed += 1 }
            }
            entries.append(entry)
        }
        return entries
    }

    func waitForChanges(since: UInt64, limit: Int, for wait: Duration) async throws -> [(Change, RevisionTree)] {
        let store = self.store
        let clock = responder.clock
        let pollInterval = options.pollInterval
        let relayDelay = options.relayDelay
        let poll = LiveChanges.Poll(interval: pollInterval, clock: clock)
        // A re-offer due to the peer ends the wait too (subscribed before the check).
        var reoffer: AsyncStream<Void>?
        if let mesh, let peer = peerID {
            reoffer = mesh.ledger.reofferSignal(for: peer)
            if mesh.ledger.hasReoffers(for: peer) { return [] }
        }
        let page = try await firstOf({ () async throws -> [(Change, RevisionTree)] in
            try await store.waitForChangeToPassOn(past: since, poll: poll, relayDelay: relayDelay)
            return try self.readChanges(since: since, limit: limit)
        }, timeout: wait, clock: clock, stop: reoffer)
        return page ?? []
    }
}
