import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import HummingbirdCore
import HTTPTypes
import NIOCore

// The document endpoints: `/{db}/{id}`, `POST /{db}`, attachments, `_bulk_docs`, `_bulk_get`.
extension CouchDatabase {
    /// `GET|HEAD|PUT|DELETE /{db}/{id}` (and `_design/…`).
    func document(_ request: Request, context: CouchRequestContext, id: String) async throws -> Response {
        let principal = try context.requirePrincipal()
        switch request.method {
        case .get, .head: return try await readDocument(request, principal: principal, rawID: id)
        case .put: return try await putDocument(request, principal: principal, rawID: id)
        case .delete: return try await deleteDocument(request, principal: principal, rawID: id)
        default:
            if request.method.rawValue == "COPY" {
                throw CouchError(.methodNotAllowed, "method_not_allowed", "COPY is not supported by this server")
            }
            throw CouchError.methodNotAllowed("GET,HEAD,PUT,DELETE")
        }
    }

    /// `POST /{db}`: a new document, with a generated ID when it names none (called by the
    /// database endpoint, which owns `/{db}`).
    func postDocument(_ request: Request, context: CouchRequestContext) async throws -> Response {
        let principal = try context.requirePrincipal()
        guard Multipart.mediaType(request.headers[.contentType]) == "application/json" else {
            throw CouchError.unsupportedMediaType("Content-Type must be application/json")
        }
        var input = try CouchDocumentInput(parsing: try await readJSON(request))
        let id = input.id ?? Hex.encode((0..<16).map { _ in UInt8.random(in: 0...255) })
        input.id = id
        return try writeOne(input, rawID: id, parentText: input.rev, principal: principal)
    }

    /// `PUT /{db}/{id}`: JSON or `multipart/related` (the document, then its attachments).
    func putDocument(_ request: Request, principal: CouchPrincipal, rawID: String) async throws -> Response {
        let q = request.uri.queryParameters
        var input: CouchDocumentInput
        let contentType = request.headers[.contentType]
        if Multipart.mediaType(contentType) == "multipart/related" {
            input = try await readMultipartDocument(request, contentType: contentType ?? "")
        } else {
            input = try CouchDocumentInput(parsing: try await readJSON(request))
        }
        if let bodyID = input.id, bodyID != rawID {
            throw CouchError.badRequest("Document id in the body does not match the path")
        }
        input.id = rawID
        if try queryBool(q, "new_edits") == false {
            let incoming: IncomingRevision
            let id = try couchDocumentID(rawID, replicated: true)
            let trees = try store.revisionTrees([id])
            do { incoming = try prepareReplicated(input: input, pathID: rawID, trees: trees, principal: principal) } catch {
                reportReplicated(stored: [], refused: [error], principal: principal)
                throw error.error
            }
            let outcome = try await store.insertRevisionsSuspending([incoming]).first!
            if case .rejected(let e) = outcome {
                let failure = DocumentFailure(
                    id: rawID, rev: incoming.revision.description, error: couchError(e),
                    stage: e.isValidationRefusal ? "validation" : "structure")
                reportReplicated(stored: [], refused: [failure], principal: principal)
                throw failure.error
            }
            if case .inserted = outcome { reportReplicated(stored: [incoming], refused: [], principal: principal) }
            return writeAnswer(id: rawID, rev: incoming.revision)
        }
        let rev = try editRevision(
            query: q.get("rev").map { String($0) }, ifMatch: request.headers[.ifMatch], body: input.rev)
        return try writeOne(input, rawID: rawID, parentText: rev, principal: principal)
    }

    /// `DELETE /{db}/{id}?rev=`: a tombstone on that leaf.
    func deleteDocument(_ request: Request, principal: CouchPrincipal, rawID: String) async throws -> Response {
        let rev = try editRevision(
            query: request.uri.queryParameters.get("rev").map { String($0) }, ifMatch: request.headers[.ifMatch], body: nil)
        guard let rev else { throw CouchError.conflict() }
        var input = try CouchDocumentInput(parsing: .object([:]))
        input.deleted = true
        var response = try writeOne(input, rawID: rawID, parentText: rev, principal: principal)
        response.status = .ok  // CouchDB answers a deletion with 200
        return response
    }

    /// One ordinary edit, answered `201 {"ok":true,"id","rev"}`.
    func writeOne(_ input: CouchDocumentInput, rawID: String, parentText: String?, principal: CouchPrincipal) throws
        -> Response
    {
        let id = try couchDocumentID(rawID)
        let tree = try store.revisionTree(id)
        if input.deleted && tree == nil { throw CouchError.notFound("missing") }
        let edit = try prepareEdit(id: id, input: input, parentText: parentText, tree: tree, principal: principal)
        let rev: RevisionID
        do { rev = try store.write { txn throws(StoreError) in try apply(edit, in: txn) } } catch { throw couchError(error) }
        return writeAnswer(id: rawID, rev: rev)
    }

