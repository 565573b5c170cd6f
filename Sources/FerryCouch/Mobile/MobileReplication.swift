import FerryBLIP
import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation

/// The server role of Couchbase Lite's replication protocol (as Sync Gateway plays it) over
/// one `MobileSession`: checkpoints kept as `_local` documents, the changes feed a pull
/// subscribes to, and pushes proposed and then sent revision by revision. Every revision in
/// or out passes the same checks as the CouchDB API's: the principal's read and write rules,
/// the node's pull filter, validation.
extension MobileSession {
    /// Answers one request by its profile.
    func answer(_ request: BLIPMessage) async {
        do {
            try checkCollection(request)
            switch request.profile {
            case "getCheckpoint": try getCheckpoint(request)
            case "setCheckpoint": try setCheckpoint(request)
            case "getCollections": try getCollections(request)
            case "subChanges": try await subChanges(request)
            case "proposeChanges":
                try await storeWork(bulk: request.body.count >= Self.bulkRequestBytes) { try self.proposeChanges(request) }
            case "changes":
                // As a server in conflict-free mode: the client must propose its changes.
                throw MobileRequestError(domain: "HTTP", code: 409, "this server takes proposeChanges")
            case "rev": try await receiveRevision(request)
            case "norev": break  // a revision asked for that the client no longer has
            case "getAttachment": try getAttachment(request)
            default:
                throw MobileRequestError(domain: "BLIP", code: 404, "no handler for message")
            }
        } catch let e as MobileRequestError {
            logger.debug("request refused", metadata: ["profile": "\(request.profile ?? "")", "code": "\(e.code)", "reason": "\(e.message)"])
            fail(request, domain: e.domain, code: e.code, e.message)
        } catch let e as CouchError {
            fail(request, code: Int(e.status.code), e.reason)
        } catch is MobileClose {
            return
        } catch {
            logger.warning("request failed", metadata: ["profile": "\(request.profile ?? "")", "error": "\(error)"])
            fail(request, code: 500, "\(error)")
        }
    }

    // MARK: checkpoints

    static func checkpointKey(_ client: String) -> String { CouchLocalDocuments.key("checkpoint/" + client) }

    func clientID(_ request: BLIPMessage) throws(MobileRequestError) -> String {
        guard let client = request["client"], !client.isEmpty, client.utf8.count <= 256 else {
            throw MobileRequestError(code: 400, "missing or overlong 'client' property")
        }
        return client
    }

    /// The stored checkpoint of `client`, if this principal may see it.
    func storedCheckpoint(_ client: String) throws -> JSON? {
        guard let stored = try database.store.localDocument(Self.checkpointKey(client)) else { return nil }
        guard CouchLocalDocuments.isVisible(stored, to: principal) else { return nil }
        return stored
    }

    /// Where a stored checkpoint keeps the read rule its pull was judged by (beside `doc`, the app's).
    static let judgedByKey = "readJudgedBy"

    /// The read rule the changes up to an app's checkpoint were judged by, if it kept one.
    func checkpointReadRule() -> AccessRule? {
        guard let client = checkpointClient.withLock({ $0 }), let stored = try? storedCheckpoint(client),
            let record = stored[Self.judgedByKey]
        else { return nil }
        return try? AccessRule(record: record)
    }

    func getCheckpoint(_ request: BLIPMessage) throws {
        let client = try clientID(request)
        checkpointClient.withLock { $0 = client }
        guard let stored = try storedCheckpoint(client) else { throw MobileRequestError(code: 404, "missing") }
        respond(to: request, json: stored["doc"] ?? [:], properties: [("rev", "0-\(stored["rev"]?.intValue ?? 0)")])
    }

