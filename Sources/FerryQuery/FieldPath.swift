import FerryCore

/// A path to a value inside a document, such as `address.city` or `tags.0`: object keys, or
/// array indexes where the value on the way is an array.
public struct FieldPath: Sendable, Hashable, CustomStringConvertible {
    /// The keys from the document root; empty means the value itself (inside `$elemMatch`).
    public var components: [String]

    public init(components: [String]) { self.components = components }

    /// Parses a field name as CouchDB does: `.` separates components, `\.` is a literal dot
    /// (backslashes are dropped), and no component may be empty.
    public init(parsing name: String) throws(MangoError) {
        guard !name.isEmpty else { throw .invalidFieldName(name) }
        var components: [String] = []
        var current = ""
        var escaped = false
        for ch in name {
            if escaped {
                current.append(ch)
                escaped = false
            } else if ch == "\\" {
                escaped = true
            } else if ch == "." {
                guard !current.isEmpty else { throw .invalidFieldName(name) }
                components.append(current)
                current = ""
            } else {
                current.append(ch)
            }
        }
        guard !current.isEmpty else { throw .invalidFieldName(name) }
        components.append(current)
        self.components = components
    }

    /// The path appended to `self`.
    public func appending(_ other: FieldPath) -> FieldPath {
        FieldPath(components: components + other.components)
    }

    public var isEmpty: Bool { components.isEmpty }

    /// The field name in CouchDB's syntax, dots and backslashes inside components escaped,
    /// so that parsing it gives this path back.
    public var description: String {
        components.map(Self.escape).joined(separator: ".")
    }

    private static func escape(_ component: String) -> String {
        var out = ""
        for ch in component {
            if ch == "." || ch == "\\" { out.append("\\") }
            out.append(ch)
        }
        return out
    }

    /// What a document holds at this path.
    public enum Lookup: Equatable, Sendable {
        case found(JSON)
        /// An object on the way lacks the key.
        case missing
        /// The path runs into a scalar, or into an array with a component that is not an
        /// index in range.
        case badPath
    }

    /// Follows the path into `value`: objects by key, arrays by decimal index.
    public func lookup(in value: JSON) -> Lookup {
        var current = value
        for component in components {
            switch current {
            case .object(let fields):
                guard let next = fields[component] else { return .missing }
                current = next
            case .array(let items):
                guard let index = Self.arrayIndex(component), index < items.count else { return .badPath }
                current = items[index]
            default:
                return .badPath
            }
        }
        return .found(current)
    }

    /// An array index as CouchDB reads one: an optionally signed decimal integer, not negative.
    private static func arrayIndex(_ component: String) -> Int? {
        var digits = Substring(component)
        var negative = false
        if let sign = digits.first, sign == "+" || sign == "-" {
            negative = sign == "-"
            digits = digits.dropFirst()
        }
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isWholeNumber }), let n = Int(digits) else {
            return nil
        }
        return negative && n != 0 ? nil : n
    }
}
