import FerryCore
import FerryCouchDocuments
import FerryQuery
import FerryStore
import HTTPTypes
import Hummingbird

/// The options of one `_changes` request, parsed and checked before the feed starts.
struct ChangesOptions {
    enum Feed: String { case normal, longpoll, continuous, eventsource }

    /// Which documents a feed lists beside the principal's read rule.
    enum Filter {
        case none
        case docIDs(Set<String>)
        case selector(MangoSelector)
        /// `filter=_design`: design documents only.
        case design
    }

    var feed = Feed.normal
    var since = CouchSequence.Since.sequence(.zero)
    var limit: Int?
    /// `style=all_docs`: every leaf in `changes`, not only the winner.
    var allLeaves = false
    var includeDocs = false
    var render = CouchRenderOptions()
    var descending = false
    /// Idle period after which streaming feeds send a heartbeat; nil: none.
    var heartbeat: Duration?
    /// Idle period after which longpoll and continuous feeds end; nil: never.
    var timeout: Duration?
    var filter = Filter.none

    /// CouchDB's default for `timeout` without `heartbeat`.
    static let defaultTimeout = Duration.milliseconds(60_000)
    /// CouchDB's heartbeat for `heartbeat=true`.
    static let defaultHeartbeat = Duration.milliseconds(60_000)

    init(_ p: CouchParameters, lastEventID: String?) throws(CouchError) {
        if let f = try p.choice("feed", ["normal", "longpoll", "continuous", "eventsource", "live"]) {
            feed = f == "live" ? .continuous : Feed(rawValue: f)!
        }
        if let text = p.string("since") {
            since = try CouchSequence.parseSince(text)
        } else if let lastEventID, feed == .eventsource {
            since = try CouchSequence.parseSince(lastEventID, parameter: "Last-Event-ID")
        }
        limit = try p.count("limit")
        if let style = try p.choice("style", ["main_only", "all_docs"]) { allLeaves = style == "all_docs" }
        includeDocs = try p.bool("include_docs")
        render.conflicts = try p.bool("conflicts")
        render.attachments = try p.bool("attachments")
        descending = try p.bool("descending")
        _ = try p.count("seq_interval")  // accepted: sequences here are exact numbers already
        if let text = p.string("heartbeat") {
            if text == "true" {
                heartbeat = Self.defaultHeartbeat
            } else if text != "false" {
                guard let ms = try p.count("heartbeat") else { throw CouchParameters.invalid("heartbeat", text, "milliseconds") }
                heartbeat = .milliseconds(max(ms, 1))
            }
        }
        if let ms = try p.count("timeout") {
            timeout = .milliseconds(max(ms, 1))
        } else if heartbeat == nil {
            timeout = Self.defaultTimeout
        }
    }
}

extension CouchDatabase {
    /// `GET|POST /{db}/_changes`: one row per changed document, newest change only, in
    /// sequence order; `_local` documents never appear, nor documents the principal's read
    /// rule excludes. A live feed judges each change by `current` (the principal as it stands
    /// then) and ends once it is nil.
    func changes(_ request: Request, principal: CouchPrincipal, current: (@Sendable () -> CouchPrincipal?)? = nil) async throws -> Response {
        var p = CouchParameters(request)
        var bodyFields: [String: JSON] = [:]
        if request.method == .post {
            bodyFields = try await readOptionalObject(request)
            p.merge(body: bodyFields.filter { $0.key != "doc_ids" && $0.key != "selector" })
        }
        var options = try ChangesOptions(p, lastEventID: request.headers[HTTPField.Name("Last-Event-ID")!])
        options.filter = try changesFilter(p, body: bodyFields)
        let start: UInt64
        switch options.since {
        case .now: start = try store.lastSequence
        case .sequence(let s): start = s.value
        }
        let contentType = options.feed == .eventsource ? "text/event-stream" : "application/json"
        var headers: HTTPFields = [.contentType: contentType, .cacheControl: "must-revalidate"]
        if options.feed == .eventsource { headers[.cacheControl] = "no-cache" }
        if request.method == .head { return Response(status: .ok, headers: headers) }
        let database = self
        let feedOptions = options
        return Response(
            status: .ok, headers: headers,
            body: ResponseBody { writer in
                try await database.streamChanges(
                    &writer, clock: database.clock, options: feedOptions, principal: principal, current: current, start: start)
            })
    }

