import FerryCore
import FerryStore

// getRevs, revsDiff and putRevs: revisions fetched, compared and pushed, and what became of each.

/// One revision asked for, with the ancestors the requester holds with bodies (delta bases).
package struct RevisionRequest: Sendable, Equatable {
    package var id: DocumentID
    package var rev: RevisionID
    package var ancestors: [RevisionID]

    package var json: JSON {
        ["id": .string(id.rawValue), "rev": .string(rev.description), "ancestors": .array(ancestors.map { .string($0.description) })]
    }

    package init(id: DocumentID, rev: RevisionID, ancestors: [RevisionID]) {
        self.id = id
        self.rev = rev
        self.ancestors = ancestors
    }
}

/// Fetches revisions; the reply is a revision batch (`WireRevision.decodeBatch`).
struct GetRevsRequest: SyncRequestBody {
    typealias Reply = RevisionBatch
    static let profile = SyncProtocol.Profile.getRevs
    var revs: [RevisionRequest]
    var deltas: Bool
    var maxHistory: Int64

    var json: JSON { ["revs": .array(revs.map(\.json)), "deltas": .bool(deltas), "maxHistory": .int(maxHistory)] }

    init(revs: [RevisionRequest], deltas: Bool, maxHistory: Int64) {
        self.revs = revs
        self.deltas = deltas
        self.maxHistory = maxHistory
    }

    init(_ o: JSON) throws(SyncError) {
        guard case .array(let wanted)? = o["revs"] else { throw .protocolViolation("getRevs lacks revs") }
        var revs: [RevisionRequest] = []
        for w in wanted {
            guard let id = w["id"]?.stringValue.flatMap({ try? DocumentID($0, allowReserved: true) }),
                let rev = w["rev"]?.stringValue.flatMap({ try? RevisionID($0) })
            else { throw .protocolViolation("getRevs entry is malformed") }
            revs.append(RevisionRequest(id: id, rev: rev, ancestors: Self.revisions(w["ancestors"])))
        }
        self.init(revs: revs, deltas: o["deltas"]?.boolValue ?? false, maxHistory: o["maxHistory"]?.intValue ?? 100)
    }

    /// The valid revision IDs of a JSON array; others are skipped.
    static func revisions(_ value: JSON?) -> [RevisionID] {
        guard case .array(let items)? = value else { return [] }
        return items.compactMap { $0.stringValue.flatMap { try? RevisionID($0) } }
    }
}

/// Asks which of these leaf revisions the responder lacks.
struct RevsDiffRequest: SyncRequestBody {
    typealias Reply = RevsDiffReply
    static let profile = SyncProtocol.Profile.revsDiff
    var docs: [DocumentID: [RevisionID]]

    var json: JSON {
        .object(["docs": .object(Dictionary(uniqueKeysWithValues: docs.map { ($0.rawValue, .array($1.map { .string($0.description) })) }))])
    }

    init(docs: [DocumentID: [RevisionID]]) { self.docs = docs }

    init(_ o: JSON) throws {
        guard let docs = o["docs"]?.objectValue else { throw SyncError.protocolViolation("revsDiff lacks docs") }
        var query: [DocumentID: [RevisionID]] = [:]
        for (id, revs) in docs {
            guard let docID = try? DocumentID(id, allowReserved: true), case .array(let list) = revs else {
                throw SyncError.protocolViolation("revsDiff entry for \"\(id)\" is malformed")
            }
            query[docID] = try list.map { try RevisionID($0.stringValue ?? "") }
        }
        self.docs = query
    }
}

/// Of one document's leaf revisions, those the other side lacks, and the older revisions
/// it holds with bodies (candidate delta bases).
package struct MissingRevisions: Sendable, Equatable {
    package var missing: [RevisionID]
    package var possibleAncestors: [RevisionID]

    package init(missing: [RevisionID], possibleAncestors: [RevisionID]) {
        self.missing = missing
        self.possibleAncestors = possibleAncestors
    }
}

