import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import NIOHTTP1

/// The push side's state between verbs of one connection.
struct CouchPushState {
    /// Per document, the revisions the target named as possible ancestors in the last
    /// `_revs_diff`: the Pusher stores that answer's revisions before it asks again, and
    /// their attachments go as stubs when one of these holds them.
    var targetHolds: [DocumentID: [RevisionID]] = [:]
    /// The target answered `_ensure_full_commit` with 404, 405 or 501: it has no such step.
    var noFullCommit = false
    /// Attachments sent with their content and as stubs, for logs and tests.
    var attachmentsSent = 0
    var attachmentsStubbed = 0
    /// `_bulk_docs` and `_ensure_full_commit` requests posted, and documents sent alone as
    /// streamed multipart PUTs.
    var streamedPuts = 0
    var bulkDocsRequests = 0
    var fullCommitRequests = 0
}

extension CouchRemote {
    /// Largest `_bulk_docs` body posted at once: the Pusher bounds a chunk's bodies, but
    /// attachments inline (as base64) can make one much larger.
    static let maxBulkDocsBytes = 8 << 20

    /// `POST /{db}/_revs_diff`. The target's possible ancestors are kept for the attachment
    /// decision and not handed to the Pusher: a CouchDB target takes no deltas, so the
    /// Pusher must not base any on them.
    /// The node's own documents (`_ferry/`: members, addresses, access rules) are never
    /// offered: they travel only between Ferry nodes, over Ferry's protocol, where they are
    /// checked as signed entries; a CouchDB-protocol target would refuse or keep them unchecked.
    func revsDiff(_ offered: [DocumentID: [RevisionID]]) async throws -> [DocumentID: MissingRevisions] {
        let docs = offered.filter { !$0.key.isNodeInternal }
        guard !docs.isEmpty else { return [:] }
        var request: [String: JSON] = [:]
        for (id, revs) in docs { request[id.rawValue] = .array(revs.map { .string($0.description) }) }
        let path = http.databasePath("_revs_diff")
        let answer = try await http.json(.POST, path, body: .object(request))
        guard let entries = answer.objectValue else { throw Self.badAnswer(path, "is not a JSON object") }
        let asked = Dictionary(uniqueKeysWithValues: docs.keys.map { ($0.rawValue, $0) })
        var out: [DocumentID: MissingRevisions] = [:]
        var holds: [DocumentID: [RevisionID]] = [:]
        for (rawID, entry) in entries {
            // Only what was asked counts: a revision made up by the server is never sent.
            guard let id = asked[rawID], let offered = docs[id] else { continue }
            guard case .array(let missingList)? = entry["missing"] else {
                throw Self.badAnswer(path, "entry \(rawID) has no \"missing\" list")
            }
            let missingText = Set(missingList.compactMap(\.stringValue))
            let missing = offered.filter { missingText.contains($0.description) }
            guard !missing.isEmpty else { continue }
            out[id] = MissingRevisions(missing: missing, possibleAncestors: [])
            if case .array(let ancestors)? = entry["possible_ancestors"] {
                holds[id] = ancestors.compactMap { $0.stringValue.flatMap { try? RevisionID($0) } }
            }
        }
        pushState.withLock { $0.targetHolds = holds }
        logger.debug("revs diff", metadata: ["asked": "\(docs.count)", "missing": "\(out.count)"])
        return out
    }

