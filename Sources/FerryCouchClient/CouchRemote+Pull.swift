import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import NIOCore
import NIOHTTP1

/// The pull side's state between verbs of one connection.
struct CouchPullState {
    /// Whether `_bulk_get` is still believed to work (set false the first time the server
    /// answers 404, 405 or 501 to it).
    var bulkGet = true
    /// Document IDs from the server that Ferry cannot store, each logged once.
    var skippedIDs: Set<String> = []
    /// Attachment contents of fetched revisions, held until the puller asks for them (only
    /// for revisions the trust boundary accepted), so a refused revision leaves nothing in
    /// the blob store; each with where to fetch it again once its bytes were let go.
    var pendingBlobs: [BlobDigest: PendingBlob] = [:]
    /// How many `fetchRevisions` calls this connection made: the age of pending blobs.
    var fetches = 0
    /// The bytes `pendingBlobs` holds.
    var heldBytes = 0

    /// One attachment's content from a fetched revision.
    struct PendingBlob {
        var bytes: [UInt8]?
        var docID: String
        var rev: String
        var name: String
        var fetch: Int
    }

    /// Fetches after which held bytes are let go (the puller asks for a chunk's blobs while
    /// at most two later chunks are in flight), and after which the entry is forgotten.
    static let bytesKeptFetches = 4
    static let entriesKeptFetches = 64
    /// Most bytes held at once; past it the oldest are let go (and fetched again if asked
    /// for). Only attachments up to `CouchRemote.heldAttachmentBytes` are held.
    static let maxHeldBytes = 16 << 20

    /// Lets go of old bytes and entries before a new fetch.
    mutating func age() {
        fetches += 1
        let now = fetches
        pendingBlobs = pendingBlobs.filter { now - $0.value.fetch < Self.entriesKeptFetches }
        for (digest, entry) in pendingBlobs where entry.bytes != nil && now - entry.fetch >= Self.bytesKeptFetches {
            pendingBlobs[digest]?.bytes = nil
        }
        heldBytes = pendingBlobs.values.reduce(0) { $0 + ($1.bytes?.count ?? 0) }
    }

    /// Holds one attachment's content, letting go of the oldest bytes past `maxHeldBytes`.
    mutating func hold(_ digest: BlobDigest, _ entry: PendingBlob) {
        heldBytes += (entry.bytes?.count ?? 0) - (pendingBlobs[digest]?.bytes?.count ?? 0)
        pendingBlobs[digest] = entry
        guard heldBytes > Self.maxHeldBytes else { return }
        for (old, e) in pendingBlobs.sorted(by: { $0.value.fetch < $1.value.fetch }) where old != digest {
            guard heldBytes > Self.maxHeldBytes else { break }
            guard let bytes = e.bytes else { continue }
            pendingBlobs[old]?.bytes = nil
            heldBytes -= bytes.count
        }
    }

    /// Takes a blob's held bytes (the entry goes with them); nil when none are held.
    mutating func take(_ digest: BlobDigest) -> PendingBlob? {
        guard let entry = pendingBlobs[digest] else { return nil }
        if let bytes = entry.bytes {
            pendingBlobs[digest] = nil
            heldBytes -= bytes.count
        }
        return entry
    }
}