    func setCheckpoint(_ request: BLIPMessage) throws {
        let client = try clientID(request)
        guard let fields = (try? JSON.parse(request.body))?.objectValue else {
            throw MobileRequestError(code: 400, "a checkpoint must be a JSON object")
        }
        if principal != .admin, request.body.count > CouchLocalDocuments.maxUserBytes {
            throw MobileRequestError(code: 413, "a checkpoint is at most \(CouchLocalDocuments.maxUserBytes) bytes")
        }
        let key = Self.checkpointKey(client)
        let current = try database.store.localDocument(key)
        // The `_local` rules: a user changes only its own, and owns at most 100.
        try database.checkOwnership(current, principal: principal, creating: current == nil)
        let currentRev = current.map { "0-\($0["rev"]?.intValue ?? 0)" }
        // MVCC as Sync Gateway: the given rev must be the current one (none for a new checkpoint).
        let given = request["rev"].flatMap { $0.isEmpty ? nil : $0 }  // "" says none, as a missing property
        if given != currentRev {
            throw MobileRequestError(code: 409, "checkpoint \(client) has changed (current revision \(currentRev ?? "none"))")
        }
        let next = (current?["rev"]?.intValue ?? 0) + 1
        var stored: [String: JSON] = ["rev": .int(next), "doc": .object(fields), "owner": current?["owner"] ?? .string(principal.name)]
        // The read rule the pull's changes so far were judged by, kept beside the app's own
        // checkpoint: if the user's rules change while the app is away, its next pull judges
        // those changes again (removals, and documents it may now read). A connection without
        // a pull keeps the one stored.
        if let judged = feedJudgedBy.withLock({ $0 }) ?? current?[Self.judgedByKey].flatMap({ try? AccessRule(record: $0) }) {
            stored[Self.judgedByKey] = judged.record
        }
        guard try database.store.replaceLocalDocument(key, expected: current, with: .object(stored)) else {
            throw MobileRequestError(code: 409, "checkpoint \(client) changed while being saved")
        }
        respond(to: request, properties: [("rev", "0-\(next)")])
    }

    /// `getCollections` (3.1+): this node serves the default collection only.
    func getCollections(_ request: BLIPMessage) throws {
        guard let root = (try? JSON.parse(request.body))?.objectValue, case .array(let ids)? = root["checkpoint_ids"],
            case .array(let collections)? = root["collections"], ids.count == collections.count
        else { throw MobileRequestError(domain: "BLIP", code: 400, "Invalid getCollections message") }
        var answers: [JSON] = []
        for (id, collection) in zip(ids, collections) {
            guard let path = collection.stringValue, let client = id.stringValue else {
                throw MobileRequestError(domain: "BLIP", code: 400, "Invalid getCollections message")
            }
            guard ["_default", "_default._default"].contains(path) else {
                answers.append(.null)
                continue
            }
            checkpointClient.withLock { $0 = client }
            if let stored = try storedCheckpoint(client) {
                var doc = stored["doc"]?.objectValue ?? [:]
                doc["rev"] = .string("0-\(stored["rev"]?.intValue ?? 0)")
                answers.append(.object(doc))
            } else {
                answers.append([:])
            }
        }
        respond(to: request, json: .array(answers))
    }

    // MARK: pushes