    /// `POST /{db}/_bulk_docs` with `new_edits: false`, attachments inline unless the target
    /// holds them already; `_ensure_full_commit` when the target needs it. A delta is
    /// answered `needFull` (the Pusher makes none for this remote, whose revsDiff names no
    /// bases); a revision refused by the target is `rejected` and the rest are stored.
    func storeRevisions(_ revisions: [WireRevision]) async throws -> [PutResult] {
        guard !revisions.isEmpty else { return [] }
        var results = [PutStatus?](repeating: nil, count: revisions.count)
        let holds = pushState.withLock { $0.targetHolds }
        let trees = try store.revisionTrees(revisions.compactMap { try? DocumentID($0.id, allowReserved: true) })
        var outgoing: [(index: Int, document: CouchOutgoingDocument)] = []
        for (i, wire) in revisions.enumerated() {
            if wire.isDelta {
                results[i] = .needFull
                continue
            }
            let id = try? DocumentID(wire.id, allowReserved: true)
            if id?.isNodeInternal == true {
                results[i] = .exists  // never sent (see `revsDiff`)
                continue
            }
            do {
                let document = try CouchOutgoingDocument(
                    wire, targetHolds: id.flatMap { holds[$0] } ?? [], tree: id.flatMap { trees[$0] }, blobs: store.blobs,
                    streamAbove: streamsAttachments ? Self.streamedAttachmentBytes : nil)
                outgoing.append((i, document))
            } catch {
                results[i] = Self.rejected(.structure, error.reason)
            }
        }
        // Documents with large attachments go one by one as streamed multipart PUTs.
        let streamed = outgoing.filter { !$0.document.follows.isEmpty }
        var failures = try await post(outgoing.filter { $0.document.follows.isEmpty })
        for item in streamed {
            if let failure = try await putStreamed(item.document) { failures[item.index] = failure }
        }
        // A stub the target could not match (its copy lacks the attachment): sent once more
        // with every attachment's content.
        let unmatched = outgoing.filter { failures[$0.index]?.error == "missing_stub" }
        if !unmatched.isEmpty {
            logger.debug(
                "resending revisions whose attachment stubs the target could not match", metadata: ["count": "\(unmatched.count)"])
            let (again, unrendered) = withoutStubs(unmatched)
            var stillFailing = try await post(again.filter { $0.document.follows.isEmpty })
            for item in again where !item.document.follows.isEmpty {
                if let failure = try await putStreamed(item.document) { stillFailing[item.index] = failure }
            }
            for item in unmatched { failures[item.index] = unrendered[item.index] ?? stillFailing[item.index] }
        }
        var stored = 0
        for item in outgoing where results[item.index] == nil {
            if let failure = failures[item.index] {
                results[item.index] = failure.status
                logger.info(
                    "the target refused a revision",
                    metadata: [
                        "doc": "\(LogText.escape(item.document.id))", "rev": "\(LogText.escape(item.document.rev))",
                        "error": "\(LogText.escape(failure.error))", "reason": "\(LogText.escape(failure.reason))",
                    ])
            } else {
                results[item.index] = .stored
                stored += 1
            }
        }
        if stored > 0 { try await ensureFullCommit() }
        return zip(revisions, results).map { PutResult(id: $0.id, rev: $0.rev, status: $1 ?? .stored) }
    }

    /// CouchDB has no blob store: attachments travel inside the documents, their content
    /// read from this node's blob store as `storeRevisions` renders them. Nothing is sent
    /// ahead, so every blob counts as held.
    func missingBlobs(_ digests: [BlobDigest]) async throws -> [BlobDigest] { [] }

    /// Never asked (`missingBlobs` names none); content goes with its revision.
    func putBlob(_ digest: BlobDigest, content: [UInt8]) async throws {}

    // MARK: _bulk_docs

    /// One document the target refused, as its `_bulk_docs` answer named it (or one that
    /// could not be rendered again here, `unrenderable`).
    struct BulkDocsFailure: Equatable {
        var error: String
        var reason: String

        static let unrenderable = "unrenderable"

        /// A refusal of who may write is the target's policy; anything else is the target's word.
        var status: PutStatus {
            if error == Self.unrenderable { return CouchRemote.rejected(.structure, reason) }
            let stage: Rejection.Stage = ["forbidden", "unauthorized"].contains(error) ? .policy : .peer
            return CouchRemote.rejected(stage, reason.isEmpty ? error : "\(error): \(reason)")
        }
    }

    /// The documents rendered with every attachment's content, and the failures of those
    /// that could not be.
    private func withoutStubs(_ documents: [(index: Int, document: CouchOutgoingDocument)])
        -> ([(index: Int, document: CouchOutgoingDocument)], [Int: BulkDocsFailure])
    {
        var full: [(index: Int, document: CouchOutgoingDocument)] = []
        var failures: [Int: BulkDocsFailure] = [:]
        for item in documents {
            do { full.append((item.index, try item.document.withoutStubs(blobs: store.blobs))) } catch {
                failures[item.index] = BulkDocsFailure(error: BulkDocsFailure.unrenderable, reason: error.reason)
            }
        }
        return (full, failures)
    }

    /// Posts `documents` in `_bulk_docs` requests of at most `maxBulkDocsBytes` each (a single
    /// larger document goes alone); returns the refused ones by index.
    func post(_ documents: [(index: Int, document: CouchOutgoingDocument)]) async throws -> [Int: BulkDocsFailure] {
        var failures: [Int: BulkDocsFailure] = [:]
        var batch: [(index: Int, document: CouchOutgoingDocument)] = []
        var bytes = 0
        for item in documents {
            if !batch.isEmpty && bytes + item.document.bytes.count > Self.maxBulkDocsBytes {
                failures.merge(try await postBatch(batch)) { $1 }
                batch = []
                bytes = 0
            }
            batch.append(item)
            bytes += item.document.bytes.count + 1
        }
        if !batch.isEmpty { failures.merge(try await postBatch(batch)) { $1 } }
        return failures
    }