// Pulling over the CouchDB replication protocol. Live changes are read as `feed=longpoll`
// requests rather than one `continuous` stream: each request answers one page (or nothing
// at its timeout), which is what the puller's `changes` verb asks, and no stream has to be
// kept or closed between verbs; a server that drops the connection simply fails one request,
// and the replicator retries from its checkpoint. A longpoll carries `timeout` and no
// `heartbeat`: CouchDB lets a heartbeat override the timeout, and the puller needs the
// answer by then (a deferred checkpoint write waits on it).
extension CouchRemote {
    /// `GET /{db}/_changes?style=all_docs&since=…&limit=…` (`feed=normal` pages; `longpoll`
    /// with `timeout` when live), as `POST` with `filter=_doc_ids` or `_selector` when asked.
    /// Both filters together become one selector that also matches `_id`.
    func changes(_ request: RemoteChangesRequest) async throws -> RemoteChanges {
        let limit = max(1, request.limit)
        var query: [(String, String)] = [("style", "all_docs"), ("since", Self.sinceText(request.since)), ("limit", "\(limit)")]
        var timeout: TimeAmount?
        if request.live {
            let ms = max(1, request.timeout.components.seconds * 1000 + request.timeout.components.attoseconds / 1_000_000_000_000_000)
            query += [("feed", "longpoll"), ("timeout", "\(ms)")]
            // The server answers by its own timeout; allow for a slow answer after it.
            timeout = .milliseconds(ms) + .seconds(30)
        } else {
            query.append(("feed", "normal"))
        }
        var body: JSON?
        let ids = request.documentIDs.map { $0.map(\.rawValue).sorted().map { JSON.string($0) } }
        if let selector = request.selector {
            var combined = selector
            if let ids { combined = ["$and": [selector, ["_id": ["$in": .array(ids)]]]] }
            query.append(("filter", "_selector"))
            body = ["selector": combined]
        } else if let ids {
            query.append(("filter", "_doc_ids"))
            body = ["doc_ids": .array(ids)]
        }
        let path = http.databasePath("_changes")
        let answer = try await http.json(body == nil ? .GET : .POST, path, query: query, body: body, timeout: timeout)
        guard case .array(let results)? = answer["results"], let lastSeq = answer["last_seq"] else {
            throw CouchClientError(
                .badResponse, message: "\(path): the answer lacks results or last_seq", isTransient: true)
        }
        var changes: [RemoteChange] = []
        for result in results {
            guard let rawID = result["id"]?.stringValue else { continue }
            guard let id = try? DocumentID(rawID, allowReserved: true) else {
                skip(rawID, reason: "Ferry cannot store this document ID")
                continue
            }
            var leaves: [RevisionID] = []
            if case .array(let revs)? = result["changes"] {
                for entry in revs {
                    guard let text = entry["rev"]?.stringValue else { continue }
                    guard let rev = try? RevisionID(text) else {
                        skip(rawID, reason: "revision \(text) is not of the form N-hex")
                        continue
                    }
                    leaves.append(rev)
                }
            }
            if !leaves.isEmpty { changes.append(RemoteChange(id: id, leaves: leaves)) }
        }
        let pending = answer["pending"]?.intValue
        let caughtUp = pending == 0 || results.count < limit
        var page = RemoteChanges(changes: changes, lastSequence: RemoteSequence(lastSeq), caughtUp: caughtUp)
        // CouchDB counts what follows the page: the progress total of a catching-up pull.
        if !request.live, let pending, pending >= 0 { page.pending = Int(pending) }
        return page
    }

    /// A `since` as the server wrote it: a string bare, anything else as JSON text.
    static func sinceText(_ seq: RemoteSequence) -> String {
        if let s = seq.json.stringValue { return s }
        return String(decoding: seq.json.canonicalBytes, as: UTF8.self)
    }

    /// Logs, once per document, a change the pull leaves out.
    private func skip(_ rawID: String, reason: String) {
        let first = pullState.withLock { $0.skippedIDs.insert(rawID).inserted }
        if first { logger.warning("skipped a document from the server", metadata: ["doc": "\(rawID)", "reason": "\(reason)"]) }
    }

    /// `POST /{db}/_bulk_get?revs=true&latest=true&attachments=false&att_encoding_info=true`
    /// (or `GET /{db}/{id}?open_revs=…` without `_bulk_get`), then each attachment this
    /// store lacks on its own (`fetchAttachments`), checked against its stub's length and,
    /// unless the server keeps it gzip-encoded, its MD5. A revision whose
    /// attachments or structure are bad comes back in a form the trust boundary refuses
    /// (the reason is logged here), so that the rest goes on.
    func fetchRevisions(_ requests: [RevisionRequest], deltas: Bool, maxHistory: Int) async throws -> [WireRevision] {
        guard !requests.isEmpty else { return [] }
        pullState.withLock { $0.age() }
        let trees = try store.revisionTrees(Set(requests.map(\.id)))
        var answers = try await fetchDocuments(requests)
        var fetched = try await fetchAttachments(answers, requests: requests, trees: trees)
        var out: [WireRevision] = []
        var seen = Set<String>()
        var retry: [(index: Int, request: RevisionRequest)] = []
        var resolved: [Int: [WireRevision]] = [:]
        for (index, request) in requests.enumerated() {
            var wires: [WireRevision] = []
            for (n, item) in answers[index].enumerated() {
                switch convert(item, request: request, tree: trees[request.id], maxHistory: maxHistory, fetched: fetched[[index, n]] ?? [:]) {
                case .revision(let wire): wires.append(wire)
                case .missingStub where !request.ancestors.isEmpty:
                    // A stub for an ancestor this store no longer keeps: ask again for everything.
                    if retry.last?.index != index {
                        retry.append((index, RevisionRequest(id: request.id, rev: request.rev, ancestors: [])))
                    }
                case .missingStub: wires.append(refused(request.id.rawValue, request.rev.description, "an attachment stub names content this node lacks"))
                }
            }
            resolved[index] = wires
        }
        if !retry.isEmpty {
            answers = try await fetchDocuments(retry.map(\.request))
            fetched = try await fetchAttachments(answers, requests: retry.map(\.request), trees: trees)
            for (n, item) in retry.enumerated() {
                resolved[item.index] = answers[n].enumerated().map { (k, answer) in
                    switch convert(answer, request: item.request, tree: trees[item.request.id], maxHistory: maxHistory, fetched: fetched[[n, k]] ?? [:]) {
                    case .revision(let wire): return wire
                    case .missingStub:
                        return refused(item.request.id.rawValue, item.request.rev.description, "an attachment stub names content this node lacks")
                    }
                }
            }
        }
        for index in requests.indices {
            for wire in resolved[index] ?? [] where seen.insert(wire.id + "\u{0}" + wire.rev).inserted { out.append(wire) }
        }
        let read = out.filter { !$0.missing }.count
        checkpointState.withLock { $0.docsRead += read }
        return out
    }

