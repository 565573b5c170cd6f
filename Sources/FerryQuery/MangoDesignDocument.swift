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
    /// The index, with its full design document ID (`_design/…`) and name.
    public var index: MangoIndex

    /// Parses and validates a request body with CouchDB's errors, in CouchDB's order: the
    /// body's members (`index` required; `type`, `name`, `ddoc` strings; `w` a positive
    /// integer; `partitioned`), unknown members, the type (`json` only), then the definition
    /// (`fields`, `partial_filter_selector`, unknown members).
    public init(parsing body: JSON) throws(MangoError) {
        guard case .object(let members) = body else {
            throw .invalidQuery(error: "bad_request", reason: "Request body must be a JSON object")
        }
        guard let definition = members["index"] else {
            throw .invalidQuery(error: "missing_required_key", reason: "Missing required key: index")
        }
        let type = try members["type"].map { v throws(MangoError) in try Self.string(v) } ?? "json"
        let name = try members["name"].map { v throws(MangoError) in try Self.nonEmptyString(v) }
        let ddoc = try members["ddoc"].map { v throws(MangoError) in try Self.nonEmptyString(v) }
        if let w = members["w"] {
            guard case .int(let n) = w, n > 0 else {
                throw .invalidQuery(
                    error: "invalid_pos_integer",
                    reason: "\(ErlangTerm.render(w, pretty: false)) is not an integer greater than zero")
            }
        }
        if let partitioned = members["partitioned"] {
            guard case .bool(let flag) = partitioned else {
                throw .invalidQuery(
                    error: "invalid_partitioned_value",
                    reason: "Invalid partitioned value: \(ErlangTerm.render(partitioned, pretty: false))")
            }
            if flag {
                throw .invalidQuery(
                    error: "invalid_partitioned_option",
                    reason: "Partitioned indexes are not supported: the database is not partitioned.")
            }
        }
        for key in members.keys.sorted(by: CouchCollation.utf8Precedes) where !Self.bodyKeys.contains(key) {
            throw .invalidQuery(error: "invalid_key", reason: "Invalid key \(key) for this request.")
        }
        switch type {
        case "json": break
        case "text", "nouveau":
            // What a CouchDB without the search services answers (with HTTP 503).
            throw .invalidQuery(error: "required index service unavailable", reason: type)
        default:
            throw .invalidQuery(error: "invalid_index", reason: "Invalid type for index: \(type)")
        }
        guard case .object(let def) = definition else {
            throw .invalidQuery(
                error: "invalid_index",
                reason: "JSON indexes must be an object, not: \(ErlangTerm.render(definition, pretty: false))")
        }
        guard let fieldsJSON = def["fields"] else {
            throw .invalidQuery(error: "missing_required_key", reason: "Missing required key: fields")
        }
        let fields = try Self.fields(fieldsJSON)
        var partial: MangoSelector?
        if let p = def["partial_filter_selector"] {
            guard case .object(let o) = p else {
                throw .invalidQuery(
                    error: "invalid_selector_json",
                    reason: "Selector must be a JSON object, not: \(ErlangTerm.render(p, pretty: false))")
            }
            let selector = try MangoSelector(parsing: p)
            if !o.isEmpty { partial = selector }
        }
        for key in def.keys.sorted(by: CouchCollation.utf8Precedes) where !Self.definitionKeys.contains(key) {
            throw .invalidQuery(error: "invalid_key", reason: "Invalid key \(key) for this request.")
        }
        var index = MangoIndex(designDocument: "", name: "", fields: fields, partialFilter: partial)
        let generated = Self.generatedName(index)
        index.name = name ?? generated
        if let ddoc {
            index.designDocument = ddoc.hasPrefix("_design/") ? ddoc : "_design/" + ddoc
        } else {
            index.designDocument = "_design/" + generated
        }
        self.index = index
    }

    static let bodyKeys: Set<String> = ["index", "type", "name", "ddoc", "w", "partitioned"]
    static let definitionKeys: Set<String> = ["fields", "partial_filter_selector"]

    /// 40 hex digits of the SHA-256 of the definition's canonical JSON (CouchDB uses a SHA-1
    /// of its own term encoding): the same definition gets the same name on every node.
    public static func generatedName(_ index: MangoIndex) -> String {
        let definition: JSON = ["type": "json", "def": index.json.objectValue?["def"] ?? .null]
        return String(BlobDigest.of(definition.canonicalBytes).hex.prefix(40))
    }

    /// CouchDB's sort-spec rules (`"f"` or `{"f": "asc"|"desc"}`, one direction), then Ferry's:
    /// at least one field, each a valid path that `MangoIndex.isIndexable` accepts; a field
    /// listed twice counts once.
    private static func fields(_ value: JSON) throws(MangoError) -> [MangoIndex.Field] {
        guard case .array(let items) = value else {
            throw .invalidQuery(
                error: "invalid_sort_json",
                reason: "Sort must be an array of sort specs, not: \(ErlangTerm.render(value, pretty: true))")
        }
        var specs: [(name: String, descending: Bool)] = []
        for item in items {
            switch item {
            case .string(let name) where !name.isEmpty:
                specs.append((name, false))
            case .object(let o) where o.count == 1 && (o.first!.value == "asc" || o.first!.value == "desc"):
                specs.append((o.first!.key, o.first!.value == "desc"))
            default:
                throw .invalidQuery(
                    error: "invalid_sort_field", reason: "Invalid sort field: \(ErlangTerm.render(item, pretty: true))")
            }
        }
        if Set(specs.map(\.descending)).count > 1 {
            throw .invalidQuery(
                error: "unsupported_mixed_sort", reason: "Sorts currently only support a single direction for all fields.")
        }
        guard !specs.isEmpty else {
            throw .invalidQuery(error: "invalid_index", reason: "A JSON index needs at least one field.")
        }
        var out: [MangoIndex.Field] = []
        for spec in specs {
            let path = try FieldPath(parsing: spec.name)
            guard MangoIndex.isIndexable(path) else {
                throw .invalidQuery(
                    error: "invalid_index",
                    reason: "Cannot index \(spec.name): fields that start with _ (other than _id and _rev) are not part of the document a selector sees.")
            }
            if out.contains(where: { $0.path == path }) { continue }
            out.append(MangoIndex.Field(path: path, descending: spec.descending))
        }
        return out
    }

    private static func string(_ value: JSON) throws(MangoError) -> String {
        guard case .string(let s) = value else {
            throw .invalidQuery(error: "invalid_string", reason: "Invalid string: \(ErlangTerm.render(value, pretty: false))")
        }
        return s
    }

    private static func nonEmptyString(_ value: JSON) throws(MangoError) -> String {
        if value == "" {
            throw .invalidQuery(error: "invalid_empty_string", reason: "Index name or ddoc cannot be empty string")
        }
        return try string(value)
    }
}