    /// Runs a feed on the database's clock (its concrete type opened here).
    private func streamChanges<C: Clock<Duration>>(
        _ writer: inout any ResponseBodyWriter, clock: C, options: ChangesOptions, principal: CouchPrincipal,
        current: (@Sendable () -> CouchPrincipal?)?, start: UInt64
    ) async throws {
        let feed = ChangesFeed(database: self, options: options, principal: principal, current: current, start: start, clock: clock)
        try await feed.run(&writer)
    }

    /// The `filter` of a changes request: `_doc_ids`, `_selector`, `_design`; a design
    /// document's JavaScript filter is refused (Ferry runs no JavaScript).
    private func changesFilter(_ p: CouchParameters, body: [String: JSON]) throws -> ChangesOptions.Filter {
        guard let name = p.string("filter") else { return .none }
        switch name {
        case "_doc_ids":
            let value = try body["doc_ids"] ?? p.json("doc_ids")
            guard case .array(let list)? = value, list.allSatisfy({ $0.stringValue != nil }) else {
                throw CouchError.badRequest("`doc_ids` filter parameter is not a list of doc ids.")
            }
            return .docIDs(Set(list.compactMap(\.stringValue)))
        case "_selector":
            guard let value = try body["selector"] ?? p.json("selector") else {
                throw CouchError.badRequest("Selector must be specified in POST payload")
            }
            do {
                return .selector(try MangoSelector(parsing: value))
            } catch {
                throw CouchError.badRequest("Invalid selector: \(error.description)")
            }
        case "_design":
            return .design
        case "_view":
            throw CouchError.badRequest("filter=_view is not supported: Ferry has no views.")
        default:
            let parts = name.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else {
                throw CouchError.badRequest("`filter` parameter is not correctly formatted")
            }
            let design = try store.document(DocumentID(unchecked: "_design/" + parts[0]))
            guard let design, !design.deleted else { throw CouchError.notFound("missing") }
            guard design.body["filters"]?[String(parts[1])] != nil else {
                throw CouchError.notFound("missing json key: \(parts[1])")
            }
            throw CouchError.badRequest(
                "JavaScript filter functions are not supported by Ferry; use filter=_doc_ids or filter=_selector.")
        }
    }

    /// The row of one change, or nil if the principal or the filter excludes it.
    func changeRow(_ entry: DocumentEntry, options: ChangesOptions, principal: CouchPrincipal) throws -> JSON? {
        let id = entry.change.id.rawValue
        switch options.filter {
        case .docIDs(let ids): if !ids.contains(id) { return nil }
        case .design: if !id.hasPrefix("_design/") { return nil }
        case .none, .selector: break
        }
        var needBody = options.includeDocs
        if case .selector = options.filter { needBody = true }
        let (admitted, document) = try readable(entry, principal: principal, needBody: needBody)
        guard admitted else { return nil }
        var rendered: JSON?
        if let document, needBody { rendered = try renderDocument(document, options: options.render) }
        if case .selector(let selector) = options.filter {
            guard let rendered, selector.matches(rendered) else { return nil }
        }
        var revisions = [entry.change.revision]
        if options.allLeaves {
            revisions += entry.tree.leaves.filter { $0.id != entry.change.revision }.sorted(by: RevisionTree.beats).map(\.id)
        }
        var row: [String: JSON] = [
            "seq": CouchSequence(value: entry.change.sequence).json, "id": .string(id),
            "changes": .array(revisions.map { ["rev": .string($0.description)] }),
        ]
        if entry.change.deleted { row["deleted"] = true }
        if options.includeDocs { row["doc"] = rendered ?? .null }
        return .object(row)
    }
}