    /// What one fetched item became.
    enum Converted {
        case revision(WireRevision)
        /// An attachment stub this store cannot resolve.
        case missingStub
    }

    /// One `{"ok": doc}` / `{"error": …}` / `{"missing": rev}` item as a wire revision.
    func convert(
        _ item: JSON, request: RevisionRequest, tree: RevisionTree?, maxHistory: Int, fetched: [String: FetchedAttachment] = [:]
    ) -> Converted {
        guard let doc = item["ok"] else {
            let rev = item["error"]?["rev"]?.stringValue ?? item["missing"]?.stringValue ?? request.rev.description
            return .revision(.missing(id: request.id.rawValue, rev: (try? RevisionID(rev)) == nil ? request.rev.description : rev))
        }
        let rawID = doc["_id"]?.stringValue ?? request.id.rawValue
        let revText = doc["_rev"]?.stringValue ?? request.rev.description
        do throws(CouchError) {
            let input = try CouchDocumentInput(parsing: doc)
            guard rawID == request.id.rawValue else { throw CouchError.badRequest("the server sent document \(rawID) for \(request.id)") }
            guard let rev = try? RevisionID(revText) else { throw CouchError.badRequest("Invalid rev format \(revText)") }
            let history = try input.history(for: revText) ?? []
            let store = self.store
            let resolver = AttachmentResolver(
                docID: rawID,
                lookup: { name, digest in
                    fetched[name]?.attachment ?? StoredAttachment.held(named: name, digest: digest, in: tree, blobs: store.blobs)
                },
                generation: rev.generation, keepGivenRevpos: true)
            var (body, contents) = try resolver.storedBody(input)
            let held = fetched.values.compactMap(\.bytes)
            if rev.isFerryDigest,
                let original = FerryFormBody.matching(
                    rev, parent: history.first.flatMap { try? RevisionID($0) }, deleted: input.deleted, body: body, contents: contents + held,
                    blobs: store.blobs)
            {
                body = original
            }
            if !contents.isEmpty || !held.isEmpty { hold(contents + held, body: body, docID: rawID, rev: revText) }
            return .revision(
                WireRevision(
                    id: rawID, rev: revText, history: Array(history.prefix(maxHistory)), deleted: input.deleted, hlc: 0,
                    content: body.canonicalBytes, deltaBase: nil))
        } catch {
            if error.error == "missing_stub" { return .missingStub }
            return .revision(refused(rawID, revText, error.reason))
        }
    }

    /// A revision the trust boundary will refuse (its body is no JSON object), with the real
    /// reason logged here: the seam has no other way to report a revision refused on arrival.
    private func refused(_ id: String, _ rev: String, _ reason: String) -> WireRevision {
        logger.warning("refused a revision from the server", metadata: ["doc": "\(id)", "rev": "\(rev)", "reason": "\(reason)"])
        return WireRevision(
            id: id, rev: rev, history: [], deleted: false, hlc: 0, content: JSON.string("refused: \(reason)").canonicalBytes,
            deltaBase: nil)
    }

    /// The items the server answers for each request, in request order.
    private func fetchDocuments(_ requests: [RevisionRequest]) async throws -> [[JSON]] {
        if pullState.withLock({ $0.bulkGet }), let answers = try await bulkGet(requests) { return answers }
        var out: [[JSON]] = []
        for request in requests { out.append(try await openRevs(request)) }
        return out
    }

