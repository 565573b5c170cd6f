import ArgumentParser
import FerryCore
import FerryCouch
import FerryQuery
import FerryStore
import Foundation


/// `ferry find`: a CouchDB Mango query, through the running node or on the database directly.
struct Find: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Find documents with a CouchDB Mango selector. Prints one document per line.",
        discussion: """
            SELECTOR is a JSON object (CouchDB's selector language), '-' for stdin, or @FILE. \
            Warnings (such as no matching index) go to stderr; --json prints the whole _find answer.
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "Mango selector: JSON object, '-' for stdin, or @FILE.") var selector: String
    @Option(help: "Fields to return, comma-separated (a.b for nested fields).") var fields: String?
    @Option(help: "Sort fields, comma-separated, each FIELD or FIELD:desc (an index must serve the sort).")
    var sort: String?
    @Option(help: "At most this many documents (default 25).") var limit: Int?
    @Option(help: "Skip this many matching documents first.") var skip: Int?
    @Option(help: "Continue after the page that returned this bookmark.") var bookmark: String?
    @Option(name: .customLong("use-index"), help: "DDOC or DDOC/NAME of the index to use.") var useIndex: String?
    @Flag(help: "Include execution statistics (printed on stderr unless --json).") var stats = false

    func validate() throws {
        if let limit, limit < 0 { throw ValidationError("--limit must not be negative") }
        if let skip, skip < 0 { throw ValidationError("--skip must not be negative") }
    }

    /// The `_find` request body the options describe.
    func requestBody() throws -> JSON {
        let parsed = try Input.parseJSON(try Input.readAll(selector))
        var body: [String: JSON] = ["selector": parsed]
        if let fields { body["fields"] = .array(MangoCLI.list(fields).map { .string($0) }) }
        if let sort {
            body["sort"] = .array(
                MangoCLI.list(sort).map { spec in
                    let (field, descending) = MangoCLI.direction(spec)
                    return .object([field: .string(descending ? "desc" : "asc")])
                })
        }
        if let limit { body["limit"] = .int(Int64(limit)) }
        if let skip { body["skip"] = .int(Int64(skip)) }
        if let bookmark { body["bookmark"] = .string(bookmark) }
        if let useIndex {
            let parts = useIndex.split(separator: "/", maxSplits: useIndex.hasPrefix("_design/") ? 2 : 1).map(String.init)
            let named = useIndex.hasPrefix("_design/") ? ["_design/" + parts[1]] + parts.dropFirst(2) : parts
            body["use_index"] = .array(named.map { .string($0) })
        }
        if stats { body["execution_stats"] = true }
        return .object(body)
    }

    func run() async throws {
        let body = try requestBody()
        let answer: JSON
        if let node = try MangoCLI.couchNode(global.dataDirectory) {
            answer = try await node.call("POST", "_find", body: body)
        } else {
            let database = try MangoCLI.directDatabase(try global.openExistingStore())
            answer = try MangoCLI.direct { try database.find(body: body, principal: .admin).json }
        }
        if global.json {
            Output.json(answer)
            return
        }
        if case .array(let docs)? = answer["docs"] { for doc in docs { Output.line(doc.canonicalString) } }
        if let warning = answer["warning"]?.stringValue { Output.error("warning: " + warning) }
        if let stats = answer["execution_stats"] { Output.error("execution_stats: " + stats.canonicalString) }
        if case .array(let docs)? = answer["docs"], !docs.isEmpty, docs.count == limit ?? 25,
            let next = answer["bookmark"]?.stringValue
        {
            Output.error("more: --bookmark \(next)")
        }
    }
}

extension Find: ReadsData {}

/// `ferry index`: the Mango indexes that serve `ferry find` and the CouchDB API's `_find`.
struct IndexCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "index", abstract: "Add, list and remove Mango (JSON) indexes.",
        discussion: """
            Index definitions are design documents, as CouchDB keeps them, so they replicate to \
            every node, which builds the index there.
            """,
        subcommands: [IndexAdd.self, IndexList.self, IndexRemove.self])
}

/// `ferry index add FIELD[:desc]…`.
struct IndexAdd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add", abstract: "Define a JSON index on FIELDs (in order) and build it.",
        discussion: """
            Through a running node the node finishes a long build in the background (see \
            `ferry index ls`); on the database directly the command builds the index to completion, \
            printing progress on stderr.
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "Indexed fields in order, each FIELD or FIELD:desc.") var fields: [String]
    @Option(help: "The index's name (default: derived from the definition).") var name: String?
    @Option(help: "The design document (default: derived from the definition).") var ddoc: String?
    @Option(help: "Only documents this selector matches are indexed (JSON, or @FILE).") var partial: String?

    func validate() throws {
        if fields.isEmpty { throw ValidationError("name at least one field") }
    }

    func requestBody() throws -> JSON {
        var index: [String: JSON] = [
            "fields": .array(
                fields.map { spec in
                    let (field, descending) = MangoCLI.direction(spec)
                    return .object([field: .string(descending ? "desc" : "asc")])
                })
        ]
        if let partial { index["partial_filter_selector"] = try Input.parseJSON(try Input.readAll(partial)) }
        var body: [String: JSON] = ["index": .object(index), "type": "json"]
        if let name { body["name"] = .string(name) }
        if let ddoc { body["ddoc"] = .string(ddoc) }
        return .object(body)
    }

    func run() async throws {
        let body = try requestBody()
        let answer: JSON
        if let node = try MangoCLI.couchNode(global.dataDirectory) {
            answer = try await node.call("POST", "_index", body: body)
        } else {
            let database = try MangoCLI.directDatabase(try global.openStore())
            answer = try MangoCLI.direct { try database.createIndex(body, principal: .admin) }
            while true {
                let building = try database.buildIndexes(for: .seconds(1))
                guard !building.isEmpty else { break }
                for stored in building {
                    if case .building(let done, let total) = stored.state {
                        Output.error("building \(stored.index.designDocument)/\(stored.index.name): \(done) of \(total) documents")
                    }
                }
            }
        }
        if global.json {
            Output.json(answer)
        } else {
            Output.line("\(answer["result"]?.stringValue ?? "?")\t\(answer["id"]?.stringValue ?? "?")\t\(answer["name"]?.stringValue ?? "?")")
        }
    }
}

