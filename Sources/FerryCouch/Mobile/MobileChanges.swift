import FerryBLIP
import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation

/// A pull's subscription (`subChanges`): what the client asked for.
struct MobileSubscription: Sendable {
    var since: UInt64 = 0
    var continuous = false
    var batch = 200
    var activeOnly = false
    var docIDs: Set<String>?
    /// `sync_gateway/bychannel`: documents whose `channels` names one of these.
    var channels: Set<String>?

    init(_ request: BLIPMessage) throws(MobileRequestError) {
        if let s = request["since"], !s.isEmpty {
            // JSON-encoded; this node's sequences are integers (a quoted one is accepted too).
            let text = s.hasPrefix("\"") && s.hasSuffix("\"") && s.count >= 2 ? String(s.dropFirst().dropLast()) : s
            guard let n = UInt64(text) else { throw MobileRequestError(code: 400, "'since' must be a sequence this node gave, not \(s)") }
            since = n
        }
        continuous = MobileSession.bool(request["continuous"])
        if let b = request["batch"] {
            guard let n = Int(b), n > 0 else { throw MobileRequestError(code: 400, "'batch' must be a positive number") }
            batch = min(n, 1000)
        }
        activeOnly = MobileSession.bool(request["activeOnly"])
        revocations = MobileSession.bool(request["revocations"])
        if let filter = request["filter"] {
            guard filter == "sync_gateway/bychannel" else {
                throw MobileRequestError(code: 400, "unknown filter \(filter): this node knows sync_gateway/bychannel")
            }
            let names = (request["channels"] ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            guard !names.isEmpty else { throw MobileRequestError(code: 400, "sync_gateway/bychannel needs 'channels'") }
            channels = Set(names)
        }
        if !request.body.isEmpty, let body = try? JSON.parse(request.body), case .array(let ids)? = body["docIDs"] {
            docIDs = Set(ids.compactMap(\.stringValue))
        }
    }

    /// Whether a winner body names one of the subscribed channels (`channels`: a string or strings).
    func inChannels(_ body: JSON?) -> Bool {
        guard let channels else { return true }
        switch body?["channels"] {
        case .string(let s)?: return channels.contains(s)
        case .array(let a)?: return a.contains { $0.stringValue.map(channels.contains) ?? false }
        default: return false
        }
    }

    var needsBody: Bool { channels != nil }

    /// Whether the client asked to hear of documents it may no longer read (Couchbase Lite
    /// does when it purges them automatically).
    var revocations = false
}

extension MobileSession {
    /// One change offered to the client.
    struct Offer: Sendable {
        let sequence: UInt64
        let id: DocumentID
        let revision: RevisionID
        let deleted: Bool
        /// Sync Gateway's removal flags: 2, the client may no longer read the document; 4, it
        /// left the channels subscribed to. The app purges it; the revision named is the last
        /// one the client could read, so the notice tells it nothing new.
        var removal: Int? = nil
    }