    /// `_bulk_get`; nil when the server has none.
    private func bulkGet(_ requests: [RevisionRequest]) async throws -> [[JSON]]? {
        // Attachments come as stubs and are fetched one by one, streamed (`fetchAttachments`).
        let docs: [JSON] = requests.map { r in .object(["id": .string(r.id.rawValue), "rev": .string(r.rev.description)]) }
        let path = http.databasePath("_bulk_get")
        let body: JSON = ["docs": .array(docs)]
        let response = try await http.send(
            .POST, path, query: [("revs", "true"), ("latest", "true"), ("attachments", "false"), ("att_encoding_info", "true")],
            body: body.canonicalBytes)
        if [404, 405, 501].contains(response.status) && !Self.databaseMissing(response) {
            pullState.withLock { $0.bulkGet = false }
            logger.info("the server has no _bulk_get: fetching documents one by one", metadata: ["database": "\(http.endpoint.redacted)"])
            return nil
        }
        guard (200..<300).contains(response.status) else { throw CouchClientError.http(response, method: .POST, path: path, endpoint: http.endpoint) }
        guard case .array(let results)? = response.json?["results"], results.count == requests.count else {
            throw CouchClientError(
                .badResponse, message: "POST \(path): the answer does not list one result per document", isTransient: true,
                status: response.status)
        }
        return results.map { result in
            if case .array(let items)? = result["docs"] { return items }
            return []
        }
    }

    /// A 404 that says the database itself is gone (not a document or an endpoint).
    static func databaseMissing(_ response: CouchHTTP.Response) -> Bool {
        response.status == 404 && (response.json?["reason"]?.stringValue ?? "").lowercased().contains("database does not exist")
    }

    /// `GET /{db}/{id}?open_revs=["rev"]&revs=true&latest=true&attachments=false&att_encoding_info=true`.
    private func openRevs(_ request: RevisionRequest) async throws -> [JSON] {
        let path = http.databasePath(Self.documentSuffix(request.id.rawValue))
        let query: [(String, String)] = [
            ("open_revs", String(decoding: JSON.array([.string(request.rev.description)]).canonicalBytes, as: UTF8.self)),
            ("revs", "true"), ("latest", "true"), ("attachments", "false"), ("att_encoding_info", "true"),
        ]
        let response = try await http.send(.GET, path, query: query)
        if response.status == 404 && !Self.databaseMissing(response) { return [["missing": .string(request.rev.description)]] }
        guard (200..<300).contains(response.status) else { throw CouchClientError.http(response, method: .GET, path: path, endpoint: http.endpoint) }
        guard case .array(let items)? = response.json else {
            throw CouchClientError(.badResponse, message: "GET \(path): the answer is not a JSON array", isTransient: true, status: response.status)
        }
        return items
    }

    /// Keeps a fetched revision's attachment contents (already checked against their MD5
    /// and length) until the puller asks for them.
    private func hold(_ contents: [[UInt8]], body: JSON, docID: String, rev: String) {
        var names: [BlobDigest: String] = [:]
        for (name, value) in body[StoredAttachment.bodyKey]?.objectValue ?? [:] {
            if let att = StoredAttachment(json: value) { names[att.blob] = name }
        }
        pullState.withLock { state in
            for bytes in contents {
                let digest = BlobDigest.of(bytes)
                // A blob the body refers to outside `@attachments` travels as a stub named by its digest.
                let name = names[digest] ?? AttachmentSet.blobStubName(digest)
                state.hold(digest, .init(bytes: bytes, docID: docID, rev: rev, name: name, fetch: state.fetches))
            }
        }
    }

    /// An attachment's content, asked for once the revision that carried it was accepted:
    /// from the bytes that came with it, or fetched again (`GET /{db}/{id}/{name}?rev=…`)
    /// when they were let go. The puller checks it against the digest.
    func blob(_ digest: BlobDigest) async throws -> [UInt8] {
        let entry = pullState.withLock { $0.take(digest) }
        if let bytes = entry?.bytes { return bytes }
        if let bytes = try store.blobs.get(digest) { return bytes }
        guard let entry else {
            throw CouchClientError(
                .blobMissing,
                message: "blob \(digest) is referred to by a document from \(http.endpoint.redacted) that carried no such attachment",
                isTransient: false)
        }
        let path = http.databasePath(Self.documentSuffix(entry.docID) + "/" + CouchEndpoint.escapeDatabase(entry.name))
        let response = try await http.send(.GET, path, query: [("rev", entry.rev)], headers: [("Accept", "*/*")])
        guard (200..<300).contains(response.status) else {
            throw CouchClientError.http(response, method: .GET, path: path, endpoint: http.endpoint)
        }
        return response.body
    }
}