/// `ferry index ls`.
struct IndexList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls", abstract: "List the indexes: design document, name, fields, and ready or building progress.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        var listing: JSON
        var building: [String: (done: Int, total: Int)] = [:]
        if let node = try MangoCLI.couchNode(global.dataDirectory) {
            listing = try await node.call("GET", "_index")
            if case .array(let tasks) = try await node.call("GET", "/_active_tasks") {
                for task in tasks where task["type"] == "indexer" {
                    guard let ddoc = task["design_document"]?.stringValue, let name = task["index"]?.stringValue else { continue }
                    building["\(ddoc)\u{0}\(name)"] = (
                        Int(task["changes_done"]?.intValue ?? 0), Int(task["total_changes"]?.intValue ?? 0)
                    )
                }
            }
        } else {
            let store = try global.openExistingStore()
            listing = try MangoCLI.directDatabase(store).listIndexes(principal: .admin)
            for stored in try store.mangoIndexes() {
                if case .building(let done, let total) = stored.state {
                    building["\(stored.index.designDocument)\u{0}\(stored.index.name)"] = (done, total)
                }
            }
        }
        var rows: [JSON] = []
        if case .array(let indexes)? = listing["indexes"] {
            for index in indexes {
                var row = index.objectValue ?? [:]
                let key = "\(index["ddoc"]?.stringValue ?? "")\u{0}\(index["name"]?.stringValue ?? "")"
                if let progress = building[key] {
                    row["state"] = "building"
                    row["changes_done"] = .int(Int64(progress.done))
                    row["total_changes"] = .int(Int64(progress.total))
                } else {
                    row["state"] = "ready"
                }
                rows.append(.object(row))
            }
        }
        if global.json {
            Output.json(["total_rows": .int(Int64(rows.count)), "indexes": .array(rows)])
            return
        }
        for row in rows {
            var specs: [JSON] = []
            if case .array(let list)? = row["def"]?["fields"] { specs = list }
            let fields = specs.compactMap { spec -> String? in
                guard let (field, direction) = spec.objectValue?.first else { return nil }
                return direction == "desc" ? field + ":desc" : field
            }
            var state = row["state"]?.stringValue ?? "ready"
            if state == "building", let done = row["changes_done"]?.intValue, let total = row["total_changes"]?.intValue {
                state = "building \(done)/\(total)"
            }
            let ddoc = row["ddoc"]?.stringValue ?? "-"
            Output.line("\(ddoc)\t\(row["name"]?.stringValue ?? "?")\t\(fields.joined(separator: ","))\t\(state)")
        }
    }
}

