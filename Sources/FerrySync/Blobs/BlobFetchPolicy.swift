import FerryCore
import Foundation

/// When this node fetches the content of a blob that incoming revisions refer to: before
/// storing the revision (`eager`), or on first read (`lazy`), or by size.
public enum BlobFetchPolicy: Sendable, Equatable, CustomStringConvertible {
    /// A revision is stored once its blobs are here (every blob is fetched first).
    case eager
    /// Revisions are stored at once; their blobs are fetched when first read, from any
    /// connected peer that has them.
    case lazy
    /// Blobs up to this many bytes are fetched eagerly, larger ones lazily.
    case eagerUpTo(Int64)

    /// Whether a blob of `length` bytes is fetched before its revision is stored.
    public func fetchesBeforeStoring(length: Int64) -> Bool {
        switch self {
        case .eager: return true
        case .lazy: return false
        case .eagerUpTo(let limit): return length <= limit
        }
    }

    /// Reads `eager`, `lazy`, or a size (`5000000`, `5MB`, `64KiB`: eager up to that size).
    public init(parsing text: String) throws(SyncError) {
        switch text.lowercased() {
        case "eager": self = .eager
        case "lazy": self = .lazy
        default:
            guard let bytes = Self.byteCount(text) else {
                throw SyncError(
                    .invalidBlobPolicy,
                    message: "blob policy \"\(text.prefix(40))\" is not eager, lazy or a size such as 5MB (eager up to it)",
                    isTransient: false)
            }
            self = .eagerUpTo(bytes)
        }
    }

    public var description: String {
        switch self {
        case .eager: return "eager"
        case .lazy: return "lazy"
        case .eagerUpTo(let n): return "\(n)"
        }
    }

    /// `123`, `10KB`/`10KiB`, `5MB`/`5MiB`, `1GB`/`1GiB` (decimal and binary units).
    static func byteCount(_ text: String) -> Int64? {
        let units: [(String, Int64)] = [
            ("KIB", 1 << 10), ("MIB", 1 << 20), ("GIB", 1 << 30), ("KB", 1000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("B", 1),
        ]
        let upper = text.uppercased().trimmingCharacters(in: .whitespaces)
        for (suffix, factor) in units where upper.hasSuffix(suffix) {
            guard let n = Int64(upper.dropLast(suffix.count).trimmingCharacters(in: .whitespaces)), n >= 0 else { return nil }
            let (product, overflow) = n.multipliedReportingOverflow(by: factor)
            return overflow ? nil : product
        }
        guard let n = Int64(upper), n >= 0 else { return nil }
        return n
    }
}
