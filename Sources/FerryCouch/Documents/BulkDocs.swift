import FerryCore
import FerryCouchDocuments
import FerryStore
import FerrySync
import Foundation
import Hummingbird
import NIOCore

// `_bulk_docs` and `_bulk_get`: many documents per request, each answered on its own.
extension CouchDatabase {
    /// `POST /{db}/_bulk_docs` with `docs` and `new_edits`: each valid document is stored
    /// and each bad one reported, in one store transaction per request.
    func bulkDocs(_ request: Request, context: CouchRequestContext) async throws -> Response {
        let principal = try context.requirePrincipal()
        guard request.method == .post else { throw CouchError.methodNotAllowed("POST") }
        try requireJSONContent(request)
        let json = try await readJSON(request)
        guard case .array(let docs)? = json["docs"] else {
            throw CouchError.badRequest("POST body must include `docs` parameter.")
        }
        var newEdits = true
        if let v = json["new_edits"] {
            guard let b = v.boolValue else { throw CouchError.badRequest("`new_edits` parameter must be a boolean.") }
            newEdits = b
        }
        if newEdits {
            return CouchResponse.json(.array(try await bulkEdits(docs, principal: principal)), status: .created)
        }
        return CouchResponse.json(.array(try await bulkReplicated(docs, principal: principal)), status: .created)
    }

    /// Ordinary edits: `{"ok":true,"id","rev"}` or `{"id","error","reason"}` per document, in order.
    func bulkEdits(_ docs: [JSON], principal: CouchPrincipal) async throws -> [JSON] {
        var answers = [JSON?](repeating: nil, count: docs.count)
        var parsed: [(index: Int, id: DocumentID, input: CouchDocumentInput)] = []
        for (i, doc) in docs.enumerated() {
            let rawID = doc["_id"]?.stringValue ?? Hex.encode((0..<16).map { _ in UInt8.random(in: 0...255) })
            do throws(CouchError) {
                var input = try CouchDocumentInput(parsing: doc)
                input.id = rawID
                parsed.append((i, try couchDocumentID(rawID), input))
            } catch {
                answers[i] = DocumentFailure(id: rawID, rev: nil, error: error).json
            }
        }
        let trees = try store.revisionTrees(parsed.map(\.id))
        var prepared: [(index: Int, edit: PreparedEdit)] = []
        for p in parsed {
            do throws(CouchError) {
                prepared.append(
                    (p.index, try prepareEdit(id: p.id, input: p.input, parentText: p.input.rev, tree: trees[p.id], principal: principal)))
            } catch {
                answers[p.index] = DocumentFailure(id: p.id.rawValue, rev: nil, error: error).json
            }
        }
        let work = prepared
        let outcomes: [Result<RevisionID, StoreError>] = try await store.writeSuspending { txn in
            work.map { item in
                Result { () throws(StoreError) -> RevisionID in try self.apply(item.edit, in: txn) }
            }
        }
        for (item, outcome) in zip(prepared, outcomes) {
            switch outcome {
            case .success(let rev):
                answers[item.index] = ["ok": true, "id": .string(item.edit.id.rawValue), "rev": .string(rev.description)]
            case .failure(let e):
                answers[item.index] = DocumentFailure(id: item.edit.id.rawValue, rev: nil, error: couchError(e)).json
            }
        }
        return answers.map { $0 ?? .null }
    }

    /// Existing revisions (`new_edits:false`): as CouchDB 3, only failures are listed.
    func bulkReplicated(_ docs: [JSON], principal: CouchPrincipal) async throws -> [JSON] {
        var failures: [JSON] = []
        var inputs: [CouchDocumentInput] = []
        for doc in docs {
            do throws(CouchError) { inputs.append(try CouchDocumentInput(parsing: doc)) } catch {
                failures.append(
                    DocumentFailure(id: doc["_id"]?.stringValue ?? "", rev: doc["_rev"]?.stringValue, error: error).json)
            }
        }
        let ids = inputs.compactMap { $0.id.flatMap { try? couchDocumentID($0, replicated: true) } }
        let trees = try store.revisionTrees(ids)
        var batch: [IncomingRevision] = []
        var refused: [DocumentFailure] = []
        for input in inputs {
            do { batch.append(try prepareReplicated(input: input, pathID: nil, trees: trees, principal: principal)) } catch {
                refused.append(error)
                failures.append(error.json)
            }
        }
        let outcomes = try await store.insertRevisionsSuspending(batch)
        var stored: [IncomingRevision] = []
        for (incoming, outcome) in zip(batch, outcomes) {
            switch outcome {
            case .inserted: stored.append(incoming)
            case .alreadyPresent: break
            case .rejected(let e):
                let failure = DocumentFailure(
                    id: incoming.id.rawValue, rev: incoming.revision.description, error: couchError(e),
                    stage: e.isValidationRefusal ? "validation" : "structure")
                refused.append(failure)
                failures.append(failure.json)
            }
        }
        reportReplicated(stored: stored, refused: refused, principal: principal)
        return failures
    }