extension IndexList: ReadsData {}

/// `ferry index rm DDOC NAME`.
struct IndexRemove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Remove an index (its design document goes when no index is left in it).")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The design document, with or without _design/.") var ddoc: String
    @Argument(help: "The index name.") var name: String

    func run() async throws {
        let full = ddoc.hasPrefix("_design/") ? ddoc : "_design/" + ddoc
        if let node = try MangoCLI.couchNode(global.dataDirectory) {
            _ = try await node.call("DELETE", "_index/\(NodeClient.path(full))/json/\(NodeClient.path(name))")
        } else {
            try MangoCLI.directDatabase(try global.openStore()).deleteIndex(designDocument: full, name: name, principal: .admin)
        }
        if global.json {
            Output.json(["ok": true, "id": .string(full), "name": .string(name)])
        } else {
            Output.line("removed\t\(full)\t\(name)")
        }
    }
}

/// What the Mango commands share: option parsing, the node's CouchDB API, and the
/// database served directly when no node runs.
enum MangoCLI {
    /// Comma-separated items, trimmed, empty ones dropped.
    static func list(_ text: String) -> [String] {
        text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    /// `FIELD` or `FIELD:desc` (`FIELD:asc` too).
    static func direction(_ spec: String) -> (field: String, descending: Bool) {
        if spec.hasSuffix(":desc") { return (String(spec.dropLast(5)), true) }
        if spec.hasSuffix(":asc") { return (String(spec.dropLast(4)), false) }
        return (spec, false)
    }

    /// The node's database as the CouchDB API serves it, over a store opened here.
    static func directDatabase(_ store: DocumentStore) throws -> CouchDatabase {
        CouchDatabase(name: "ferry", store: store, serverUUID: String(store.uuid.prefix(32)))
    }

    /// The CouchDB API of the node running on `dataDirectory`, or nil when none runs.
    static func couchNode(_ dataDirectory: String) throws -> CouchNode? {
        guard let node = NodeClient.running(on: dataDirectory) else { return nil }
        guard let url = node.nodeFile["couchURL"]?.stringValue else {
            throw CLIError(message: "the node on \(dataDirectory) does not say where its CouchDB API listens (node.json has no couchURL)")
        }
        let group = node.nodeFile["group"]?.stringValue ?? "ferry"
        let server = url.hasSuffix("/") ? String(url.dropLast()) : url
        return CouchNode(node: node, serverURL: server, databaseURL: server + "/" + NodeClient.path(group) + "/")
    }

    /// Runs a query on the database directly; a refused query reads as the API's error would.
    static func direct<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch let error as MangoError {
            // A Mango error's description is CouchDB's reason alone; name the error as the API does.
            throw CLIError(message: "\(error.code): \(error.description)")
        }
    }

    /// A running node's CouchDB API, authenticated with the node's admin key.
    struct CouchNode {
        let node: NodeClient
        /// `http://127.0.0.1:PORT`.
        let serverURL: String
        /// `http://127.0.0.1:PORT/GROUP/`.
        let databaseURL: String

        /// One request to `path` (relative to the database, or absolute from the server root
        /// when it starts with `/`); a CouchDB error becomes a CLI error with its reason
        /// (exit 3 for not found, 1 otherwise).
        func call(_ method: String, _ path: String, body: JSON? = nil) async throws -> JSON {
            let base = path.hasPrefix("/") ? serverURL : databaseURL
            let reply = try await CLIHTTP.send(
                method, base + path, bearer: try node.adminKey(), body: body, timeout: .seconds(300), what: "the node's CouchDB API at \(base)")
            let (status, json) = (reply.status, reply.body)
            guard (200..<300).contains(status) else {
                let error = json["error"]?.stringValue ?? "error"
                let reason = json["reason"]?.stringValue ?? "\(json)"
                throw CLIError(message: "\(error): \(reason)", status: status == 404 ? 3 : 1)
            }
            return json
        }
    }
}