    /// `subChanges`: answers at once, then sends the changes after `since` in `changes`
    /// messages of at most `batch`, each revision the client wants as a `rev`, an empty
    /// `changes` once caught up, and (continuous) every later change as it commits.
    func subChanges(_ request: BLIPMessage) async throws {
        let subscription = try MobileSubscription(request)
        guard claimSubscription() else {
            throw MobileRequestError(domain: "BLIP", code: 409, "this connection already has a pull subscription")
        }
        respond(to: request)
        var cursor = subscription.since
        var caughtUp = false
        // Batches whose revisions are on their way: several travel while the next is offered,
        // so the app's inserts (it commits in batches, then answers) overlap the offers.
        var inFlight: [Task<Void, any Error>] = []
        defer { for t in inFlight { t.cancel() } }
        // The policy the changes up to `cursor` were judged by: for a pull that resumes from
        // the app's checkpoint, the read rule kept with it, so a change of the user's rules
        // while the app was away is judged as if it had been connected.
        var judgedBy = principal
        if cursor > 0, let kept = checkpointReadRule() { judgedBy = principal.readingBy(kept) }
        feedJudgedBy.withLock { $0 = judgedBy.policy.read }
        while true {
            let policyChange = principalChange.withLock { $0 }
            if principal != judgedBy {
                try await judgeAgain(upTo: cursor, judgedBy: judgedBy, subscription, inFlight: &inFlight)
                judgedBy = principal
                feedJudgedBy.withLock { $0 = judgedBy.policy.read }
            }
            // A catch-up page is read off the cooperative pool; once caught up, a commit's
            // change or two in place.
            let page = try await storeWork(bulk: !caughtUp) { [cursor] in
                try self.database.store.changeEntries(after: cursor, limit: subscription.batch)
            }
            var offers: [Offer] = []
            for entry in page {
                cursor = entry.change.sequence
                if let offer = try offer(entry, subscription) { offers.append(offer) }
            }
            try await send(offers, inFlight: &inFlight)
            if page.count < subscription.batch {
                while !inFlight.isEmpty { try await inFlight.removeFirst().value }
                if !caughtUp {
                    caughtUp = true
                    _ = try await self.request(Self.changesMessage([]))
                }
                guard subscription.continuous else { return }
                try await waitForCommit(past: cursor, orChangeOf: policyChange)
            }
        }
    }

    /// Offers changes to the client and sends the revisions it wants, at most
    /// `batchesInFlight` batches of them travelling at once.
    func send(_ offers: [Offer], inFlight: inout [Task<Void, any Error>]) async throws {
        guard !offers.isEmpty else { return }
        // Offered now, in order; the app's answer is awaited beside the other batches', so the
        // app always has the next offer queued behind the revisions it is inserting.
        let pending = queueRequest(Self.changesMessage(offers))
        inFlight.append(
            Task {
                let reply = try await pending.wait().get()
                if let e = reply.error { throw MobileClose(code: .unexpectedServerError, reason: "the client refused changes: \(e.message)") }
                let wanted = Self.wanted(offers, reply: reply)
                try await self.sendRevisions(wanted, maxHistory: Int(reply["maxHistory"] ?? "") ?? 20)
            })
        while inFlight.count > Self.batchesInFlight { try await inFlight.removeFirst().value }
    }

    /// After the user's policy changed mid-feed: the changes already passed are judged again,
    /// so a document the user may no longer read is removed from the app (when it asked for
    /// revocations) and one it may now read is offered, as if it had just changed.
    func judgeAgain(upTo cursor: UInt64, judgedBy old: CouchPrincipal, _ subscription: MobileSubscription, inFlight: inout [Task<Void, any Error>]) async throws {
        var after: UInt64 = 0
        while after < cursor {
            let page = try await storeWork(bulk: true) { [after] in try self.database.store.changeEntries(after: after, limit: subscription.batch) }
            var offers: [Offer] = []
            for entry in page where entry.change.sequence <= cursor {
                after = entry.change.sequence
                let id = entry.change.id
                if let ids = subscription.docIDs, !ids.contains(id.rawValue) { continue }
                if entry.change.deleted { continue }
                let before = try database.readable(entry, principal: old, needBody: subscription.needsBody)
                let wasInReach = before.admitted && (!subscription.needsBody || subscription.inChannels(before.document?.body))
                let now = try database.readable(entry, principal: principal, needBody: subscription.needsBody)
                let isInReach = now.admitted && (!subscription.needsBody || subscription.inChannels(now.document?.body))
                if wasInReach && !isInReach && subscription.revocations && Self.liteCoreAccepts(entry.change.revision) {
                    offers.append(Offer(sequence: entry.change.sequence, id: id, revision: entry.change.revision, deleted: false, removal: 2))
                } else if !wasInReach && isInReach, let offer = try offer(entry, subscription) {
                    offers.append(offer)
                }
            }
            try await send(offers, inFlight: &inFlight)
            if page.count < subscription.batch || page.last.map({ $0.change.sequence >= cursor }) ?? true { break }
        }
    }