    /// `POST /{db}/_bulk_get` with `docs: [{id, rev?, atts_since?}]` and the query's `revs`,
    /// `attachments`, `latest`.
    func bulkGet(_ request: Request, context: CouchRequestContext) async throws -> Response {
        let principal = try context.requirePrincipal()
        guard request.method == .post else { throw CouchError.methodNotAllowed("POST") }
        try requireJSONContent(request)
        let q = request.uri.queryParameters
        var options = CouchRenderOptions()
        options.revs = try queryBool(q, "revs") ?? false
        options.attachments = try queryBool(q, "attachments") ?? false
        let latest = try queryBool(q, "latest") ?? false
        let json = try await readJSON(request)
        guard case .array(let docs)? = json["docs"] else {
            throw CouchError.badRequest("Missing JSON list of 'docs'.")
        }
        let ids = docs.compactMap { $0["id"]?.stringValue.flatMap { try? couchDocumentID($0, replicated: true) } }
        let trees = try store.revisionTrees(ids)
        // As CouchDB: multipart when the client accepts it, one part per document revision.
        let multipart = accepts(request, "multipart/mixed") || accepts(request, "multipart/related")
        var results: [JSON] = []
        var parts: [(headers: [(String, String)], body: [UInt8])] = []
        for doc in docs {
            let rawID = doc["id"]?.stringValue ?? ""
            let revText = doc["rev"]?.stringValue
            func failure(_ e: CouchError, rev: String?) -> JSON {
                var f: [String: JSON] = ["id": .string(rawID), "error": .string(e.error), "reason": .string(e.reason)]
                f["rev"] = .string(rev ?? "undefined")
                return ["error": .object(f)]
            }
            var items: [JSON] = []
            do {
                guard doc.objectValue != nil, !rawID.isEmpty else { throw CouchError.badRequest("Document id must be a string.") }
                let id = try couchDocumentID(rawID, replicated: true)
                guard let tree = trees[id], let winner = tree.winner else { throw CouchError.notFound("missing") }
                try checkReadable(id, tree: tree, principal: principal)
                var docOptions = options
                if case .array(let since)? = doc["atts_since"] {
                    for s in since { docOptions.attsSince.append(try parseRevision(s.stringValue ?? "")) }
                }
                var revs = [winner.id]
                if let revText {
                    let rev = try parseRevision(revText)
                    guard tree.contains(rev) else { throw CouchError.notFound("missing") }
                    revs = latest ? leaves(descendingFrom: rev, in: tree) : [rev]
                }
                let access = DocumentAccess(principal.policy)
                for rev in revs {
                    if access.mayRead(id, revision: rev, in: tree), let view = try view(of: id, revision: rev, in: tree) {
                        let rendered = try render(view, options: docOptions, multipart: multipart)
                        items.append(["ok": rendered.json])
                        if multipart && !rendered.follows.isEmpty {
                            let inner = Multipart.newBoundary()
                            parts.append(
                                ([("Content-Type", "multipart/related; boundary=\"\(inner)\"")],
                                 Multipart.write(try relatedParts(rendered.json, rendered.follows), boundary: inner)))
                        } else if multipart {
                            parts.append(([("Content-Type", "application/json")], rendered.json.canonicalBytes))
                        }
                    } else {
                        items.append(failure(.notFound("missing"), rev: rev.description))
                        if multipart { parts.append(errorPart(items.last!)) }
                    }
                }
            } catch let e as CouchError {
                items.append(failure(e, rev: revText))
                if multipart { parts.append(errorPart(items.last!)) }
            }
            results.append(["id": .string(rawID), "docs": .array(items)])
        }
        if multipart {
            let boundary = Multipart.newBoundary()
            let type = accepts(request, "multipart/mixed") ? "multipart/mixed" : "multipart/related"
            var headers = Self.rawContentHeaders
            headers[.contentType] = "\(type); boundary=\"\(boundary)\""
            return Response(
                status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: Multipart.write(parts, boundary: boundary))))
        }
        return CouchResponse.json(["results": .array(results)])
    }

    /// A multipart part for a `{"error": {…}}` item: its inner object, marked as an error.
    private func errorPart(_ item: JSON) -> (headers: [(String, String)], body: [UInt8]) {
        ([("Content-Type", "application/json; error=\"true\"")], (item["error"] ?? item).canonicalBytes)
    }

    /// 415 unless the request body is `application/json`.
    func requireJSONContent(_ request: Request) throws {
        guard Multipart.mediaType(request.headers[.contentType]) == "application/json" else {
            throw CouchError.unsupportedMediaType("Content-Type must be application/json")
        }
    }
}
