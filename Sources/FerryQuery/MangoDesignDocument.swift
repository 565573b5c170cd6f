import FerryCore

/// Reads and writes Mango index definitions in design documents, in CouchDB's shape:
/// `{"language": "query", "views": {NAME: {"map": {"fields": {"f": "asc"}, "partial_filter_selector": {…}},
/// "reduce": "_count", "options": {"def": {"fields": ["f"]}}}}}`.
public enum MangoDesignDocument {
    /// The JSON indexes a design document body defines; nil-language or non-`query` design
    /// documents define none, and a view that is not a valid JSON index is skipped.
    public static func indexes(designDocumentID: String, body: JSON) -> [MangoIndex] {
        guard case .object(let members) = body, members["language"] == "query",
            case .object(let views)? = members["views"]
        else { return [] }
        var out: [MangoIndex] = []
        for name in views.keys.sorted(by: CouchCollation.utf8Precedes) {
            guard case .object(let view)? = views[name], case .object(let map)? = view["map"],
                case .object(let fieldMap)? = map["fields"], !fieldMap.isEmpty
            else { continue }
            // The field order lives in `options.def.fields` (a JSON object loses member order).
            guard case .object(let options)? = view["options"], case .object(let def)? = options["def"],
                case .array(let specs)? = def["fields"], specs.count == fieldMap.count
            else { continue }
            var fields: [MangoIndex.Field] = []
            for spec in specs {
                let name: String
                var descending = false
                switch spec {
                case .string(let s): name = s
                case .object(let o) where o.count == 1:
                    name = o.keys.first!
                    descending = o[name] == "desc"
                default: name = ""
                }
                guard fieldMap[name] != nil, let path = try? FieldPath(parsing: name), MangoIndex.isIndexable(path) else {
                    fields = []
                    break
                }
                fields.append(MangoIndex.Field(path: path, descending: descending))
            }
            guard fields.count == specs.count else { continue }
            var partial: MangoSelector?
            if let p = map["partial_filter_selector"], case .object(let o) = p, !o.isEmpty {
                guard let selector = try? MangoSelector(parsing: p) else { continue }
                partial = selector
            }
            out.append(MangoIndex(designDocument: designDocumentID, name: name, fields: fields, partialFilter: partial))
        }
        return out
    }

    /// The view member CouchDB writes for `index` (its value under `views.NAME`).
    public static func view(of index: MangoIndex) -> JSON {
        var fieldMap: [String: JSON] = [:]
        for f in index.fields { fieldMap[f.path.description] = .string(f.descending ? "desc" : "asc") }
        var def: [String: JSON] = [
            "fields": .array(index.fields.map { f in f.descending ? .object([f.path.description: "desc"]) : .string(f.path.description) })
        ]
        let partial = index.partialFilter?.root.json ?? .object([:])
        if index.partialFilter != nil { def["partial_filter_selector"] = partial }
        return [
            "map": ["fields": .object(fieldMap), "partial_filter_selector": partial],
            "reduce": "_count",
            "options": ["def": .object(def)],
        ]
    }

    /// `body` (nil for a new design document) with `index` defined under its name.
    public static func adding(_ index: MangoIndex, to body: JSON?) -> JSON {
        var members = body?.objectValue ?? [:]
        members["language"] = "query"
        var views = members["views"]?.objectValue ?? [:]
        views[index.name] = view(of: index)
        members["views"] = .object(views)
        return .object(members)
    }

    /// `body` without the index `name`; nil when no view is left (the design document is then deleted).
    public static func removing(name: String, from body: JSON) -> JSON? {
        var members = body.objectValue ?? [:]
        var views = members["views"]?.objectValue ?? [:]
        views.removeValue(forKey: name)
        if views.isEmpty { return nil }
        members["views"] = .object(views)
        return .object(members)
    }
}

/// A parsed `POST /{db}/_index` body: the index to create, and the design document and name
/// it goes under (generated from the definition when not given, so the same request names
/// the same index on every node).
public struct MangoIndexRequest: Sendable, Hashable {
    public var index: MangoIndex

    /// Parses and validates a request body with CouchDB's errors.
    public init(parsing body: JSON) throws(MangoError) {
        throw .invalidQuery(error: "bad_request", reason: "index creation is not available yet")
    }
}
