import FerryCore

/// A Mango JSON index: the fields a document is keyed by, in order, the design document that
/// defines it, and an optional partial filter that decides which documents it holds.
public struct MangoIndex: Sendable, Hashable {
    /// One indexed field. CouchDB stores a direction, but a JSON index is read both ways.
    public struct Field: Sendable, Hashable {
        public var path: FieldPath
        public var descending: Bool
        public init(path: FieldPath, descending: Bool = false) {
            self.path = path
            self.descending = descending
        }
    }

    /// The defining design document's full ID, `_design/…`.
    public var designDocument: String
    public var name: String
    public var fields: [Field]
    /// Only documents this selector matches are in the index; nil holds every document
    /// that has all the fields.
    public var partialFilter: MangoSelector?

    public init(designDocument: String, name: String, fields: [Field], partialFilter: MangoSelector? = nil) {
        self.designDocument = designDocument
        self.name = name
        self.fields = fields
        self.partialFilter = partialFilter
    }

    /// The index's key for a document in its query form (the body with `_id` and `_rev`, as
    /// the selector sees it), or nil when the document is not in the index: a field is missing
    /// (or its path is bad), or the partial filter does not match.
    ///
    /// The key is the fields' keys concatenated; each is prefix-free (`fieldKey`), so byte
    /// order of keys is the order of the tuples of field values.
    public func key(for document: JSON) -> [UInt8]? {
        if let partialFilter, !partialFilter.matches(document) { return nil }
        var key: [UInt8] = []
        for field in fields {
            guard case .found(let value) = field.path.lookup(in: document) else { return nil }
            key.append(contentsOf: Self.fieldKey(value, path: field.path))
        }
        return key
    }

    /// One field's key: `CouchCollation.sortKey`, except `_id`, which selectors compare by raw
    /// code points (as `_all_docs` orders IDs): its key is the string's tag and UTF-8 bytes
    /// shifted by 2, ended by 0x00, so byte order is code point order and the key stays prefix-free.
    public static func fieldKey(_ value: JSON, path: FieldPath) -> [UInt8] {
        if path.components == ["_id"], case .string(let id) = value {
            var out: [UInt8] = [5]
            out.reserveCapacity(id.utf8.count + 2)
            for byte in id.utf8 { out.append(byte + 2) }
            out.append(0)
            return out
        }
        return CouchCollation.sortKey(value)
    }

    /// Paths an index may not use: fields the query form of a stored document does not hold
    /// the way CouchDB renders them (`_attachments`, `_deleted`, `_conflicts`, …), so an index
    /// on them would miss documents. `_id` and `_rev` are allowed.
    public static func isIndexable(_ path: FieldPath) -> Bool {
        guard let first = path.components.first else { return false }
        if first == "_id" || first == "_rev" { return path.components.count == 1 }
        return !first.hasPrefix("_") && first != "@attachments"
    }
}

/// A range of index keys (byte strings compared as memcmp does); nil bounds are open.
public struct KeyRange: Sendable, Hashable {
    public var lower: [UInt8]?
    public var lowerInclusive: Bool
    public var upper: [UInt8]?
    public var upperInclusive: Bool

    public init(lower: [UInt8]? = nil, lowerInclusive: Bool = true, upper: [UInt8]? = nil, upperInclusive: Bool = true) {
        self.lower = lower
        self.lowerInclusive = lowerInclusive
        self.upper = upper
        self.upperInclusive = upperInclusive
    }

    /// Every key.
    public static let all = KeyRange()

    /// Whether `key` lies in the range.
    public func contains(_ key: [UInt8]) -> Bool {
        if let lower {
            if key.lexicographicallyPrecedes(lower) || (!lowerInclusive && key == lower) { return false }
        }
        if let upper {
            if upper.lexicographicallyPrecedes(key) || (!upperInclusive && key == upper) { return false }
        }
        return true
    }
}

extension MangoIndex {
    /// The index's entry in `GET /{db}/_index`, as CouchDB lists a JSON index:
    /// `{"ddoc", "name", "type": "json", "partitioned": false, "def": {"fields": [{"f": "asc"}], "partial_filter_selector"?}}`.
    public var json: JSON {
        var def: [String: JSON] = [
            "fields": .array(fields.map { f in .object([f.path.description: .string(f.descending ? "desc" : "asc")]) })
        ]
        if let partialFilter { def["partial_filter_selector"] = partialFilter.root.json }
        return [
            "ddoc": .string(designDocument), "name": .string(name), "type": "json", "partitioned": false,
            "def": .object(def),
        ]
    }

    /// The `_all_docs` special index's entry, which CouchDB lists first.
    public static let allDocsJSON: JSON = [
        "ddoc": .null, "name": "_all_docs", "type": "special", "def": ["fields": [["_id": "asc"]]],
    ]

    /// The indexed paths, in order.
    public var columns: [FieldPath] { fields.map(\.path) }
}
