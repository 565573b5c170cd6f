import FerryCore
import FerryCouchDocuments

/// A position in the node's changes feed as CouchDB clients see it: the store's own
/// sequence number, served as a JSON number (docs/data-model.md, "CouchDB sequences").
struct CouchSequence: Sendable, Equatable, Comparable {
    let value: UInt64

    static let zero = CouchSequence(value: 0)

    var json: JSON { .int(Int64(clamping: value)) }

    static func < (a: CouchSequence, b: CouchSequence) -> Bool { a.value < b.value }

    /// Where a `since` (or `last-event-id`) value starts a feed.
    enum Since: Equatable {
        case sequence(CouchSequence)
        /// `since=now`: the feed's end when the request arrives.
        case now
    }

    /// Parses a `since` value: a sequence number (bare, or JSON-encoded as a number or a
    /// string, the forms CouchDB's replicator and PouchDB send back), `0`, or `now`.
    static func parseSince(_ text: String, parameter: String = "since") throws(CouchError) -> Since {
        var t = Substring(text)
        if t == "now" { return .now }
        if t.count >= 2 && t.first == "\"" && t.last == "\"" { t = t.dropFirst().dropLast() }
        if t == "now" { return .now }
        guard !t.isEmpty, t.allSatisfy({ $0.isASCII && $0.isNumber }), let n = UInt64(t), n <= UInt64(Int64.max) else {
            throw CouchError.badRequest(
                "Query parameter `\(parameter)` must be a sequence this node served (a non-negative integer) or `now`, not \"\(text)\".")
        }
        return .sequence(CouchSequence(value: n))
    }
}
