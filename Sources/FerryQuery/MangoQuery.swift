import FerryCore

/// A parsed `_find` request body: the selector plus what to return (fields, sort, paging) and
/// the options CouchDB accepts, each validated with CouchDB's error name and reason.
public struct MangoQuery: Sendable, Hashable {
    /// One `sort` entry: a field path and its direction.
    public struct SortField: Sendable, Hashable {
        public var path: FieldPath
        public var descending: Bool
        public init(path: FieldPath, descending: Bool = false) {
            self.path = path
            self.descending = descending
        }
    }

    /// CouchDB's default page size when `limit` is not given.
    public static let defaultLimit = 25

    public var selector: MangoSelector
    /// The fields to return; nil returns whole documents.
    public var fields: [FieldPath]?
    /// Sort order; CouchDB requires one direction for every field.
    public var sort: [SortField] = []
    public var limit: Int = MangoQuery.defaultLimit
    public var skip: Int = 0
    /// The opaque position a previous page returned; nil starts at the beginning.
    public var bookmark: String?
    /// `[]`, `[designDoc]` or `[designDoc, indexName]`.
    public var useIndex: [String] = []
    public var executionStats = false
    public var conflicts = false
    public var r = 1
    public var update = true
    public var stable = false
    public var allowFallback = true
    public var partition: String?

    public init(selector: MangoSelector) { self.selector = selector }

    /// Parses and validates a `_find` body. Unknown keys are refused, as CouchDB does.
    public init(parsing body: JSON) throws(MangoError) {
        guard case .object(let members) = body else {
            throw .invalidQuery(error: "bad_request", reason: "Request body must be a JSON object")
        }
        for key in members.keys.sorted(by: CouchCollation.utf8Precedes) where !Self.knownKeys.contains(key) {
            throw .invalidQuery(error: "invalid_key", reason: "Invalid key \(key) for this request.")
        }
        guard let selectorJSON = members["selector"] else {
            throw .invalidQuery(error: "missing_required_key", reason: "Missing required key: selector")
        }
        guard case .object = selectorJSON else {
            throw .invalidQuery(
                error: "invalid_selector_json",
                reason: "Selector must be a JSON object, not: \(selectorJSON.canonicalString)")
        }
        self.init(selector: try MangoSelector(parsing: selectorJSON))

        if let value = members["fields"] { fields = try Self.parseFields(value) }
        if let value = members["sort"] { sort = try Self.parseSort(value) }
        if let value = members["limit"] { limit = try Self.nonNegativeInteger(value) }
        if let value = members["skip"] { skip = try Self.nonNegativeInteger(value) }
        if let value = members["r"] { r = try Self.positiveInteger(value) }
        if let value = members["conflicts"] { conflicts = try Self.boolean(value) }
        if let value = members["update"] { update = try Self.boolean(value) }
        if let value = members["stable"] { stable = try Self.boolean(value) }
        if let value = members["execution_stats"] { executionStats = try Self.boolean(value) }
        if let value = members["allow_fallback"] { allowFallback = try Self.boolean(value) }
        if let value = members["use_index"] { useIndex = try Self.parseUseIndex(value) }
        if let value = members["bookmark"] {
            switch value {
            case .null: bookmark = nil
            case .string(let s): bookmark = s.isEmpty ? nil : s
            default:
                throw .invalidQuery(error: "invalid_bookmark", reason: "Invalid bookmark value: \(value.canonicalString)")
            }
        }
        if let value = members["partition"] {
            guard case .string(let s) = value else { throw Self.invalidString(value) }
            partition = s.isEmpty ? nil : s
        }
        if let value = members["stale"] {
            // The deprecated form of `update: false, stable: true`.
            guard value == "ok" else {
                throw .invalidQuery(error: "invalid_value", reason: "Invalid value for stale: \(value.canonicalString)")
            }
            update = false
            stable = true
        }
    }

    static let knownKeys: Set<String> = [
        "selector", "fields", "sort", "limit", "skip", "bookmark", "use_index", "execution_stats",
        "conflicts", "r", "update", "stable", "stale", "allow_fallback", "partition",
    ]

    // MARK: - Results

    /// The document reduced to the requested `fields` (the whole document when none were
    /// asked for). Each found value is placed at its path, nested objects created on the way;
    /// fields the document lacks are left out.
    public func project(_ document: JSON) -> JSON {
        guard let fields else { return document }
        var result: JSON = .object([:])
        for path in fields {
            if case .found(let value) = path.lookup(in: document) {
                result = Self.setting(value, at: path.components[...], in: result)
            }
        }
        return result
    }