    /// Batches of revisions sent and not yet all stored by the app, at most.
    static let batchesInFlight = 4

    /// Waits for a commit past `sequence`, or for the principal's policy to change; throws
    /// once the connection or the node ends first.
    func waitForCommit(past sequence: UInt64, orChangeOf policy: Latch<Void>) async throws {
        let store = database.store, shutdown = database.shutdown, closed = self.closed
        let committed = try await Race.first(of: [
            { @Sendable () async throws -> Bool in
                _ = try? await policy.wait()
                return true
            },
            { @Sendable () async throws -> Bool in
                try await store.waitForCommit(past: sequence)
                return true
            },
            { @Sendable () async throws -> Bool in
                await shutdown.wait()
                return false
            },
            { @Sendable () async throws -> Bool in
                _ = try? await closed.wait()
                return false
            },
        ])
        if !committed || Task.isCancelled { throw MobileClose(code: .goingAway, reason: "the connection ended") }
    }

    /// The change an entry offers this client, or nil when it is not for it.
    func offer(_ entry: DocumentEntry, _ subscription: MobileSubscription) throws -> Offer? {
        let id = entry.change.id
        if let ids = subscription.docIDs, !ids.contains(id.rawValue) { return nil }
        if subscription.activeOnly && entry.change.deleted { return nil }
        let (admitted, document) = try database.readable(entry, principal: principal, needBody: subscription.needsBody)
        guard admitted else { return subscription.revocations ? removal(entry, flag: 2, subscription) : nil }
        if subscription.needsBody, !subscription.inChannels(document?.body) {
            return subscription.revocations ? removal(entry, flag: 4, subscription) : nil
        }
        guard Self.liteCoreAccepts(entry.change.revision) else {
            logger.notice("change not offered: Couchbase Lite cannot hold its revision ID", metadata: ["doc": "\(id)", "rev": "\(entry.change.revision)"])
            return nil
        }
        return Offer(sequence: entry.change.sequence, id: id, revision: entry.change.revision, deleted: entry.change.deleted)
    }

    /// A removal notice for a document the change took out of the client's reach: only when
    /// the revision it replaced was within it (readable, and in the channels), so the client
    /// may have held it; nil otherwise, and for documents never in reach nothing is said.
    func removal(_ entry: DocumentEntry, flag: Int, _ subscription: MobileSubscription) -> Offer? {
        let id = entry.change.id
        guard !CouchDatabase.isNodeInternal(id), let winner = entry.tree.winner, let p = entry.tree.index(of: winner.id),
            let parentIndex = entry.tree.revisions[p].parent
        else { return nil }
        let parent = entry.tree.revisions[parentIndex]
        guard !parent.deleted, let bytes = parent.body, let body = try? JSON.parse(bytes) else { return nil }
        guard principal.policy.read.admits(id: id, body: body), subscription.inChannels(body), Self.liteCoreAccepts(parent.id) else { return nil }
        return Offer(sequence: entry.change.sequence, id: id, revision: parent.id, deleted: false, removal: flag)
    }

    /// Couchbase Lite keeps a revision ID's hash as binary: lowercase hex of at most 32 bytes.
    static func liteCoreAccepts(_ rev: RevisionID) -> Bool {
        let h = rev.hashText.utf8
        return h.count % 2 == 0 && h.count <= 64 && h.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }
    }

    static func changesMessage(_ offers: [Offer]) -> BLIPMessage {
        let rows: [JSON] = offers.map { o in
            var row: [JSON] = [.int(Int64(o.sequence)), .string(o.id.rawValue), .string(o.revision.description)]
            if let removal = o.removal { row.append(.int(Int64(removal))) } else if o.deleted { row.append(1) }
            return .array(row)
        }
        return .request("changes", body: JSON.array(rows).canonicalBytes, flags: offers.isEmpty ? [] : [.compressed])
    }

