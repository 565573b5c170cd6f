import FerryCore
import FerryStore
import FerrySync
import Hummingbird
import HummingbirdCore
import NIOCore

/// The admin API's blob routes: content (fetched first if deferred) and where a blob stands.
extension AdminAPI {
    var blobFetcher: DeferredBlobFetcher {
        let manager = self.manager
        return DeferredBlobFetcher(store: node.store, replicators: { manager.activeReplicators }, logger: node.logger)
    }

    func addBlobRoutes(to router: Router<BasicRequestContext>) {
        router.get("/blobs/:digest") { _, ctx in try await blobContent(try blobDigest(ctx)) }
        router.get("/blobs/:digest/state") { _, ctx in blobState(try blobDigest(ctx)) }
        router.post("/blobs/:digest/fetch") { _, ctx in try await fetchBlob(try blobDigest(ctx)) }
        router.post("/blobs") { request, _ in try await uploadBlob(request) }
    }

    /// The largest blob `POST /blobs` takes (held in memory; `ferry blob put` streams any size).
    static let maxUploadBytes = 64 << 20

    /// `POST /blobs` with the content as the body (any `Content-Type`, kept as the blob's):
    /// 201 with the reference a document embeds, `{"@type":"blob","digest","length"}`.
    func uploadBlob(_ request: Request) async throws -> Response {
        let buffer: ByteBuffer
        do { buffer = try await request.body.collect(upTo: Self.maxUploadBytes) } catch {
            throw APIError(.contentTooLarge, "too_large", "an upload here is at most \(Self.maxUploadBytes >> 20) MiB; use `ferry blob put FILE` for larger ones")
        }
        let type = request.headers[.contentType].flatMap { $0 == "application/octet-stream" ? nil : $0 }
        let ref = try node.store.blobs.put(Array(buffer.readableBytesView), contentType: type)
        node.logger.info("blob uploaded", metadata: ["digest": "\(ref.digest)", "length": "\(ref.length)"])
        return json(ref.json, status: .created)
    }

    func blobDigest(_ ctx: BasicRequestContext) throws -> BlobDigest {
        let text = try ctx.parameters.require("digest")
        do { return try BlobDigest(text) } catch { throw APIError(.badRequest, error.code, error.description) }
    }

    /// Fetches a deferred blob now (no-op when present); answers its state.
    func fetchBlob(_ digest: BlobDigest) async throws -> Response {
        do {
            guard try await blobFetcher.ensure(digest) else { throw APIError(.notFound, "not_found", "no blob \(digest)") }
        } catch let unavailable as BlobUnavailable {
            return unavailableResponse(unavailable)
        }
        return blobState(digest)
    }

    /// 503 with the reason and a Retry-After: a peer that has the blob may connect later.
    func unavailableResponse(_ unavailable: BlobUnavailable) -> Response {
        var response = json(
            ["error": .string(unavailable.code), "reason": .string(unavailable.description)], status: .serviceUnavailable)
        response.headers[.retryAfter] = "30"
        return response
    }

    /// The content, streamed from the file; a deferred blob is fetched from a peer first.
    func blobContent(_ digest: BlobDigest) async throws -> Response {
        do {
            guard try await blobFetcher.ensure(digest) else { throw APIError(.notFound, "not_found", "no blob \(digest)") }
        } catch let unavailable as BlobUnavailable {
            return unavailableResponse(unavailable)
        }
        guard let reader = try node.store.blobs.reader(digest) else { throw APIError(.notFound, "not_found", "no blob \(digest)") }
        let body = ResponseBody(contentLength: Int(reader.length)) { writer in
            var offset: Int64 = 0
            while offset < reader.length {
                let chunk = try reader.read(offset: offset, count: SyncProtocol.blobChunkSize)
                guard !chunk.isEmpty else { throw StoreError.blobCorrupt(digest) }
                try await writer.write(ByteBuffer(bytes: chunk))
                offset += Int64(chunk.count)
            }
            try await writer.finish(nil)
        }
        // Content someone uploaded (HTML, SVG) must never run with a dashboard session: a
        // browser downloads it, and if it rendered it anyway, it would be sandboxed and unsniffed.
        return Response(
            status: .ok,
            headers: [
                .contentType: "application/octet-stream", .contentSecurityPolicy: "sandbox", .xContentTypeOptions: "nosniff",
                .contentDisposition: "attachment; filename=\"\(digest.description)\"",
            ], body: body)
    }

    /// `{"digest", "state": "present"|"deferred"|"absent", "length"?, "received"?}`.
    func blobState(_ digest: BlobDigest) -> Response {
        var o: [String: JSON] = ["digest": .string(digest.description)]
        switch node.store.blobs.state(digest) {
        case .present(let length):
            o["state"] = "present"
            o["length"] = .int(length)
            o["received"] = .int(length)
        case .deferred(let length, let partial):
            o["state"] = "deferred"
            o["length"] = .int(length)
            o["received"] = .int(partial)
        case .absent:
            o["state"] = "absent"
        }
        return json(.object(o))
    }
}
