import FerryCore
import FerryStore

/// One page of the other side's changes turned into fetch requests, with its first two
/// chunks already asked for, so that the other side prepares them while the previous page
/// is inserted; and the trust boundary's judging of each chunk as it arrives.
struct PullPlan: Sendable {
    let trees: [DocumentID: RevisionTree]
    let pipeline: IncomingPipeline
    /// Revisions that came inline in the changes reply.
    let inlined: [WireRevision]
    /// Fetch requests of at most `maxRevisionsPerRequest` revisions each.
    let chunks: [[RevisionRequest]]
    /// `chunks[0]` asked for and judged as it arrives.
    private(set) var firstChecked: Task<CheckedChunk, any Error>?
    /// The reply to `chunks[1]`, asked when planned.
    private(set) var secondFetched: Task<[WireRevision], any Error>?

    /// Reads the trees of a page's documents and asks for the first chunks of what is missing.
    /// Planned before the previous page is fully inserted, a tree may miss a revision of that
    /// page: the request then names fewer ancestors, which costs bytes, never correctness.
    init(_ changes: [RemoteChange], puller: Puller) throws {
        let configuration = puller.configuration
        let store = puller.context.store
        var wanted = changes
        if let ids = configuration.documentIDs { wanted = wanted.filter { ids.contains($0.id) } }
        let trees = try store.revisionTrees(wanted.map(\.id))
        var requests: [RevisionRequest] = []
        var inlined: [WireRevision] = []
        for change in wanted {
            let tree = trees[change.id]
            for rev in change.leaves where !(tree?.contains(rev) ?? false) {
                // Carried in the changes reply: judged below like any fetched revision.
                if let inline = change.inline {
                    inlined.append(inline)
                    continue
                }
                let known = tree?.deltaBases(below: rev.generation) ?? []
                requests.append(RevisionRequest(id: change.id, rev: rev, ancestors: known))
            }
        }
        let size = configuration.maxRevisionsPerRequest
        chunks = stride(from: 0, to: requests.count, by: size).map { Array(requests[$0..<min($0 + size, requests.count)]) }
        pipeline = IncomingPipeline(
            policy: configuration.remotePolicy, filter: configuration.pullFilter, maxBodyBytes: store.options.maxBodyBytes)
        self.trees = trees
        self.inlined = inlined
        if let first = chunks.first { firstChecked = judge(puller.fetch(first, deltas: configuration.deltas), deltas: configuration.deltas) }
        if chunks.count > 1 { secondFetched = puller.fetch(chunks[1], deltas: configuration.deltas) }
    }

    func cancel() {
        firstChecked?.cancel()
        secondFetched?.cancel()
    }

    /// Drops a page planned ahead but not used: stops the planning, and the requests a
    /// finished plan already has in flight.
    static func discard(_ planning: Task<PullPlan?, any Error>) {
        planning.cancel()
        // Unowned: waits only for a planning task cancelled just above, then cancels the requests it started.
        Task { if case let plan?? = try? await planning.value { plan.cancel() } }
    }

    /// A chunk judged as soon as its reply arrives.
    func judge(_ reply: Task<[WireRevision], any Error>, deltas: Bool) -> Task<CheckedChunk, any Error> {
        let plan = self
        return Task {
            let revisions = try await withTaskCancellationHandler { try await reply.value } onCancel: { reply.cancel() }
            return Self.check(revisions, plan: plan, deltas: deltas)
        }
    }

    static func check(_ revs: [WireRevision], plan: PullPlan, deltas: Bool) -> CheckedChunk {
        check(revs, pipeline: plan.pipeline, trees: plan.trees, deltas: deltas)
    }

    /// Judges each revision of a chunk. It touches neither the store nor the network, so
    /// the next chunk is judged while this one is inserted.
    static func check(
        _ revs: [WireRevision], pipeline: IncomingPipeline, trees: [DocumentID: RevisionTree], deltas: Bool
    ) -> CheckedChunk {
        var checked = CheckedChunk()
        for wire in revs {
            if wire.missing { continue }  // superseded; a later change brings the new leaf
            if wire.isDelta { checked.deltas += 1 }
            let existing = (try? DocumentID(wire.id, allowReserved: true)).flatMap { trees[$0] }
            let outcome = pipeline.check(wire, existing: existing) { id, base in
                trees[id]?.revision(base)?.body.flatMap { try? JSON.parse($0).objectValue }
            }
            switch outcome {
            case .accepted(let rev): checked.accepted.append(rev)
            case .rejected(let id, let rev, let rejection):
                checked.rejected.append((id, rev, wire.deleted, rejection, wire.history))
            case .needFull(let id, let rev):
                if deltas, let docID = try? DocumentID(id, allowReserved: true), let revID = try? RevisionID(rev) {
                    checked.retryFull.append(RevisionRequest(id: docID, rev: revID, ancestors: []))
                } else {
                    checked.rejected.append(
                        (id, rev, wire.deleted, Rejection(stage: .structure, reason: "body could not be reconstructed"), wire.history))
                }
            }
        }
        return checked
    }
}

/// The trust boundary's verdicts on one chunk, reached apart from storing it.
struct CheckedChunk: Sendable {
    var accepted: [IncomingRevision] = []
    /// Refused revisions, with their histories as sent (newest first).
    var rejected: [(id: String, rev: String, deleted: Bool, rejection: Rejection, history: [String])] = []
    /// Deltas that could not be applied, to be fetched again in full.
    var retryFull: [RevisionRequest] = []
    var deltas = 0
}