    /// The offers the client asked for, each with the ancestors it already holds.
    static func wanted(_ offers: [Offer], reply: BLIPMessage) -> [(Offer, Set<String>)] {
        guard case .array(let answers)? = try? JSON.parse(reply.body) else { return [] }
        var out: [(Offer, Set<String>)] = []
        for (offer, answer) in zip(offers, answers) where offer.removal == nil {
            guard case .array(let known) = answer else { continue }  // 0 or null: not wanted
            out.append((offer, Set(known.compactMap(\.stringValue))))
        }
        return out
    }

    /// Sends each wanted revision as a `rev` and waits for the client to store them all.
    func sendRevisions(_ wanted: [(Offer, Set<String>)], maxHistory: Int) async throws {
        guard !wanted.isEmpty else { return }
        let ids = wanted.map(\.0.id)
        let trees = try await storeWork(bulk: ids.count >= Self.bulkDocuments) { try self.database.store.revisionTrees(ids) }
        let access = DocumentAccess(principal.policy)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (offer, known) in wanted {
                guard let tree = trees[offer.id], tree.contains(offer.revision), access.mayRead(offer.id, revision: offer.revision, in: tree),
                    let message = (try? revisionMessage(offer, tree: tree, known: known, maxHistory: maxHistory)) ?? nil
                else {
                    try post(
                        .request(
                            "norev",
                            [("id", offer.id.rawValue), ("rev", offer.revision.description), ("sequence", String(offer.sequence)), ("error", "404")]))
                    continue
                }
                // A revision without blobs goes without asking a reply (as the protocol allows):
                // the app paces the feed by when it answers `changes`, and a reply would only
                // hold this side until its insert commits. One with blobs waits for the app
                // to have fetched them.
                if message.flags.contains(.noReply) {
                    try post(message)
                    continue
                }
                group.addTask {
                    let reply = try await self.request(message)
                    if let e = reply.error {
                        self.logger.notice(
                            "Couchbase Lite refused a revision",
                            metadata: ["doc": "\(offer.id)", "rev": "\(offer.revision)", "error": "\(e.domain) \(e.code) \(e.message)"])
                    }
                }
            }
            try await group.waitForAll()
        }
    }

    /// A `rev` message: the body without CouchDB's `_` members, its history back to the
    /// first revision the client holds (at most `maxHistory`), the sequence it came from.
    func revisionMessage(_ offer: Offer, tree: RevisionTree, known: Set<String>, maxHistory: Int) throws -> BLIPMessage? {
        guard let revision = tree.revision(offer.revision), let stored = revision.body else { return nil }
        // A stored body is canonical JSON with no `_` members; one without blobs (or
        // attachments, which are blobs) goes out as stored, with no parse and no re-encoding.
        let body: [UInt8]
        let withBlobs: Bool
        if DocumentStore.mayReferenceBlobs(stored) {
            guard let view = try database.view(of: offer.id, revision: offer.revision, in: tree) else { return nil }
            let fields = try exportBlobs(view)
            body = JSON.object(fields).canonicalBytes
            withBlobs = fields["_attachments"] != nil || Self.holdsBlob(.object(fields))
        } else {
            body = stored
            withBlobs = false
        }
        var history: [String] = []
        for r in tree.history(of: offer.revision).dropFirst() {
            guard Self.liteCoreAccepts(r), history.count < max(1, maxHistory) else { break }
            history.append(r.description)
            if known.contains(r.description) { break }
        }
        var properties: [(String, String)] = [
            ("id", offer.id.rawValue), ("rev", offer.revision.description), ("sequence", String(offer.sequence)),
        ]
        if !history.isEmpty { properties.append(("history", history.joined(separator: ","))) }
        if revision.deleted { properties.append(("deleted", "1")) }
        return .request("rev", properties, body: body, flags: withBlobs ? [.compressed] : [.compressed, .noReply])
    }
}

extension CouchPrincipal {
    /// The same principal reading by `rule` instead (what it was allowed when an app's
    /// checkpoint was written).
    func readingBy(_ rule: AccessRule) -> CouchPrincipal {
        var policy = self.policy
        guard policy.read != rule else { return self }
        policy.read = rule
        return .user(name: name, policy: policy)
    }
}