    /// `proposeChanges`: `[[docID, revID, serverRevID?, size?], …]` → per change 0 (send it),
    /// 304 (already here), 409 (conflicts with the current revision), 403 or 400.
    func proposeChanges(_ request: BLIPMessage) throws {
        guard case .array(let items)? = try? JSON.parse(request.body) else {
            throw MobileRequestError(code: 400, "proposeChanges needs a JSON array")
        }
        let includeRev = request["conflictIncludesRev"] == "true"
        var parsed: [(DocumentID, RevisionID, String)?] = []
        for item in items {
            guard case .array(let a) = item, let rawID = a.first?.stringValue, a.count >= 2, let revText = a[1].stringValue,
                let id = try? database.couchDocumentID(rawID, replicated: true), let rev = try? RevisionID(revText)
            else {
                parsed.append(nil)
                continue
            }
            parsed.append((id, rev, a.count > 2 ? a[2].stringValue ?? "" : ""))
        }
        let trees = try database.store.revisionTrees(parsed.compactMap { $0?.0 })
        var statuses: [JSON] = []
        for entry in parsed {
            guard let (id, rev, serverRev) = entry else {
                statuses.append(400)
                continue
            }
            if CouchDatabase.isNodeInternal(id) {
                statuses.append(403)
                continue
            }
            guard let tree = trees[id], let winner = tree.winner else {
                statuses.append(0)
                continue
            }
            if tree.contains(rev) {
                statuses.append(304)
            } else if serverRev == winner.id.description || (serverRev.isEmpty && winner.deleted) {
                statuses.append(0)
            } else {
                // Sync Gateway's answer: a conflict, naming the current revision when asked to.
                statuses.append(includeRev ? ["status": 409, "rev": .string(winner.id.description)] : 409)
            }
        }
        while let last = statuses.last, last == 0 { statuses.removeLast() }
        respond(to: request, json: .array(statuses))
    }

    /// `rev` from the client: one revision with its history, checked at the trust boundary and
    /// stored; answered once durable, or with the error that refused it.
    func receiveRevision(_ request: BLIPMessage) async throws {
        guard let rawID = request["id"], let revText = request["rev"] else {
            throw MobileRequestError(code: 400, "a rev message needs 'id' and 'rev'")
        }
        let deleted = Self.bool(request["deleted"])
        var fields: [String: JSON] = [:]
        if !request.body.isEmpty {
            guard let object = (try? JSON.parse(request.body))?.objectValue else {
                throw MobileRequestError(code: 400, "the body of \(rawID) is not a JSON object")
            }
            fields = object
        }
        for key in ["_id", "_rev", "_deleted", "_revisions"] { fields.removeValue(forKey: key) }
        guard let rev = try? RevisionID(revText) else { throw MobileRequestError(code: 400, "invalid revision ID \(revText)") }
        var history: [RevisionID] = []
        for h in (request["history"] ?? "").split(separator: ",") {
            let text = h.trimmingCharacters(in: .whitespaces)
            guard let r = try? RevisionID(text) else { throw MobileRequestError(code: 400, "invalid revision ID \(text) in history") }
            history.append(r)
        }
        // CouchDB's form of the history: consecutive generations, newest first.
        var hashes = [rev.hashText]
        for (k, r) in history.enumerated() {
            guard r.generation == rev.generation - k - 1 else { break }
            hashes.append(r.hashText)
        }
        let id = try database.couchDocumentID(rawID, replicated: true)
        var attachments: [String: StoredAttachment] = [:]
        if fields["_attachments"] != nil || Self.holdsBlob(.object(fields)) {
            (fields, attachments) = try await importBlobs(fields, docID: rawID, tree: try database.store.revisionTrees([id])[id])
        }
        var doc = fields
        doc["_id"] = .string(rawID)
        doc["_rev"] = .string(rev.description)
        doc["_revisions"] = ["start": .int(Int64(rev.generation)), "ids": .array(hashes.map { .string($0) })]
        if deleted { doc["_deleted"] = true }
        var input = try CouchDocumentInput(parsing: .object(doc))
        if !attachments.isEmpty {
            // Streamed into the blob store already: referred to, never copied into the body.
            input.attachments = attachments.mapValues { .spooled(stored: $0, length: nil, digest: nil, revpos: nil) }
        }
        let pushed = PushedRevision(
            id: id, rev: rev, history: history, input: input, noConflicts: Self.bool(request["noconflicts"]))
        try await inserter.insert(pushed).get()
        respond(to: request)
    }