    /// One `_bulk_docs` request. CouchDB 3 lists only failures (older servers and PouchDB
    /// Server may list successes too, which are skipped). A 400 or 413 for the whole request
    /// comes from one bad or too large document (CouchDB refuses a whole request for an ID it
    /// does not allow, such as `_ferry/…`): the batch is halved until that document stands
    /// alone and is refused by itself, so the others are stored. CouchDB 3 answers a stub it
    /// cannot match for the whole request (412 `missing_stub`, or a 500 when the stub's
    /// digest is malformed): a batch with stubs that fails so is sent once more with every
    /// attachment's content. Any other status is an error of the whole request (401/403
    /// permanent, 5xx and 429 transient).
    private func postBatch(_ batch: [(index: Int, document: CouchOutgoingDocument)]) async throws -> [Int: BulkDocsFailure] {
        var body: [UInt8] = []
        body.reserveCapacity(batch.reduce(40) { $0 + $1.document.bytes.count + 1 })
        body.append(contentsOf: #"{"docs":["#.utf8)
        for (i, item) in batch.enumerated() {
            if i > 0 { body.append(UInt8(ascii: ",")) }
            body.append(contentsOf: item.document.bytes)
        }
        body.append(contentsOf: #"],"new_edits":false}"#.utf8)
        let path = http.databasePath("_bulk_docs")
        let attachments = batch.reduce((0, 0)) {
            ($0.0 + $1.document.inlineAttachments.count, $0.1 + $1.document.stubAttachments.count)
        }
        pushState.withLock {
            $0.bulkDocsRequests += 1
            $0.attachmentsSent += attachments.0
            $0.attachmentsStubbed += attachments.1
        }
        let response = try await http.send(.POST, path, body: body)
        switch response.status {
        case 200..<300:
            break
        case let status
        where (status == 412 && response.json?["error"] == "missing_stub" || status >= 500)
            && batch.contains(where: { !$0.document.stubAttachments.isEmpty }):
            logger.debug(
                "the target failed a _bulk_docs request with attachment stubs; sending their content",
                metadata: ["status": "\(response.status)", "docs": "\(batch.count)"])
            let (full, unrendered) = withoutStubs(batch)
            var failures = full.isEmpty ? [:] : try await postBatch(full)
            failures.merge(unrendered) { $1 }
            return failures
        case 400, 413:
            let answer = response.json
            let failure = BulkDocsFailure(
                error: answer?["error"]?.stringValue ?? (response.status == 413 ? "too_large" : "bad_request"),
                reason: answer?["reason"]?.stringValue ?? "the target refused the document (HTTP \(response.status))")
            guard batch.count > 1 else { return [batch[0].index: failure] }
            logger.debug(
                "the target refused a whole _bulk_docs request; halving it",
                metadata: ["status": "\(response.status)", "docs": "\(batch.count)"])
            let half = batch.count / 2
            var failures = try await postBatch(Array(batch[..<half]))
            failures.merge(try await postBatch(Array(batch[half...]))) { $1 }
            return failures
        default:
            throw CouchClientError.http(response, method: .POST, path: path, endpoint: http.endpoint)
        }
        guard case .array(let entries)? = response.json else { throw Self.badAnswer(path, "is not a JSON array") }
        // Failures name the document and (CouchDB 3) the revision; one naming no revision
        // applies to every revision of that document in the batch.
        var byRevision: [String: BulkDocsFailure] = [:]
        var byDocument: [String: BulkDocsFailure] = [:]
        for entry in entries {
            guard let error = entry["error"]?.stringValue, let id = entry["id"]?.stringValue else { continue }
            let failure = BulkDocsFailure(error: error, reason: entry["reason"]?.stringValue ?? "")
            if let rev = entry["rev"]?.stringValue {
                byRevision[id + "\u{0}" + rev] = failure
            } else {
                byDocument[id] = failure
            }
        }
        var failures: [Int: BulkDocsFailure] = [:]
        for item in batch {
            if let f = byRevision[item.document.id + "\u{0}" + item.document.rev] ?? byDocument[item.document.id] {
                failures[item.index] = f
            }
        }
        return failures
    }

    // MARK: _ensure_full_commit

    /// `POST /{db}/_ensure_full_commit` after a batch is stored and before the Pusher writes
    /// its checkpoint, as the replication protocol asks, so that the checkpoint never runs
    /// ahead of what the target holds durably. CouchDB 3 (and a Ferry node, which answers as
    /// 3.x) commits every write before answering and keeps the endpoint only as a no-op, so
    /// it is not asked; older servers (delayed commits) are, once per stored batch. A server
    /// without the endpoint (404, 405, 501) is not asked again.
    func ensureFullCommit() async throws {
        if capabilities.commitsEveryWrite || pushState.withLock({ $0.noFullCommit }) { return }
        let path = http.databasePath("_ensure_full_commit")
        pushState.withLock { $0.fullCommitRequests += 1 }
        let response = try await http.send(.POST, path, body: Array("{}".utf8))
        switch response.status {
        case 200..<300: return
        case 404, 405, 501:
            pushState.withLock { $0.noFullCommit = true }
            logger.debug("the target has no _ensure_full_commit", metadata: ["status": "\(response.status)"])
        default:
            throw CouchClientError.http(response, method: .POST, path: path, endpoint: http.endpoint)
        }
    }

    // MARK: Helpers

    /// A refusal at `stage`, built through `PutResult`'s wire form (`stage: reason`), the
    /// one way FerrySync lets another module name a stage.
    static func rejected(_ stage: Rejection.Stage, _ reason: String) -> PutStatus {
        PutResult(["id": "", "rev": "", "status": "rejected", "reason": .string("\(stage.rawValue): \(reason)")]).status
    }

    static func badAnswer(_ path: String, _ what: String) -> CouchClientError {
        CouchClientError(.badResponse, message: "POST \(path): the answer \(what)", isTransient: true)
    }
}

extension CouchServerCapabilities {
    /// Whether the server commits each write before answering (CouchDB 3 and later, which
    /// dropped delayed commits), so `_ensure_full_commit` has nothing to do.
    var commitsEveryWrite: Bool {
        guard let major = Int(version.prefix(while: { $0 != "." })) else { return false }
        return major >= 3
    }
}

// Pushing large attachments: a document whose attachments are larger than
// `streamedAttachmentBytes` goes alone as `PUT /{db}/{id}?new_edits=false` with a
// `multipart/related` body, as CouchDB's replicator sends it, each attachment's bytes read
// from its blob file a chunk at a time while the connection takes them.
extension CouchRemote {
    /// Attachments larger than this stream as MIME parts; smaller ones go inline.
    static let streamedAttachmentBytes: Int64 = 1 << 20

    /// Whether this server's requests can stream: always (over AsyncHTTPClient, and over
    /// `PinnedHTTPS` for a pinned certificate).
    var streamsAttachments: Bool { true }

    /// One document as a streamed multipart PUT; the target's refusal, or nil when stored.
    func putStreamed(_ document: CouchOutgoingDocument) async throws -> BulkDocsFailure? {
        let boundary = Multipart.newBoundary()
        var pieces: [StreamedBody.Piece] = [
            .bytes(Array("--\(boundary)\r\nContent-Type: application/json\r\n\r\n".utf8) + document.bytes + Array("\r\n".utf8))
        ]
        var readers: [BlobReader] = []
        for (name, attachment) in document.follows {
            guard let reader = try store.blobs.reader(attachment.blob) else {
                return BulkDocsFailure(error: BulkDocsFailure.unrenderable, reason: "attachment \(name): its content is not in this node's blob store")
            }
            readers.append(reader)
            let quoted = name.replacingOccurrences(of: "\"", with: "%22")
            let head =
                "--\(boundary)\r\nContent-Disposition: attachment; filename=\"\(quoted)\"\r\nContent-Type: \(attachment.contentType)\r\n"
                + "Content-Length: \(attachment.length)\r\n\r\n"
            pieces.append(.bytes(Array(head.utf8)))
            pieces.append(.blob(reader, offset: 0, count: attachment.length))
            pieces.append(.bytes(Array("\r\n".utf8)))
        }
        pieces.append(.bytes(Array("--\(boundary)--".utf8)))
        let path = http.databasePath(Self.documentSuffix(document.id))
        pushState.withLock {
            $0.streamedPuts += 1
            $0.attachmentsSent += document.inlineAttachments.count
            $0.attachmentsStubbed += document.stubAttachments.count
        }
        let attachmentBytes = document.follows.reduce(Int64(0)) { $0 + Int64($1.attachment.length) }
        countBlob { $0.blobBytesToSend += attachmentBytes }
        let response = try await http.upload(
            .PUT, path, query: [("new_edits", "false")],
            headers: [("Content-Type", "multipart/related; boundary=\"\(boundary)\"")], body: StreamedBody(pieces: pieces))
        switch response.status {
        case 200..<300:
            countBlob {
                $0.blobBytesSent += attachmentBytes
                $0.blobsSent += document.follows.count
            }
            return nil
        case 400, 403, 409, 412, 413, 415:
            let answer = response.json
            return BulkDocsFailure(
                error: answer?["error"]?.stringValue ?? "http_\(response.status)",
                reason: answer?["reason"]?.stringValue ?? "the target refused the document (HTTP \(response.status))")
        default:
            throw CouchClientError.http(response, method: .PUT, path: path, endpoint: http.endpoint)
        }
    }
}