/// A revsDiff reply: per document with something missing, what and which held ancestors.
struct RevsDiffReply: SyncJSONReply {
    var entries: [DocumentID: MissingRevisions]

    var json: JSON {
        .object(
            Dictionary(
                uniqueKeysWithValues: entries.map { id, e in
                    (
                        id.rawValue,
                        JSON.object([
                            "missing": .array(e.missing.map { .string($0.description) }),
                            "ancestors": .array(e.possibleAncestors.map { .string($0.description) }),
                        ])
                    )
                }))
    }

    init(entries: [DocumentID: MissingRevisions]) { self.entries = entries }

    init(store answer: [DocumentID: RevsDiffEntry]) {
        entries = answer.mapValues { MissingRevisions(missing: $0.missing, possibleAncestors: $0.possibleAncestors) }
    }

    init(_ o: JSON) throws(SyncError) {
        guard let answer = o.objectValue else { throw .protocolViolation("revsDiff reply is malformed") }
        var entries: [DocumentID: MissingRevisions] = [:]
        for (key, entry) in answer {
            guard let id = try? DocumentID(key, allowReserved: true), case .array? = entry["missing"] else { continue }
            entries[id] = MissingRevisions(
                missing: GetRevsRequest.revisions(entry["missing"]), possibleAncestors: GetRevsRequest.revisions(entry["ancestors"]))
        }
        self.entries = entries
    }
}

/// What became of one pushed revision.
package enum PutStatus: Sendable, Equatable {
    case stored
    case exists
    /// Refused at the receiver's trust boundary, at a typed stage.
    case rejected(Rejection)
    /// A delta the receiver could not apply: send the full body.
    case needFull
}

/// One entry of a putRevs reply.
package struct PutResult: Sendable, Equatable {
    package var id: String
    package var rev: String
    package var status: PutStatus

    /// `{"id","rev","status","reason"?}`; a rejection's reason is `stage: text` on the wire.
    package var json: JSON {
        var o: [String: JSON] = ["id": .string(id), "rev": .string(rev)]
        switch status {
        case .stored: o["status"] = "ok"
        case .exists: o["status"] = "exists"
        case .needFull: o["status"] = "needFull"
        case .rejected(let r):
            o["status"] = "rejected"
            o["reason"] = .string(r.description)
        }
        return .object(o)
    }

    package init(id: String, rev: String, status: PutStatus) {
        self.id = id
        self.rev = rev
        self.status = status
    }

    package init(_ o: JSON) {
        id = o["id"]?.stringValue ?? ""
        rev = o["rev"]?.stringValue ?? ""
        switch o["status"]?.stringValue {
        case "ok": status = .stored
        case "exists": status = .exists
        case "needFull": status = .needFull
        default: status = .rejected(Rejection(wireText: o["reason"]?.stringValue))
        }
    }
}

/// A putRevs reply: one result per pushed revision, in request order.
struct PutRevsReply: Sendable {
    var results: [PutResult]
    var json: JSON { ["results": .array(results.map(\.json))] }
    init(results: [PutResult]) { self.results = results }
    init(_ o: JSON) throws(SyncError) {
        guard case .array(let results)? = o["results"] else { throw .protocolViolation("putRevs reply does not answer every revision") }
        self.results = results.map(PutResult.init)
    }
}

extension Rejection {
    /// Reads the `stage: text` form a putRevs reply carries; a reason without a known
    /// stage is kept whole, at stage `peer`.
    init(wireText: String?) {
        guard let text = wireText else {
            self.init(stage: .peer, reason: "refused by peer")
            return
        }
        if let colon = text.firstIndex(of: ":"), let stage = Stage(rawValue: String(text[..<colon])) {
            var rest = text[text.index(after: colon)...]
            if rest.first == " " { rest = rest.dropFirst() }
            self.init(stage: stage, reason: String(rest))
        } else {
            self.init(stage: .peer, reason: text)
        }
    }
}
