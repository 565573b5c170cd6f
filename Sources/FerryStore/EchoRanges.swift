import FerryCore
import Foundation
import GRDB

/// Ranges of this store's changes feed whose every entry is a revision one peer database
/// pushed here and this store took as that document's only leaf: the peer holds what those
/// entries say, so its pulls can leave them out (the echo of its own push). Kept as a local
/// document per peer and written in the transaction that stored the revisions, so a commit
/// lost in a power failure takes its range with it and a reused sequence is never covered.
public struct EchoRanges: Sendable, Equatable {
    /// Disjoint, sorted, none adjacent to the next.
    public private(set) var ranges: [ClosedRange<UInt64>]
    /// Bounded: the oldest ranges go first (their entries have mostly moved on anyway).
    public static let maxRanges = 256

    public init(_ ranges: [ClosedRange<UInt64>] = []) {
        self.ranges = []
        for r in ranges { add(r) }
    }

    public var isEmpty: Bool { ranges.isEmpty }

    /// Whether the feed entry at `sequence` is an echo.
    public func contains(_ sequence: UInt64) -> Bool {
        var low = 0, high = ranges.count
        while low < high {
            let mid = (low + high) / 2
            if ranges[mid].upperBound < sequence { low = mid + 1 } else { high = mid }
        }
        return low < ranges.count && ranges[low].contains(sequence)
    }

    /// Adds a range, merging it with any it overlaps or touches.
    public mutating func add(_ range: ClosedRange<UInt64>) {
        var merged = range
        var kept: [ClosedRange<UInt64>] = []
        kept.reserveCapacity(ranges.count + 1)
        for r in ranges {
            if r.upperBound &+ 1 < merged.lowerBound || merged.upperBound &+ 1 < r.lowerBound {
                kept.append(r)
            } else {
                merged = min(r.lowerBound, merged.lowerBound)...max(r.upperBound, merged.upperBound)
            }
        }
        kept.append(merged)
        kept.sort { $0.lowerBound < $1.lowerBound }
        if kept.count > Self.maxRanges { kept.removeFirst(kept.count - Self.maxRanges) }
        ranges = kept
    }

    var json: JSON { ["ranges": .array(ranges.map { [.int(Int64(clamping: $0.lowerBound)), .int(Int64(clamping: $0.upperBound))] })] }

    /// Reads the stored form; anything malformed reads as no ranges (nothing is skipped).
    init(json: JSON?) {
        var parsed: [ClosedRange<UInt64>] = []
        if case .array(let items)? = json?["ranges"] {
            for item in items {
                guard case .array(let pair) = item, pair.count == 2, let a = pair[0].intValue, let b = pair[1].intValue, a >= 1, a <= b else {
                    self.init()
                    return
                }
                parsed.append(UInt64(a)...UInt64(b))
            }
        }
        self.init(parsed)
    }

    static func localID(_ key: String) -> String { "echo/" + key }
}

extension DocumentStore {
    /// `insertRevisions`, also recording the batch's feed entries as echoes for `echoKey`
    /// (one peer database) in the same transaction, when every revision stored became its
    /// document's only leaf. A batch that branched a document records nothing: its entry
    /// also carries a leaf the peer may lack.
    public func insertRevisions(_ revisions: [IncomingRevision], durability: StoreOptions.Durability? = nil, echoKey: String?)
        throws(StoreError) -> [InsertOutcome]
    {
        try write(durability: durability) { txn in
            let outcomes = txn.insertAll(revisions)
            if let echoKey, !echoKey.isEmpty { try txn.recordEcho(outcomes, key: echoKey) }
            return outcomes
        }
    }

    /// The echo ranges recorded for `key` (empty when none).
    public func echoRanges(_ key: String) throws(StoreError) -> EchoRanges {
        EchoRanges(json: try localDocument(EchoRanges.localID(key)))
    }
}

extension StoreTransaction {
    func recordEcho(_ outcomes: [InsertOutcome], key: String) throws {
        var low = UInt64.max, high: UInt64 = 0
        for outcome in outcomes {
            guard case .inserted(let sequence, let branched) = outcome else { continue }
            if branched { return }
            low = min(low, sequence)
            high = max(high, sequence)
        }
        guard high > 0 else { return }
        let id = EchoRanges.localID(key)
        let data = try Data.fetchOne(db.cachedStatement(sql: "SELECT body FROM local_documents WHERE id = ?"), arguments: [id])
        var ranges = EchoRanges(json: try data.map { try StoredDocument.decodeBody(Array($0)) })
        ranges.add(low...high)
        try db.cachedStatement(sql: "INSERT OR REPLACE INTO local_documents (id, body) VALUES (?, ?)")
            .execute(arguments: [id, Data(ranges.json.canonicalBytes)])
    }
}