    func writeAnswer(id: String, rev: RevisionID) -> Response {
        var headers = HTTPFields()
        headers[.eTag] = "\"\(rev.description)\""
        return CouchResponse.json(
            ["ok": true, "id": .string(id), "rev": .string(rev.description)], status: .created, headers: headers)
    }

    // MARK: Reading

    func readDocument(_ request: Request, principal: CouchPrincipal, rawID: String) async throws -> Response {
        let q = request.uri.queryParameters
        let id = try couchDocumentID(rawID, replicated: true)
        let options = try renderOptions(q)
        let latest = try queryBool(q, "latest") ?? false
        let stored = try store.revisionTree(id)
        if let openRevs = q.get("open_revs") {
            // A document that is absent, or that the principal may not read, has every named
            // revision missing (CouchDB answers `[{"missing":rev}]`, not 404).
            var visible = stored
            if let tree = stored {
                do { try checkReadable(id, tree: tree, principal: principal) } catch let e as CouchError where e.status == .notFound {
                    visible = nil
                }
            }
            return try openRevisions(
                request, id: id, tree: visible, spec: String(openRevs), latest: latest, options: options,
                access: DocumentAccess(principal.policy))
        }
        guard let tree = stored, let winner = tree.winner else { throw CouchError.notFound("missing") }
        try checkReadable(id, tree: tree, principal: principal)
        var revision = winner.id
        if let revText = q.get("rev") {
            revision = try parseRevision(String(revText))
            guard tree.contains(revision) else { throw CouchError.notFound("missing") }
            if latest, let leaf = leaves(descendingFrom: revision, in: tree).first { revision = leaf }
            try checkReadable(id, revision: revision, tree: tree, principal: principal)
        } else if winner.deleted {
            // `?deleted=true` asks for the tombstone itself, as CouchDB 3 answers it.
            guard try queryBool(q, "deleted") == true else { throw CouchError.notFound("deleted") }
        }
        guard var view = try view(of: id, revision: revision, in: tree) else { throw CouchError.notFound("missing") }
        let localSeq = try queryBool(q, "local_seq") ?? false
        if localSeq { view.sequence = try store.document(id)?.sequence }
        let wantsRelated = accepts(request, "multipart/related")
        let rendered = try render(view, options: options, multipart: wantsRelated, localSeq: localSeq)
        var headers = HTTPFields()
        headers[.eTag] = "\"\(revision.description)\""
        if request.headers[values: .ifNoneMatch].contains(headers[.eTag]!) {
            return Response(status: .notModified, headers: headers, body: .init())
        }
        let response: Response
        if wantsRelated && !rendered.follows.isEmpty {
            let boundary = Multipart.newBoundary()
            let bytes = Multipart.write(try relatedParts(rendered.json, rendered.follows), boundary: boundary)
            headers.append(contentsOf: Self.rawContentHeaders)
            headers[.contentType] = "multipart/related; boundary=\"\(boundary)\""
            response = Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
        } else {
            response = CouchResponse.json(rendered.json, headers: headers)
        }
        return request.method == .head ? headOnly(response) : response
    }

    /// `open_revs=all|[…]`: the named (or all) leaves as `[{"ok":doc}|{"missing":rev}]`, or
    /// as `multipart/mixed` when the client accepts it (CouchDB's replicator does).
    /// As multipart, attachment bodies follow (all, or those newer than `atts_since`) even
    /// without `attachments=true`: CouchDB's replicator asks that way and expects them.
    func openRevisions(
        _ request: Request, id: DocumentID, tree: RevisionTree?, spec: String, latest: Bool, options: CouchRenderOptions,
        access: DocumentAccess
    ) throws -> Response {
        var wanted: [RevisionID] = []
        var missing: [String] = []
        if spec == "all" {
            guard let tree else { throw CouchError.notFound("missing") }
            wanted = tree.leaves.sorted(by: RevisionTree.beats).map(\.id)
        } else {
            guard case .array(let list)? = try? JSON.parse(spec) else {
                throw CouchError.badRequest("open_revs must be \"all\" or a JSON array of revisions")
            }
            for item in list {
                guard let text = item.stringValue else { throw CouchError.badRequest("Invalid rev format") }
                let rev = try parseRevision(text)
                guard let tree, tree.contains(rev) else {
                    missing.append(text)
                    continue
                }
                if latest {
                    for leaf in leaves(descendingFrom: rev, in: tree) where !wanted.contains(leaf) { wanted.append(leaf) }
                } else if !wanted.contains(rev) {
                    wanted.append(rev)
                }
            }
        }
        let mixed = accepts(request, "multipart/mixed")
        var options = options
        if mixed { options.attachments = true }
        var results: [(JSON, [(name: String, attachment: StoredAttachment)])] = []
        for rev in wanted {
            guard let tree, access.mayRead(id, revision: rev, in: tree), let view = try view(of: id, revision: rev, in: tree) else {
                missing.append(rev.description)
                continue
            }
            results.append(try render(view, options: options, multipart: mixed))
        }
        if !mixed {
            var items: [JSON] = results.map { ["ok": $0.0] }
            items += missing.map { ["missing": .string($0)] }
            return CouchResponse.json(.array(items))
        }
        var parts: [(headers: [(String, String)], body: [UInt8])] = []
        for (json, follows) in results {
            if follows.isEmpty {
                parts.append(([("Content-Type", "application/json")], json.canonicalBytes))
            } else {
                let inner = Multipart.newBoundary()
                parts.append(
                    ([("Content-Type", "multipart/related; boundary=\"\(inner)\"")],
                    Multipart.write(try relatedParts(json, follows), boundary: inner)))
            }
        }
        for rev in missing {
            parts.append(([("Content-Type", "application/json; error=\"true\"")], JSON.object(["missing": .string(rev)]).canonicalBytes))
        }
        let boundary = Multipart.newBoundary()
        var headers = Self.rawContentHeaders
        headers[.contentType] = "multipart/mixed; boundary=\"\(boundary)\""
        let body = Multipart.write(parts, boundary: boundary)
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }

    /// The parts of a `multipart/related` document: its JSON, then each `follows` attachment.
    func relatedParts(_ json: JSON, _ follows: [(name: String, attachment: StoredAttachment)]) throws
        -> [(headers: [(String, String)], body: [UInt8])]
    {
        var parts: [(headers: [(String, String)], body: [UInt8])] = [([("Content-Type", "application/json")], json.canonicalBytes)]
        for (name, att) in follows {
            let wire = try att.wireForm(store.blobs)
            let quoted = name.replacingOccurrences(of: "\"", with: "%22")
            var headers = [
                ("Content-Disposition", "attachment; filename=\"\(quoted)\""), ("Content-Type", att.contentType),
                ("Content-Length", String(wire.bytes.count)),
            ]
            if wire.gzip { headers.append(("Content-Encoding", "gzip")) }
            parts.append((headers, wire.bytes))
        }
        return parts
    }

    /// The leaves whose history includes `rev`, best first.
    func leaves(descendingFrom rev: RevisionID, in tree: RevisionTree) -> [RevisionID] {
        tree.leaves.filter { tree.history(of: $0.id).contains(rev) }.sorted(by: RevisionTree.beats).map(\.id)
    }

    /// A document the principal may not read is, for it, missing (`DocumentAccess`: every
    /// live leaf must be readable, not only the winner).
    func checkReadable(_ id: DocumentID, tree: RevisionTree, principal: CouchPrincipal) throws {
        if CouchDatabase.isNodeInternal(id) { throw CouchError.notFound("missing") }
        if !DocumentAccess(principal.policy).mayRead(id, tree: tree) { throw CouchError.notFound("missing") }
    }

    /// A revision the principal may not read is, for it, missing.
    func checkReadable(_ id: DocumentID, revision: RevisionID, tree: RevisionTree, principal: CouchPrincipal) throws {
        try checkReadable(id, tree: tree, principal: principal)
        if !DocumentAccess(principal.policy).mayRead(id, revision: revision, in: tree) { throw CouchError.notFound("missing") }
    }

    /// The rendering options of a document read's query.
    func renderOptions(_ q: FlatDictionary<Substring, Substring>) throws -> CouchRenderOptions {
        var o = CouchRenderOptions()
        o.conflicts = try queryBool(q, "conflicts") ?? false
        o.deletedConflicts = try queryBool(q, "deleted_conflicts") ?? false
        o.revs = try queryBool(q, "revs") ?? false
        o.revsInfo = try queryBool(q, "revs_info") ?? false
        o.attachments = try queryBool(q, "attachments") ?? false
        if let since = q.get("atts_since") {
            guard case .array(let list)? = try? JSON.parse(String(since)) else {
                throw CouchError.badRequest("atts_since must be a JSON array of revisions")
            }
            for item in list {
                guard let s = item.stringValue else { throw CouchError.badRequest("Invalid rev format") }
                o.attsSince.append(try parseRevision(s))
            }
        }
        return o
    }

    /// A `true`/`false` query parameter; nil when absent, 400 for anything else.
    func queryBool(_ q: FlatDictionary<Substring, Substring>, _ name: String) throws -> Bool? {
        guard let v = q.get(name) else { return nil }
        switch v {
        case "true": return true
        case "false": return false
        default: throw CouchError.badRequest("Invalid boolean parameter: \(name)=\(v)")
        }
    }