    /// Orders two documents by the `sort` fields (collation; a missing field sorts first).
    public func compareForSort(_ a: JSON, _ b: JSON) -> CollationOrder {
        for field in sort {
            let order = Self.compare(field.path.lookup(in: a), field.path.lookup(in: b))
            if order != .same { return field.descending ? order.reversed : order }
        }
        return .same
    }

    private static func compare(_ a: FieldPath.Lookup, _ b: FieldPath.Lookup) -> CollationOrder {
        switch (a, b) {
        case (.found(let x), .found(let y)): return CouchCollation.compare(x, y)
        case (.found, _): return .descending
        case (_, .found): return .ascending
        default: return .same
        }
    }

    private static func setting(_ value: JSON, at path: ArraySlice<String>, in target: JSON) -> JSON {
        guard let key = path.first else { return value }
        var members = target.objectValue ?? [:]
        members[key] = setting(value, at: path.dropFirst(), in: members[key] ?? .object([:]))
        return .object(members)
    }

    // MARK: - Validation

    private static func parseFields(_ value: JSON) throws(MangoError) -> [FieldPath]? {
        guard case .array(let items) = value else {
            throw .invalidQuery(
                error: "invalid_fields", reason: "Fields must be an array of strings, not: \(value.canonicalString)")
        }
        if items.isEmpty { return nil }
        var paths: [FieldPath] = []
        for item in items {
            guard case .string(let name) = item else {
                throw .invalidQuery(error: "invalid_field", reason: "Invalid JSON for field spec: \(item.canonicalString)")
            }
            paths.append(try FieldPath(parsing: name))
        }
        return paths
    }

    private static func parseSort(_ value: JSON) throws(MangoError) -> [SortField] {
        guard case .array(let items) = value else {
            throw .invalidQuery(
                error: "invalid_sort_json", reason: "Sort must be an array of sort specs, not: \(value.canonicalString)")
        }
        var fields: [SortField] = []
        for item in items {
            switch item {
            case .string(let name):
                fields.append(SortField(path: try FieldPath(parsing: name)))
            case .object(let spec) where spec.count == 1:
                let (name, direction) = spec.first!
                guard direction == "asc" || direction == "desc" else {
                    // CouchDB 3.4 reports an unknown direction as an invalid sort field, naming the whole spec.
                    throw .invalidQuery(
                        error: "invalid_sort_field", reason: "Invalid sort field: \(ErlangTerm.render(item, pretty: true))")
                }
                fields.append(SortField(path: try FieldPath(parsing: name), descending: direction == "desc"))
            default:
                throw .invalidQuery(error: "invalid_sort_field", reason: "Invalid sort field: \(item.canonicalString)")
            }
        }
        if Set(fields.map(\.descending)).count > 1 {
            throw .invalidQuery(
                error: "unsupported_mixed_sort",
                reason: "Sorts currently only support a single direction for all fields.")
        }
        return fields
    }

    private static func parseUseIndex(_ value: JSON) throws(MangoError) -> [String] {
        let bad = MangoError.invalidQuery(
            error: "invalid_index_name", reason: "Invalid index name: \(value.canonicalString)")
        switch value {
        case .string(let s): return s.isEmpty ? [] : [s]
        case .array(let items) where items.count <= 2:
            var names: [String] = []
            for item in items {
                guard case .string(let s) = item, !s.isEmpty else { throw bad }
                names.append(s)
            }
            return names
        default: throw bad
        }
    }

    private static func nonNegativeInteger(_ value: JSON) throws(MangoError) -> Int {
        guard case .int(let n) = value, n >= 0, n <= Int64(Int.max) else {
            throw .invalidQuery(
                error: "invalid_non_neg_integer",
                reason: "\(value.canonicalString) is not an integer greater than or equal to zero")
        }
        return Int(n)
    }

    private static func positiveInteger(_ value: JSON) throws(MangoError) -> Int {
        guard case .int(let n) = value, n > 0, n <= Int64(Int.max) else {
            throw .invalidQuery(
                error: "invalid_pos_integer", reason: "\(value.canonicalString) is not an integer greater than zero")
        }
        return Int(n)
    }

    private static func boolean(_ value: JSON) throws(MangoError) -> Bool {
        guard case .bool(let flag) = value else {
            throw .invalidQuery(error: "invalid_boolean", reason: "Invalid boolean value: \(value.canonicalString)")
        }
        return flag
    }

    private static func invalidString(_ value: JSON) -> MangoError {
        .invalidQuery(error: "invalid_string", reason: "Invalid string: \(value.canonicalString)")
    }
}
