import FerryCore
import FerryCouchDocuments
import FerryQuery
import FerryStore
import FerrySync
import Foundation

/// The answer to one `_find`: the documents of the page (as the JSON text sent to the
/// client), the bookmark of the next page, warnings, and the execution statistics when asked for.
public struct MangoFindResult: Sendable {
    /// Each document's JSON text, in answer order.
    public var encodedDocs: [[UInt8]]
    public var bookmark: String
    public var warnings: [String]
    /// CouchDB's `execution_stats` object, present when the query asked for it.
    public var executionStats: JSON?

    public init(encodedDocs: [[UInt8]], bookmark: String, warnings: [String], executionStats: JSON? = nil) {
        self.encodedDocs = encodedDocs
        self.bookmark = bookmark
        self.warnings = warnings
        self.executionStats = executionStats
    }

    /// The documents as JSON values.
    public var docs: [JSON] { encodedDocs.map { (try? JSON.parse($0)) ?? .null } }

    /// The response body CouchDB sends: `docs`, `bookmark`, then `execution_stats` and
    /// `warning` when present.
    public var json: JSON {
        var out: [String: JSON] = ["docs": .array(docs), "bookmark": .string(bookmark)]
        if let executionStats { out["execution_stats"] = executionStats }
        if !warnings.isEmpty { out["warning"] = .string(warnings.joined(separator: "\n")) }
        return .object(out)
    }