    func accepts(_ request: Request, _ mediaType: String) -> Bool {
        request.headers[values: .accept].contains { $0.lowercased().contains(mediaType) }
    }

    /// A `HEAD` answer: the headers of the `GET`, with its length, without a body.
    func headOnly(_ response: Response) -> Response {
        var headers = response.headers
        headers[.contentLength] = String(response.body.contentLength ?? 0)
        return Response(status: response.status, headers: headers, body: .init())
    }

    /// A `multipart/related` document body: the JSON part first, then one part per
    /// `follows` attachment, matched by `Content-Disposition` filename, then by digest,
    /// then by length. Read as it arrives: the JSON part is bounded by `maxRequestBytes`,
    /// and a part larger than `MultipartSpool.memoryBytes` streams into the blob store
    /// (bounded by `maxAttachmentBytes`), so attachments of any size never sit in memory.
    func readMultipartDocument(_ request: Request, contentType: String) async throws -> CouchDocumentInput {
        guard let boundary = Multipart.boundary(of: contentType) else {
            throw CouchError.badRequest("multipart/related needs a boundary")
        }
        var document: [UInt8]?
        var spooled: [MultipartSpool.Part] = []
        if Self.contentEncodings(request).isEmpty {
            var reader = MultipartStreamReader(boundary: boundary, maxFirstPartBytes: maxRequestBytes)
            let spool = MultipartSpool(blobs: store.blobs, maxMemoryTotal: maxRequestBytes, maxPartBytes: maxAttachmentBytes)
            do {
                for try await chunk in request.body {
                    try reader.feed(chunk) { event in
                        switch event {
                        case .document(let bytes): document = bytes
                        case .begin(let headers): try spool.begin(headers)
                        case .bytes(let b): try spool.write(b)
                        case .end: try spool.end()
                        }
                    }
                }
                try reader.finish()
            } catch {
                spool.discard()
                throw error
            }
            spooled = spool.parts
        } else {
            let buffer = try await readBody(request)
            let parts = try Multipart.parse(Array(buffer.readableBytesView), boundary: boundary)
            document = parts.first?.body
            spooled = parts.dropFirst().map { MultipartSpool.Part(headers: $0.headers, content: .bytes($0.body)) }
        }
        guard let first = document else { throw CouchError.badRequest("multipart body has no document part") }
        let json = try Self.parseJSON(first)
        var input = try CouchDocumentInput(parsing: json)
        var pending = (input.attachments ?? [:]).filter { $0.value.follows }
        var unnamed: [MultipartSpool.Part] = []
        for part in spooled {
            if let name = Multipart.filename(part.headers["content-disposition"]), pending[name] != nil {
                input.attachments![name] = try filled(pending.removeValue(forKey: name)!, part)
            } else {
                unnamed.append(part)
            }
        }
        for part in unnamed {
            let md5 = part.md5
            var match = pending.first { if case .content(_, _, _, let d, _, _) = $0.value { return d == md5 } else { return false } }?.key
            if match == nil {
                let sameLength = pending.filter {
                    if case .content(_, _, let l, _, _, _) = $0.value { return l == part.length } else { return false }
                }
                if sameLength.count == 1 { match = sameLength.first!.key }
            }
            guard let name = match else { throw CouchError.badRequest("a multipart attachment part matches no attachment") }
            input.attachments![name] = try filled(pending.removeValue(forKey: name)!, part)
        }
        if let name = pending.keys.first { throw CouchError.badRequest("Attachment \(name) says follows but no part carries it") }
        return input
    }

    /// A `follows` attachment with its part's content: bytes in memory, or content already
    /// streamed to the blob store (gzip-encoded content is read back, bounded, to be decoded).
    private func filled(_ att: IncomingAttachment, _ part: MultipartSpool.Part) throws -> IncomingAttachment {
        guard case .content(_, let contentType, let length, let digest, let revpos, let encoding) = att else { return att }
        switch part.content {
        case .bytes(let bytes):
            return .content(bytes: bytes, contentType: contentType, length: length, digest: digest, revpos: revpos, encoding: encoding)
        case .stored(var entry):
            if encoding != nil {
                guard entry.length <= Int64(maxRequestBytes), let reader = try store.blobs.reader(entry.blob) else {
                    throw CouchError.tooLarge("A gzip-encoded attachment part is larger than \(maxRequestBytes) bytes.")
                }
                let bytes = try reader.read(offset: 0, count: Int(entry.length))
                return .content(bytes: bytes, contentType: contentType, length: length, digest: digest, revpos: revpos, encoding: encoding)
            }
            entry.contentType = contentType
            return .spooled(stored: entry, length: length, digest: digest, revpos: revpos)
        }
    }
}

