import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Hummingbird
import NIOCore

/// The options of one `_all_docs` request, parsed and checked before any row is read.
struct AllDocsOptions {
    var keys: [String]?
    var range = DocumentIDRange()
    var includeDocs = false
    var render = CouchRenderOptions()
    var skip = 0
    var limit = Int.max
    var updateSeq = false

    init(_ p: CouchParameters) throws(CouchError) {
        range.descending = try p.bool("descending")
        includeDocs = try p.bool("include_docs")
        render.conflicts = try p.bool("conflicts")
        render.attachments = try p.bool("attachments")
        skip = try p.count("skip") ?? 0
        limit = try p.count("limit") ?? .max
        updateSeq = try p.bool("update_seq")
        range.endInclusive = try p.bool("inclusive_end", default: true)
        if let value = try p.json("keys") {
            guard case .array(let list) = value else { throw CouchError.badRequest("`keys` must be a JSON array of document IDs.") }
            var ids: [String] = []
            for k in list {
                guard let s = k.stringValue else { throw CouchError.badRequest("`keys` must be a JSON array of document IDs.") }
                ids.append(s)
            }
            keys = ids
        }
        // `startkey_docid` and `endkey_docid` are plain strings, not JSON; here the key is the ID.
        range.start = try Self.key(p, ["startkey", "start_key"]) ?? p.string("startkey_docid") ?? p.string("start_key_doc_id")
        range.end = try Self.key(p, ["endkey", "end_key"]) ?? p.string("endkey_docid") ?? p.string("end_key_doc_id")
        if keys != nil && (range.start != nil || range.end != nil) {
            throw CouchError(.badRequest, "query_parse_error", "`keys` is incompatible with `key`, `start_key` and `end_key`")
        }
        if let key = try Self.key(p, ["key"]) {
            if keys != nil { throw CouchError(.badRequest, "query_parse_error", "`keys` is incompatible with `key`") }
            keys = [key]
        }
        if let s = range.start, let e = range.end, range.descending ? s < e : s > e {
            throw CouchError(
                .badRequest, "query_parse_error",
                "No rows can match your key range, reverse your start_key and end_key or set descending=\(!range.descending)")
        }
    }

    /// A document-ID key option: a JSON string (the IDs are `_all_docs`' keys).
    private static func key(_ p: CouchParameters, _ names: [String]) throws(CouchError) -> String? {
        for name in names {
            guard let value = try p.json(name) else { continue }
            guard let s = value.stringValue else {
                throw CouchError.badRequest("Query parameter `\(name)` must be a JSON string (a document ID).")
            }
            return s
        }
        return nil
    }
}

extension CouchDatabase {
    /// Rows read from the store per page while streaming `_all_docs`.
    static let allDocsPageSize = 500