    /// `json` as bytes, built around the documents' text without decoding it again.
    public var encodedResponse: [UInt8] {
        var out = Array(#"{"docs":["#.utf8)
        out.reserveCapacity(encodedDocs.reduce(64) { $0 + $1.count + 1 })
        for (i, doc) in encodedDocs.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: doc)
        }
        out.append(contentsOf: #"],"bookmark":"#.utf8)
        out.append(contentsOf: JSON.string(bookmark).canonicalBytes)
        if let executionStats {
            out.append(contentsOf: #","execution_stats":"#.utf8)
            out.append(contentsOf: executionStats.canonicalBytes)
        }
        if !warnings.isEmpty {
            out.append(contentsOf: #","warning":"#.utf8)
            out.append(contentsOf: JSON.string(warnings.joined(separator: "\n")).canonicalBytes)
        }
        out.append(UInt8(ascii: "}"))
        return out
    }
}

/// A `_find` plan bound to the store: the scan target of the planned source and the
/// fingerprint bookmarks carry so that a page never continues a different scan.
struct BoundPlan {
    let plan: QueryPlan
    let target: ScanTarget
    /// Names the scanned index (its store number and definition) and the direction.
    let fingerprint: String
}

extension CouchDatabase {
    /// Store rows read per transaction while answering a `_find`: memory stays flat however
    /// many candidates the plan's ranges hold.
    static let findPageSize = 200

    /// Answers a parsed `_find` for `principal`: documents it may not read are never
    /// returned, counted in `execution_stats` or used to plan (indexes of design documents it
    /// may not read are not considered). Throws `MangoError` for a query CouchDB refuses (400),
    /// `CancellationError` once `budget` is cancelled (or the calling task is), CouchDB's 500
    /// `timeout` past its deadline, `CouchError` otherwise.
    ///
    /// The plan's index only narrows: every document read is matched against the whole
    /// selector in the form clients see. Results come in the index's key order, ties in
    /// document ID order; design documents and Ferry's own `_ferry/…` documents are never returned.
    public func find(
        _ query: MangoQuery, principal: CouchPrincipal, budget: QueryBudget = QueryBudget(timeout: nil)
    ) throws -> MangoFindResult {
        do { return try find(query, principal: principal, budget: budget, freshIndexes: false) } catch is StaleIndexPlan {
            // The kept index list named an index that has gone since (dropped here or by
            // another process): plan again with the list as stored now.
            return try find(query, principal: principal, budget: budget, freshIndexes: true)
        }
    }

    /// The plan's index is no longer readable; thrown only when the plan used the kept list.
    struct StaleIndexPlan: Error {}

    private func find(
        _ query: MangoQuery, principal: CouchPrincipal, budget: QueryBudget, freshIndexes: Bool
    ) throws -> MangoFindResult {
        let started = ContinuousClock.now
        try Self.check(budget)
        let bound = try bindPlan(query, principal: principal, freshIndexes: freshIndexes)
        try Self.check(budget)
        var after: ScanPosition?
        if let text = query.bookmark, text != MangoBookmark.none {
            after = try MangoBookmark(decoding: text, fingerprint: bound.fingerprint).position
        }
        var docs: [[UInt8]] = []
        // Documents are read without decoding whole bodies when the principal may read
        // everything and the selector and fields name only body fields, `_id` and `_rev`:
        // only the members they name are decoded, and the answer is the stored text.
        let partial = principal.policy.read.admitsEverything && !query.conflicts ? Self.membersNeeded(by: query) : nil
        var keysExamined = 0
        var docsExamined = 0
        var skipped = 0
        var lastMatch: ScanPosition?
        let rule = principal.policy.read
        // The statistics count only documents the principal may read: counting the others
        // would let an indexed equality probe tell whether a hidden document holds a value.
        let countsEverything = rule.admitsEverything
        if query.limit > 0 {
            // The first page reads no more rows than the answer can need when each one matches
            // (an index whose range decides the selector); later pages read full pages.
            let wanted = query.skip.addingReportingOverflow(query.limit)
            var pageSize = wanted.overflow ? Self.findPageSize : wanted.partialValue.clamped(1, Self.findPageSize)
            ranges: for range in bound.plan.ranges {
                var position = after
                while true {
                    let page: [ScannedDocument]
                    do {
                        page = try store.scan(
                            bound.target, range: range, descending: bound.plan.descending, after: position, limit: pageSize)
                    } catch {
                        if case .indexUnavailable = error, !freshIndexes { throw StaleIndexPlan() }
                        throw couchError(error)
                    }
                    let full = page.count == pageSize
                    pageSize = Self.findPageSize
                    for found in page {
                        try Self.check(budget)
                        position = found.position
                        if found.id.rawValue.hasPrefix("_design/") || Self.isNodeInternal(found.id) {
                            if countsEverything { keysExamined += 1 }
                            continue
                        }
                        if let partial, !Self.mayHoldAttachments(found.body) {
                            keysExamined += 1
                            docsExamined += 1
                            var fields: [String: JSON] = Dictionary(minimumCapacity: partial.count + 2)
                            fields["_id"] = .string(found.id.rawValue)
                            fields["_rev"] = .string(found.revisionText)
                            do { try JSON.parseMembers(found.body, named: partial, into: &fields) } catch {
                                throw CouchError(.internalServerError, "corrupt", "Stored body of \(found.id) is not JSON.")
                            }
                            let doc = JSON.object(fields)
                            guard try query.selector.evaluate(doc) else { continue }
                            lastMatch = found.position
                            if skipped < query.skip {
                                skipped += 1
                                continue
                            }
                            docs.append(query.fields == nil ? Self.encodedDocument(found) : query.project(doc).canonicalBytes)
                            if docs.count >= query.limit { break ranges }
                            continue
                        }
                        let body: JSON
                        do { body = try JSON.parse(found.body) } catch {
                            throw CouchError(.internalServerError, "corrupt", "Stored body of \(found.id) is not JSON.")
                        }
                        guard rule.admits(id: found.id, body: body) else { continue }
                        // A conflicted document is readable only when every live leaf is (DocumentAccess).
                        if found.conflicted && DocumentAccess.needsBodies(rule) {
                            let tree: RevisionTree?
                            do { tree = try store.revisionTree(found.id) } catch { throw couchError(error) }
                            guard let tree, DocumentAccess(principal.policy).mayRead(found.id, tree: tree) else { continue }
                        }
                        keysExamined += 1
                        docsExamined += 1
                        let view = RevisionView(
                            id: found.id, revision: found.revision, deleted: false, body: body, tree: nil, sequence: nil)
                        var doc = try render(view, options: CouchRenderOptions(), multipart: false).json
                        guard try query.selector.evaluate(doc) else { continue }
                        lastMatch = found.position
                        if skipped < query.skip {
                            skipped += 1
                            continue
                        }
                        if query.conflicts && found.conflicted { doc = try withConflicts(doc, of: found) }
                        docs.append(query.project(doc).canonicalBytes)
                        if docs.count >= query.limit { break ranges }
                    }
                    if !full { break }
                }
            }
        }
        // As CouchDB: the bookmark of the last document matched (skipped ones included);
        // a page that matched nothing keeps the bookmark it was given.
        let bookmark =
            lastMatch.map { MangoBookmark(fingerprint: bound.fingerprint, position: $0).text } ?? query.bookmark ?? MangoBookmark.none
        var stats: JSON?
        if query.executionStats {
            let elapsed = ContinuousClock.now - started
            let ms = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
            stats = [
                "total_keys_examined": .int(Int64(keysExamined)),
                "total_docs_examined": .int(Int64(docsExamined)),
                "total_quorum_docs_examined": 0,
                "results_returned": .int(Int64(docs.count)),
                "execution_time_ms": .double((ms * 1000).rounded() / 1000),
            ]
        }
        return MangoFindResult(encodedDocs: docs, bookmark: bookmark, warnings: bound.plan.warnings, executionStats: stats)
    }

    /// Plans `query` over the store's ready indexes (those still building are only named in
    /// warnings) and finds the chosen index's store number. Only the indexes of design
    /// documents `principal` may read take part, so neither the plan, its warnings, the
    /// bookmark nor `_explain` name the others. Without `freshIndexes` (and when not
    /// explaining) it plans with the store's kept index list.
    func bindPlan(_ query: MangoQuery, principal: CouchPrincipal, explaining: Bool = false, freshIndexes: Bool = true) throws -> BoundPlan {
        var stored: [StoredMangoIndex]
        do { stored = try store.mangoIndexesForPlanning(fresh: freshIndexes || explaining) } catch { throw couchError(error) }
        if !principal.policy.read.admitsEverything {
            stored = try stored.filter { try mayRead(designDocument: $0.index.designDocument, principal: principal) }
        }
        let ready = stored.filter { $0.state == .ready }
        let building = stored.filter { $0.state != .ready }.map(\.index)
        let plan = try QueryPlanner.plan(query, ready: ready.map(\.index), unavailable: building, explaining: explaining)
        let direction = plan.descending ? "desc" : "asc"
        switch plan.source {
        case .allDocs:
            return BoundPlan(plan: plan, target: .allDocs, fingerprint: "_all_docs/\(direction)")
        case .index(let index):
            guard let chosen = ready.first(where: { $0.index == index }) else {
                throw CouchError(.internalServerError, "internal_server_error", "The planned index \(index.designDocument)/\(index.name) is not ready.")
            }
            return BoundPlan(
                plan: plan, target: .index(id: chosen.id),
                fingerprint: "\(chosen.id)/\(index.designDocument)/\(index.name)/\(direction)")
        }
    }

    /// The top-level body members that the selector and `fields` read, when that is all they
    /// read besides `_id` and `_rev`; nil when they name another reserved field (`_attachments`,
    /// …) or Ferry's internal `@attachments`, which only a whole rendered document answers.
    static func membersNeeded(by query: MangoQuery) -> Set<String>? {
        guard var firsts = query.selector.topLevelMembers else { return nil }
        for path in query.fields ?? [] {
            guard let first = path.components.first else { return nil }
            firsts.insert(first)
        }
        var names = Set<String>()
        for first in firsts {
            if first == "_id" || first == "_rev" { continue }
            if first.hasPrefix("_") || first == StoredAttachment.bodyKey { return nil }
            names.insert(first)
        }
        return names
    }

    /// Whether a stored body may hold Ferry's `@attachments` member (its key's bytes occur;
    /// a string value equal to the name only costs a full rendering).
    static func mayHoldAttachments(_ body: [UInt8]) -> Bool {
        let key = attachmentsKey
        return body.withUnsafeBufferPointer { haystack in
            guard let base = haystack.baseAddress, haystack.count >= key.count else { return false }
            // memchr to each `@` (rare in documents), then compare the key around it.
            var offset = 1
            while offset <= haystack.count - key.count + 1,
                let hit = memchr(base + offset, Int32(UInt8(ascii: "@")), haystack.count - offset)
            {
                let at = base.distance(to: hit.assumingMemoryBound(to: UInt8.self))
                if at - 1 + key.count <= haystack.count && haystack[(at - 1)..<(at - 1 + key.count)].elementsEqual(key) {
                    return true
                }
                offset = at + 1
            }
            return false
        }
    }

    /// The bytes of the `@attachments` key as stored bodies hold it.
    private static let attachmentsKey = Array("\"\(StoredAttachment.bodyKey)\"".utf8)

    /// A stored document without attachments as clients see it: `_id` and `_rev`, then the
    /// stored body's members, spliced as text.
    static func encodedDocument(_ found: ScannedDocument) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(found.body.count + found.id.rawValue.utf8.count + 96)
        out.append(contentsOf: #"{"_id":"#.utf8)
        let id = found.id.rawValue.utf8
        // An ID needing no escape (the usual case) is copied between quotes, not encoded as JSON.
        if id.allSatisfy({ $0 >= 0x20 && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }) {
            out.append(UInt8(ascii: "\""))
            out.append(contentsOf: id)
            out.append(UInt8(ascii: "\""))
        } else {
            out.append(contentsOf: JSON.string(found.id.rawValue).canonicalBytes)
        }
        out.append(contentsOf: #","_rev":""#.utf8)
        out.append(contentsOf: found.revisionText.utf8)
        out.append(UInt8(ascii: "\""))
        // The body is a JSON object: `{}` adds nothing, any other starts its members after `{`.
        if found.body.count > 2 {
            out.append(UInt8(ascii: ","))
            // Copied as one block (appending the slice went element by element).
            found.body.withUnsafeBufferPointer { out.append(contentsOf: UnsafeBufferPointer(rebasing: $0[1...])) }
        } else {
            out.append(UInt8(ascii: "}"))
        }
        return out
    }

    /// `doc` with CouchDB's `_conflicts`: the other live leaves, best first.
    private func withConflicts(_ doc: JSON, of found: ScannedDocument) throws -> JSON {
        let conflicts: [RevisionID]
        do { conflicts = try store.conflicts(of: found.id).filter { $0 != found.revision } } catch { throw couchError(error) }
        guard !conflicts.isEmpty, var fields = doc.objectValue else { return doc }
        fields["_conflicts"] = .array(conflicts.map { .string($0.description) })
        return .object(fields)
    }
}

extension CouchDatabase {
    /// `budget.check()` as the CouchDB API answers it: `CancellationError` when the client
    /// went away, CouchDB's 500 `timeout` past the deadline.
    static func check(_ budget: QueryBudget) throws {
        do { try budget.check() } catch {
            switch error {
            case .cancelled: throw CancellationError()
            case .deadlineExceeded(let timeout):
                throw CouchError(
                    .internalServerError, "timeout",
                    "The query did not finish within its \(timeout.components.seconds) s deadline (couch.queryTimeoutSeconds); "
                        + "narrow the selector or create an index for it.")
            }
        }
    }
}

extension Int {
    fileprivate func clamped(_ low: Int, _ high: Int) -> Int { Swift.min(Swift.max(self, low), high) }
}

/// A `_find` bookmark: where the previous page's scan stopped and which scan it was, as
/// base64url of a small binary record. Opaque to clients; a bookmark of another scan (another
/// index, direction or database state that changed the plan) is refused as CouchDB refuses
/// a malformed one.
struct MangoBookmark: Equatable {
    /// The bookmark of a page that matched nothing, as CouchDB writes it.
    static let none = "nil"

    let fingerprint: String
    let position: ScanPosition

    init(fingerprint: String, position: ScanPosition) {
        self.fingerprint = fingerprint
        self.position = position
    }

    /// Decodes `text`, which must have been made by a scan with `fingerprint`; CouchDB's
    /// 400 `invalid_bookmark` otherwise.
    init(decoding text: String, fingerprint expected: String) throws(MangoError) {
        let invalid = MangoError.invalidQuery(
            error: "invalid_bookmark", reason: "Invalid bookmark value: \(JSON.string(text).canonicalString)")
        var base64: [UInt8] = []
        base64.reserveCapacity(text.utf8.count + 3)
        for c in text.utf8 {
            switch c {
            case UInt8(ascii: "-"): base64.append(UInt8(ascii: "+"))
            case UInt8(ascii: "_"): base64.append(UInt8(ascii: "/"))
            default: base64.append(c)
            }
        }
        while base64.count % 4 != 0 { base64.append(UInt8(ascii: "=")) }
        guard let data = Data(base64Encoded: Data(base64)) else { throw invalid }
        var reader = Array(data)[...]
        guard reader.popFirst() == Self.version, let fingerprint = Self.field(&reader), let key = Self.field(&reader),
            String(decoding: fingerprint, as: UTF8.self) == expected,
            let id = String(validating: reader, as: UTF8.self), !id.isEmpty
        else { throw invalid }
        self.fingerprint = expected
        position = ScanPosition(key: Array(key), documentID: id)
    }

    /// The layout's version: the first byte.
    private static let version: UInt8 = 2

    /// A field as `text` writes it: a 32-bit big-endian length, then the bytes.
    private static func field(_ reader: inout ArraySlice<UInt8>) -> ArraySlice<UInt8>? {
        guard reader.count >= 4 else { return nil }
        let length = reader.prefix(4).reduce(0) { $0 << 8 | Int($1) }
        reader = reader.dropFirst(4)
        guard reader.count >= length else { return nil }
        defer { reader = reader.dropFirst(length) }
        return reader.prefix(length)
    }

    /// The bookmark's text: unpadded base64url of the version, the fingerprint and key (each
    /// with its length), and the document ID. Built by hand rather than as JSON: it is made
    /// for every answer, and its cost showed in the latency of small queries.
    var text: String {
        var bytes: [UInt8] = [Self.version]
        bytes.reserveCapacity(8 + fingerprint.utf8.count + position.key.count + position.documentID.utf8.count)
        for field in [Array(fingerprint.utf8), position.key] {
            let length = UInt32(field.count)  // a key is at most a stored body's size
            for shift in [24, 16, 8, 0] { bytes.append(UInt8(truncatingIfNeeded: length >> UInt32(shift))) }
            bytes.append(contentsOf: field)
        }
        bytes.append(contentsOf: position.documentID.utf8)
        var out: [UInt8] = []
        for c in Data(bytes).base64EncodedData() {
            switch c {
            case UInt8(ascii: "+"): out.append(UInt8(ascii: "-"))
            case UInt8(ascii: "/"): out.append(UInt8(ascii: "_"))
            case UInt8(ascii: "="): continue
            default: out.append(c)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
