import FerryCore
import FerryStore

/// A revision as it travels in `getRevs` replies and `putRevs` requests: full body, or a
/// delta against a base revision the receiver said it holds.
struct WireRevision: Sendable {
    var id: String
    var rev: String
    var history: [String]
    var deleted: Bool
    var hlc: UInt64
    var body: JSON?
    var deltaBase: String?
    var delta: JSON?

    var json: JSON {
        var o: [String: JSON] = [
            "id": .string(id), "rev": .string(rev), "history": .array(history.map { .string($0) }),
            "hlc": .int(Int64(bitPattern: hlc)),
        ]
        if deleted { o["deleted"] = true }
        if let body { o["body"] = body }
        if let deltaBase, let delta {
            o["deltaBase"] = .string(deltaBase)
            o["delta"] = delta
        }
        return .object(o)
    }

    init(
        id: String, rev: String, history: [String], deleted: Bool, hlc: UInt64, body: JSON?, deltaBase: String? = nil,
        delta: JSON? = nil
    ) {
        self.id = id
        self.rev = rev
        self.history = history
        self.deleted = deleted
        self.hlc = hlc
        self.body = body
        self.deltaBase = deltaBase
        self.delta = delta
    }

    init(json: JSON) throws(SyncError) {
        guard let o = json.objectValue, let id = o["id"]?.stringValue, let rev = o["rev"]?.stringValue else {
            throw .protocolViolation("revision entry lacks \"id\" or \"rev\"")
        }
        guard case .array(let h)? = o["history"] else { throw .protocolViolation("revision entry lacks \"history\"") }
        var history: [String] = []
        for x in h {
            guard let s = x.stringValue else { throw .protocolViolation("history entries must be strings") }
            history.append(s)
        }
        self.init(
            id: id, rev: rev, history: history, deleted: o["deleted"]?.boolValue ?? false,
            hlc: UInt64(bitPattern: o["hlc"]?.intValue ?? 0), body: o["body"], deltaBase: o["deltaBase"]?.stringValue,
            delta: o["delta"])
        if body == nil && (deltaBase == nil || delta == nil) {
            throw .protocolViolation("revision \(rev) of \"\(id)\" has neither a body nor a delta")
        }
    }

    /// Builds the wire form of a held revision, as a delta against one of `receiverHas`
    /// when that is smaller than the full body.
    static func make(
        id: DocumentID, revision: RevisionID, tree: RevisionTree, receiverHas: [RevisionID], useDeltas: Bool,
        maxHistory: Int
    ) -> (WireRevision, usedDelta: Bool)? {
        guard let r = tree.revision(revision), let bodyBytes = r.body, let body = try? JSON.parse(bodyBytes) else {
            return nil
        }
        let history = tree.history(of: revision, limit: maxHistory + 1).dropFirst().map(\.description)
        var wire = WireRevision(
            id: id.rawValue, rev: revision.description, history: Array(history), deleted: r.deleted,
            hlc: r.hlc.rawValue, body: body)
        guard useDeltas, let target = body.objectValue else { return (wire, false) }
        var best: (String, JSON, Int)?
        for base in receiverHas {
            guard let b = tree.revision(base)?.body, let baseBody = try? JSON.parse(b).objectValue else { continue }
            let delta = JSONDelta.diff(from: baseBody, to: target)
            let size = delta.canonicalBytes.count
            if best == nil || size < best!.2 { best = (base.description, delta, size) }
        }
        // Blobs are referenced, never inlined, so a delta never carries blob content.
        if let best, best.2 < bodyBytes.count * 9 / 10 {
            wire.body = nil
            wire.deltaBase = best.0
            wire.delta = best.1
            return (wire, true)
        }
        return (wire, false)
    }
}

/// Why an incoming revision was not stored.
public struct Rejection: Sendable, Equatable, CustomStringConvertible {
    public let stage: Stage
    public let reason: String

    /// The trust-boundary stage that refused the revision, in the order they run.
    public enum Stage: String, Sendable {
        case structure, digest, policy, filter, validation
    }

    public var description: String { "\(stage.rawValue): \(reason)" }
}

/// The trust boundary for incoming revisions: structure, digest, the peer's write policy,
/// the pull filter, then (in the store) validation. Nothing unchecked reaches a filter.
struct IncomingPipeline: Sendable {
    let policy: PeerPolicy
    let filter: RevisionFilter?
    let maxBodyBytes: Int

    enum Outcome {
        case accepted(IncomingRevision)
        case rejected(id: String, rev: String, Rejection)
        /// The delta could not be applied; ask for the full body.
        case needFull(id: String, rev: String)
    }

    func check(_ wire: WireRevision, baseBody: (DocumentID, RevisionID) -> [String: JSON]?) -> Outcome {
        func reject(_ stage: Rejection.Stage, _ reason: String) -> Outcome {
            .rejected(id: wire.id, rev: wire.rev, Rejection(stage: stage, reason: reason))
        }
        // 1. Structure.
        let id: DocumentID
        do { id = try DocumentID(wire.id, allowReserved: true) } catch { return reject(.structure, error.description) }
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
        var body: JSON
        if let b = wire.body {
            body = b
        } else if let baseText = wire.deltaBase, let delta = wire.delta {
            guard let base = try? RevisionID(baseText), let baseFields = baseBody(id, base),
                let applied = try? JSONDelta.apply(delta, to: baseFields)
            else { return .needFull(id: wire.id, rev: wire.rev) }
            body = .object(applied)
        } else {
            return reject(.structure, "neither body nor delta")
        }
        guard body.objectValue != nil else { return reject(.structure, "body is not a JSON object") }
        let canonical = body.canonicalBytes
        if canonical.count > maxBodyBytes {
            return reject(.structure, "body of \(canonical.count) bytes exceeds the \(maxBodyBytes)-byte limit")
        }
        // 2. Digest.
        let computed = RevisionID.compute(parent: history.first, deleted: wire.deleted, canonicalBody: canonical)
        if computed != rev {
            // A delta that produced the wrong body is the sender's or the base's fault: ask for the full body.
            if wire.body == nil { return .needFull(id: wire.id, rev: wire.rev) }
            return reject(.digest, "body does not match revision \(rev)")
        }
        // 3. The peer's write policy.
        if wire.deleted && !policy.mayDelete { return reject(.policy, "this peer may not delete documents") }
        if !policy.write.admits(id: id, body: body) {
            return reject(.policy, "this peer may not write \"\(id)\"")
        }
        // 4. The pull filter.
        if let filter, !filter.admits(FilterInput(id: id, revision: rev, deleted: wire.deleted, body: body)) {
            return reject(.filter, "refused by pull filter \"\(filter.name)\"")
        }
        // 5. Validation runs inside the store's insert.
        return .accepted(
            IncomingRevision(
                id: id, revision: rev, history: history, deleted: wire.deleted, body: body,
                hlc: HLCTimestamp(rawValue: wire.hlc)))
    }
}