    /// `GET|POST /{db}/_all_docs`: live documents in raw (UTF-8 byte) ID order, or the
    /// rows of the given `keys`; a principal sees only the documents its read rule admits.
    /// `designOnly`: `_design_docs`, the same listing within the `_design/` prefix.
    func allDocs(_ request: Request, principal: CouchPrincipal, designOnly: Bool = false) async throws -> Response {
        var p = CouchParameters(request)
        if request.method == .post { p.merge(body: try await readOptionalObject(request)) }
        var parsed = try AllDocsOptions(p)
        if designOnly { parsed.range.clamp(toPrefix: "_design/") }
        let options = parsed
        let info = try store.info()
        // A principal that may not read everything is told counts of what it may read only:
        // counts over every document would let it rebuild hidden IDs by bisecting with `offset`.
        let restricted = !principal.policy.read.admitsEverything
        // Pages of the store (and a restricted reader's counts, which scan) are read on threads
        // made for blocking work, off the cooperative pool (docs/architecture.md).
        let total =
            restricted
            ? try await BlockingIO.run { try self.readableCount(before: nil, descending: false, principal: principal) } : info.documentCount
        var head: [String: JSON] = ["total_rows": .int(Int64(total))]
        if options.updateSeq { head["update_seq"] = CouchSequence(value: info.lastSequence).json }
        if let keys = options.keys {
            head["offset"] = .null
            var rows: [JSON] = []
            let entries = try store.documentEntries(ids: keys.map(DocumentID.init(unchecked:)))
            let ordered = options.range.descending ? Array(keys.reversed()) : keys
            for key in ordered.dropFirst(options.skip).prefix(options.limit) {
                rows.append(try keyRow(key, entry: entries[DocumentID(unchecked: key)], options, principal))
            }
            head["rows"] = .array(rows)
            return headless(CouchResponse.json(.object(head)), request)
        }
        var offset = options.skip
        if restricted, let start = options.range.start {
            offset += try await BlockingIO.run { try self.readableCount(before: start, descending: options.range.descending, principal: principal) }
            if !options.range.startInclusive,
                let entry = try store.documentEntries(ids: [DocumentID(unchecked: start)]).values.first, !entry.change.deleted,
                try readable(entry, principal: principal, needBody: false).admitted
            {
                offset += 1
            }
        } else if let start = options.range.start {
            let before = try store.liveDocumentCount(before: start, descending: options.range.descending)
            let startItself = try options.range.startInclusive ? 0 : store.documentEntries(ids: [DocumentID(unchecked: start)]).values
                .filter { !$0.change.deleted }.count
            offset += before + startItself
        }
        head["offset"] = .int(Int64(offset))
        if request.method == .head { return headless(CouchResponse.json(.object(head)), request) }
        // Read the first page before answering, so that a store error is still a clean 500.
        let first = try await BlockingIO.run { [store] in try store.documentEntries(in: options.range, limit: Self.allDocsPageSize) }
        var headBytes = JSON.object(head).canonicalBytes
        headBytes.removeLast()  // the closing brace: rows follow
        headBytes.append(contentsOf: Array(",\"rows\":[\n".utf8))
        let opening = headBytes
        let database = self
        let body = ResponseBody { writer in
            var buffer = ByteBuffer(bytes: opening)
            var range = options.range
            var page = first
            var skipped = 0
            var sent = 0
            var separator = false
            pages: while true {
                for entry in page {
                    guard sent < options.limit else { break pages }
                    let (admitted, document) = try database.readable(entry, principal: principal, needBody: options.includeDocs)
                    guard admitted else { continue }
                    if skipped < options.skip {
                        skipped += 1
                        continue
                    }
                    var row: [String: JSON] = [
                        "id": .string(entry.change.id.rawValue), "key": .string(entry.change.id.rawValue),
                        "value": ["rev": .string(entry.change.revision.description)],
                    ]
                    if options.includeDocs, let document { row["doc"] = try database.renderDocument(document, options: options.render) }
                    if separator { buffer.writeString(",\n") }
                    separator = true
                    buffer.writeBytes(JSON.object(row).canonicalBytes)
                    sent += 1
                }
                try await writer.write(buffer)
                buffer.clear()
                guard page.count == Self.allDocsPageSize, sent < options.limit, let last = page.last else { break }
                range.start = last.change.id.rawValue
                range.startInclusive = false
                page = try await BlockingIO.run { [range] in try database.store.documentEntries(in: range, limit: Self.allDocsPageSize) }
            }
            buffer.writeString("\n]}\n")
            try await writer.write(buffer)
            try await writer.finish(nil)
        }
        return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "must-revalidate"], body: body)
    }

    /// One row of `_all_docs?keys=…`: the current revision, a deleted one's tombstone
    /// marker, or `not_found` (also for a document the principal may not read).
    private func keyRow(_ key: String, entry: DocumentEntry?, _ options: AllDocsOptions, _ principal: CouchPrincipal) throws -> JSON {
        let notFound: JSON = ["key": .string(key), "error": "not_found"]
        guard let entry else { return notFound }
        let (admitted, document) = try readable(entry, principal: principal, needBody: options.includeDocs)
        guard admitted else { return notFound }
        var row: [String: JSON] = ["id": .string(key), "key": .string(key)]
        if entry.change.deleted {
            row["value"] = ["rev": .string(entry.change.revision.description), "deleted": true]
            if options.includeDocs { row["doc"] = .null }
        } else {
            row["value"] = ["rev": .string(entry.change.revision.description)]
            if options.includeDocs, let document { row["doc"] = try renderDocument(document, options: options.render) }
        }
        return .object(row)
    }

    /// Whether the principal may read the entry's document (`DocumentAccess`: every live
    /// leaf, not only the winner), with the document when `needBody` asks for it.
    func readable(_ entry: DocumentEntry, principal: CouchPrincipal, needBody: Bool) throws -> (admitted: Bool, document: Document?) {
        if CouchDatabase.isNodeInternal(entry.change.id) { return (false, nil) }
        let access = DocumentAccess(principal.policy)
        if !access.readsEverything && !access.mayRead(entry.change.id, tree: entry.tree) { return (false, nil) }
        return (true, needBody ? try entry.currentDocument() : nil)
    }

    /// How many live documents the principal may read before `id` in iteration order (nil:
    /// all of them). A scan: only principals with a restricted read rule pay for it.
    func readableCount(before id: String?, descending: Bool, principal: CouchPrincipal) throws -> Int {
        var range = DocumentIDRange(end: id, endInclusive: id == nil, descending: descending)
        var count = 0
        while true {
            let page = try store.documentEntries(in: range, limit: Self.allDocsPageSize)
            for entry in page where try readable(entry, principal: principal, needBody: false).admitted { count += 1 }
            guard page.count == Self.allDocsPageSize, let last = page.last else { return count }
            range.start = last.change.id.rawValue
            range.startInclusive = false
        }
    }
}

extension CouchDatabase {
    /// Ferry's own replicated documents (`_ferry/…`: group membership) are not served over
    /// the CouchDB API: CouchDB refuses such IDs, so a CouchDB replicator would only count
    /// them as write failures, and apps have no use for them.
    static func isNodeInternal(_ id: DocumentID) -> Bool { id.rawValue.hasPrefix("_ferry/") }
}

extension DocumentIDRange {
    /// Narrows the range to IDs that start with `prefix` (whose last byte is below 0xFF).
    mutating func clamp(toPrefix prefix: String) {
        var bytes = Array(prefix.utf8)
        bytes[bytes.count - 1] += 1
        let past = String(decoding: bytes, as: UTF8.self)  // the first string after every ID with the prefix
        func lower(_ a: String) -> Bool { a.utf8.lexicographicallyPrecedes(prefix.utf8) }
        func upper(_ a: String) -> Bool { !a.utf8.lexicographicallyPrecedes(past.utf8) }
        if descending {
            if start == nil || upper(start!) { (start, startInclusive) = (past, false) }
            if end == nil || lower(end!) { (end, endInclusive) = (prefix, true) }
        } else {
            if start == nil || lower(start!) { (start, startInclusive) = (prefix, true) }
            if end == nil || upper(end!) { (end, endInclusive) = (past, false) }
        }
    }
}