    /// Checks and stores a batch of pushed revisions: one read of their documents' trees, each
    /// checked at the trust boundary (conflict-free mode, the principal's policy, the pull
    /// filter), then one write of those that passed; each answer says what became of its own.
    func store(_ batch: [PushedRevision]) async -> [Result<Void, MobileRequestError>] {
        let trees: [DocumentID: RevisionTree]
        let ids = batch.map(\.id)
        do { trees = try await storeWork(bulk: ids.count >= Self.bulkDocuments) { try self.database.store.revisionTrees(ids) } } catch {
            return batch.map { _ in .failure(MobileRequestError(code: 503, "\(error)")) }
        }
        var results = [Result<Void, MobileRequestError>](repeating: .success(()), count: batch.count)
        var prepared: [(Int, IncomingRevision)] = []
        var refused: [DocumentFailure] = []
        for (i, pushed) in batch.enumerated() {
            if pushed.noConflicts, let tree = trees[pushed.id], let winner = tree.winner, !tree.contains(pushed.rev) {
                let ancestry = Set(pushed.history.map(\.description))
                if !ancestry.contains(winner.id.description) && !(winner.deleted && pushed.history.isEmpty) {
                    results[i] = .failure(MobileRequestError(code: 409, "\(pushed.id) \(pushed.rev) conflicts with the current revision \(winner.id)"))
                    continue
                }
            }
            do { prepared.append((i, try database.prepareReplicated(input: pushed.input, pathID: nil, trees: trees, principal: principal))) } catch {
                refused.append(error)
                results[i] = .failure(MobileRequestError(code: Int(error.error.status.code), error.error.reason))
            }
        }
        var stored: [IncomingRevision] = []
        if !prepared.isEmpty {
            do {
                // Committed without an fsync, as Ferry's own replication stores pushed revisions:
                // a power loss can drop only the last commits, and every commit after them, the
                // app's checkpoint included (setCheckpoint commits with the store's full
                // durability); the app then finds its checkpoint gone and pushes them again.
                let outcomes = try await database.store.insertRevisionsSuspending(prepared.map(\.1), durability: .normal)
                for ((i, incoming), outcome) in zip(prepared, outcomes) {
                    switch outcome {
                    case .inserted: stored.append(incoming)
                    case .alreadyPresent: break
                    case .rejected(let e):
                        let couch = database.couchError(e)
                        refused.append(
                            DocumentFailure(
                                id: incoming.id.rawValue, rev: incoming.revision.description, error: couch,
                                stage: e.isValidationRefusal ? "validation" : "structure"))
                        results[i] = .failure(MobileRequestError(code: Int(couch.status.code), couch.reason))
                    }
                }
            } catch {
                for (i, _) in prepared { results[i] = .failure(MobileRequestError(code: 503, "\(error)")) }
            }
        }
        database.reportReplicated(stored: stored, refused: refused, principal: principal)
        return results
    }

    /// Store work for a bulk request (`bulkRequestBytes` of body, `bulkDocuments` documents)
    /// runs on threads made for blocking work, so that it never holds one of the cooperative
    /// pool's threads; a live one in place, where two thread hand-offs cost more than the work
    /// (docs/architecture.md, "Blocking calls and the cooperative pool").
    func storeWork<T: Sendable>(bulk: Bool, _ work: @escaping @Sendable () throws -> T) async throws -> T {
        bulk ? try await BlockingIO.run(work) : try work()
    }
    static let bulkRequestBytes = 4096
    static let bulkDocuments = 32

    static func bool(_ value: String?) -> Bool {
        guard let value else { return false }
        return value.lowercased() == "true" || value.lowercased() == "yes" || (Int(value) ?? 0) != 0
    }

    /// Whether a body holds a Couchbase Lite blob (`"@type": "blob"`) anywhere.
    static func holdsBlob(_ value: JSON) -> Bool {
        switch value {
        case .object(let o): return o["@type"]?.stringValue == "blob" || o.values.contains(where: holdsBlob)
        case .array(let a): return a.contains(where: holdsBlob)
        default: return false
        }
    }
}
