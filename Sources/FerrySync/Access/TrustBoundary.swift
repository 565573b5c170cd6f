import FerryCore
import FerryStore

/// Why an incoming revision was not stored.
public struct Rejection: Sendable, Equatable, CustomStringConvertible {
    public let stage: Stage
    public let reason: String

    /// The trust-boundary stage that refused the revision, in the order they run.
    public enum Stage: String, Sendable {
        case structure, digest, policy, filter, validation
        /// Refused by the peer, which named no stage this side knows.
        case peer
    }


    public var description: String { "\(stage.rawValue): \(reason)" }
}

extension Rejection {
    /// A store's refusal inside the insert: validation, or structure for anything else.
    init(storeError e: StoreError) {
        self.init(stage: e.isValidationRefusal ? .validation : .structure, reason: e.description)
    }
}

/// The trust boundary for incoming revisions: structure, digest, the peer's write policy,
/// the pull filter, then (in the store) validation. Nothing unchecked reaches a filter; a
/// revision ID made elsewhere (not Ferry's form) skips only the digest, which it cannot pass.
struct IncomingPipeline: Sendable {
    let policy: PeerPolicy
    let filter: RevisionFilter?
    let maxBodyBytes: Int

    /// The verdict on one incoming revision.
    enum Outcome {
        case accepted(IncomingRevision)
        case rejected(id: String, rev: String, Rejection)
        /// The delta could not be applied; ask for the full body.
        case needFull(id: String, rev: String)
    }

    /// `existing` is the document's tree as held (the write policy judges a revision by what
    /// it could replace as well as by what it writes).
    func check(
        _ wire: WireRevision, existing: RevisionTree? = nil, baseBody: (DocumentID, RevisionID) -> [String: JSON]?
    ) -> Outcome {
        func reject(_ stage: Rejection.Stage, _ reason: String) -> Outcome {
            .rejected(id: wire.id, rev: wire.rev, Rejection(stage: stage, reason: reason))
        }
        // 1. Structure.
        let id: DocumentID
        do { id = try DocumentID(wire.id, allowReserved: true) } catch { return reject(.structure, error.description) }
        if ReservedNamespace.refusesReplicated(id) {
            return reject(.structure, "\"\(id)\" is in the reserved \(ReservedNamespace.prefix) namespace")
        }
        let rev: RevisionID
        var history: [RevisionID] = []
        do {
            rev = try RevisionID(wire.rev)
            for h in wire.history { history.append(try RevisionID(h)) }
        } catch { return reject(.structure, error.description) }
        if rev.generation == 1 ? !history.isEmpty : history.isEmpty {
            return reject(.structure, "history of \(rev) does not fit its generation")
        }
        for (i, a) in history.enumerated() where a.generation != rev.generation - 1 - i {
            return reject(.structure, "history generations are not consecutive at \(a)")
        }
        // A delta's result can be checked only against a Ferry digest: a revision in another
        // form travels whole (senders never delta-encode one).
        if wire.isDelta && !rev.isFerryDigest { return .needFull(id: wire.id, rev: wire.rev) }
        var body: JSON
        var canonical: [UInt8]
        if let baseText = wire.deltaBase {
            guard let base = try? RevisionID(baseText), let baseFields = baseBody(id, base),
                let delta = try? JSON.parse(wire.content), let applied = try? JSONDelta.apply(delta, to: baseFields)
            else { return .needFull(id: wire.id, rev: wire.rev) }
            body = .object(applied)
            canonical = body.canonicalBytes
        } else {
            do { body = try JSON.parse(wire.content) } catch { return reject(.structure, error.description) }
            canonical = wire.content
        }
        guard body.objectValue != nil else { return reject(.structure, "body is not a JSON object") }
        // A revision ID made elsewhere vouches for no bytes: its body is encoded here rather
        // than stored as sent.
        let hlc = HLCTimestamp(rawValue: wire.hlc)
        let unverifiable = IncomingRevision.unverifiable(
            id: id, revision: rev, history: history, deleted: wire.deleted, body: body, hlc: hlc)
        if let unverifiable, let bytes = unverifiable.canonicalBody { canonical = bytes }
        if canonical.count > maxBodyBytes {
            return reject(.structure, "body of \(canonical.count) bytes exceeds the \(maxBodyBytes)-byte limit")
        }
        // 2. Digest. A Ferry-form ID is always verified, whoever sent it: bytes that hash to it
        // are its canonical body; a sender that is not canonical gets one re-encoding before it
        // is judged. Checked by the store's own `verified`, so that the insert need not hash it
        // again. An ID in another form (CouchDB's, or others) cannot be checked and skips this
        // stage only; a Ferry digest has no other spelling, so no sender can steer a Ferry-made
        // revision around it.
        func verify() -> IncomingRevision? {
            IncomingRevision.verified(
                id: id, revision: rev, history: history, deleted: wire.deleted, body: body, hlc: hlc,
                canonicalBody: canonical)
        }
        var verified = unverifiable ?? verify()
        if verified == nil && !wire.isDelta {
            canonical = body.canonicalBytes
            verified = verify()
        }
        guard let verified else {
            // A delta that produced the wrong body is the sender's or the base's fault: ask for the full body.
            if wire.isDelta { return .needFull(id: wire.id, rev: wire.rev) }
            return reject(.digest, "body does not match revision \(rev)")
        }
        // 3. The peer's write policy.
        if let refusal = DocumentAccess(policy).writeRefusal(
            id: id, body: body, deleted: wire.deleted, ancestors: history, existing: existing)
        {
            return reject(.policy, refusal)
        }
        // 4. The pull filter.
        if let filter, !filter.admits(FilterInput(id: id, revision: rev, deleted: wire.deleted, body: body)) {
            return reject(.filter, "refused by pull filter \"\(filter.name)\"")
        }
        // 5. Validation runs inside the store's insert.
        return .accepted(verified)
    }
}
