import FerryCore
import FerryStore

/// One revision a sender left out of what it passed to this node as a relay (the node was
/// to get it over its own link to the revision's sender), with where it stood in the
/// sender's feed. Wire form `[seq, id, rev]` (docs/protocol.md, "Coverage").
package struct SkippedRelay: Sendable, Equatable {
    package var sequence: UInt64
    package var id: DocumentID
    package var revision: RevisionID

    package init(sequence: UInt64, id: DocumentID, revision: RevisionID) {
        self.sequence = sequence
        self.id = id
        self.revision = revision
    }

    var json: JSON { .array([.int(Int64(clamping: sequence)), .string(id.rawValue), .string(revision.description)]) }

    /// Reads a wire entry; nil when malformed (the caller then treats the report as lost).
    init?(_ value: JSON) {
        guard case .array(let f) = value, f.count == 3, let n = f[0].intValue, n > 0, let text = f[1].stringValue,
            let id = try? DocumentID(text, allowReserved: true), let revText = f[2].stringValue,
            let rev = try? RevisionID(revText)
        else { return nil }
        self.init(sequence: UInt64(n), id: id, revision: rev)
    }

    /// At most this many are reported per changes reply or checkpoint write; past it the
    /// report says only that more were left out (`skipsLost`).
    static let maxReported = 10_000

    /// Encodes a report: the entries, and `skipsLost` when some did not fit.
    static func encode(_ skipped: [SkippedRelay], lost: Bool, into o: inout [String: JSON]) {
        if !skipped.isEmpty { o["skipped"] = .array(skipped.map(\.json)) }
        if lost { o["skipsLost"] = true }
    }

    /// Decodes a report; a malformed or oversized one counts as lost.
    static func decode(_ o: JSON) -> (skipped: [SkippedRelay], lost: Bool) {
        var lost = o["skipsLost"] == .bool(true)
        var out: [SkippedRelay] = []
        if let value = o["skipped"] {
            if case .array(let items) = value, items.count <= maxReported {
                for item in items {
                    if let s = SkippedRelay(item) { out.append(s) } else { lost = true }
                }
            } else {
                lost = true
            }
        }
        return (out, lost)
    }
}

/// Keeps one link's coverage of the other side's feed honest: coverage may pass a sequence
/// only once this store holds every revision the other side skipped at or below it as a
/// relay, since such a revision is in that part of the feed but came here (or will) by
/// another link.
///
/// The invariant it enforces (docs/architecture.md, "Coverage"): a node never records
/// coverage that includes a revision it does not durably hold. Memory is bounded: past
/// `maxPending` unresolved skips, coverage stays below the oldest for the rest of the link.
package struct CoverageHold: Sendable {
    /// Unresolved skips, oldest first.
    private(set) var pending: [SkippedRelay] = []
    /// Skips from this sequence on went unreported: coverage stays below it for the link's life.
    private(set) var lostFrom: UInt64?
    static let maxPending = 100_000

    package init() {}

    /// Notes a report of skips; `lost` says skips at or after `lostFrom` were left unreported.
    package mutating func note(_ skipped: [SkippedRelay], lostFrom: UInt64?) {
        if let lostFrom { self.lostFrom = min(self.lostFrom ?? lostFrom, lostFrom) }
        pending.append(contentsOf: skipped)
        if pending.count > Self.maxPending {
            let oldest = pending.map(\.sequence).min() ?? 1
            self.lostFrom = min(self.lostFrom ?? oldest, oldest)
            pending = []
        }
    }

    /// The highest sequence of the other side's feed, at most `position`, through which this
    /// store may claim to hold everything now. Forgets the skips this store now holds.
    package mutating func coverable(through position: UInt64, store: DocumentStore) throws -> UInt64 {
        if !pending.isEmpty {
            var asked: [DocumentID: [RevisionID]] = [:]
            for s in pending { asked[s.id, default: []].append(s.revision) }
            let missing = try store.revsDiff(asked)
            pending.removeAll { missing[$0.id]?.missing.contains($0.revision) != true }
        }
        var limit = position
        if let first = pending.map(\.sequence).min() { limit = min(limit, first - 1) }
        if let lostFrom { limit = min(limit, lostFrom - 1) }
        return limit
    }

    /// Whether nothing holds coverage back (as of the last `coverable`).
    package var isClear: Bool { pending.isEmpty && lostFrom == nil }
}
