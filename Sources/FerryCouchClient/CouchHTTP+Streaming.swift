import AsyncHTTPClient
import FerryCore
import FerryCouchDocuments
import FerryStore
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// The requests of one client that are in flight, so that a stop cancels them all at once,
/// whichever task awaits them (the pull side fetches in tasks of its own, which a stop does
/// not reach otherwise).
final class InFlightRequests: Sendable {
    private struct State {
        var aborted = false
        var next = 0
        var cancels: [Int: @Sendable () -> Void] = [:]
    }
    private let state = Locked(State())

    var isAborted: Bool { state.withLock { $0.aborted } }
    /// Requests in flight now.
    var count: Int { state.withLock { $0.cancels.count } }

    /// Cancels what is in flight; every later request fails at once.
    func abort() {
        let cancels = state.withLock { s -> [@Sendable () -> Void] in
            s.aborted = true
            defer { s.cancels = [:] }
            return Array(s.cancels.values)
        }
        for cancel in cancels { cancel() }
    }

    /// Runs `work` so that `abort()` and the caller's cancellation both cancel it; either
    /// ends it with the permanent `stopped` error.
    func run<T: Sendable>(what: String, _ work: @escaping @Sendable () async throws(CouchClientError) -> T) async throws(CouchClientError) -> T {
        let task = Task { () async throws(CouchClientError) -> T in try await work() }
        let id = state.withLock { s -> Int? in
            guard !s.aborted else { return nil }
            s.next += 1
            s.cancels[s.next] = { task.cancel() }
            return s.next
        }
        guard let id else {
            task.cancel()
            throw .stopped(what)
        }
        defer { _ = state.withLock { $0.cancels.removeValue(forKey: id) } }
        let result = await withTaskCancellationHandler { await task.result } onCancel: { task.cancel() }
        switch result {
        case .success(let value): return value
        case .failure(let error):
            if task.isCancelled { throw .stopped(what) }
            throw (error as? CouchClientError) ?? CouchClientError(.internalFailure, message: "\(what): \(error)", isTransient: true)
        }
    }
}

/// Counts the bytes a streamed transfer moved, for its stall watchdog.
final class TransferProgress: Sendable {
    private let moved = Atomic<Int64>(0)
    func add(_ n: Int) { moved.add(Int64(n), ordering: .relaxed) }
    var bytes: Int64 { moved.load(ordering: .relaxed) }
}

extension CouchClientError {
    /// A request cut off by a stop; never retried.
    static func stopped(_ what: String) -> CouchClientError {
        CouchClientError(.stopped, message: "\(what): stopped", isTransient: false)
    }

    /// A transfer that moved no byte for `after`: the link or the server is gone.
    static func stalled(_ what: String, after: Duration, endpoint: CouchEndpoint) -> CouchClientError {
        CouchClientError(
            .stalled, message: "\(what): \(endpoint.serverURL) moved no byte for \(after.components.seconds) s; transfer abandoned",
            isTransient: true)
    }
}

extension CouchHTTP {
    /// The head of a streamed answer; a body that is not 2xx is read whole (it is an error
    /// document) and kept in `response.body`.
    struct StreamedHead: Sendable {
        var response: Response
    }

    /// Runs `work` while a watchdog checks that `progress` moves: no byte for
    /// `stallTimeout` throws `stalled`. A transfer that keeps moving runs as long as it takes.
    func watched<T: Sendable>(
        _ what: String, progress: TransferProgress, _ work: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let stall = stallTimeout
        let clock = self.clock
        let endpoint = self.endpoint
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await work() }
            group.addTask {
                // Checked four times per stall period: a stall is seen within 1¼ periods.
                let tick = stall / 4
                var last = progress.bytes
                var quiet = Duration.zero
                while true {
                    try await clock.sleep(for: tick)
                    let now = progress.bytes
                    if now != last {
                        last = now
                        quiet = .zero
                        continue
                    }
                    quiet += tick
                    if quiet >= stall { throw CouchClientError.stalled(what, after: stall, endpoint: endpoint) }
                }
            }
            defer { group.cancelAll() }
            while let next = try await group.next() {
                if let value = next { return value }
            }
            throw CancellationError()
        }
    }

    /// `GET` of content streamed to `sink` chunk by chunk as it arrives (never held whole),
    /// with `headers` (a `Range`, say) and identity encoding. Returns the answer's status and
    /// headers; `sink` sees only the body of a 2xx answer.
    func download(
        _ path: String, query: [(String, String)] = [], headers: [(String, String)] = [],
        head: @escaping @Sendable (_ status: Int, _ headers: HTTPHeaders) throws -> Void = { _, _ in },
        sink: @escaping @Sendable (ByteBuffer) throws -> Void
    ) async throws(CouchClientError) -> Response {
        let what = "GET \(path)"
        var made = makeRequest(.GET, path, query: query, headers: headers)
        made.headers.remove(name: "Accept-Encoding")
        let request = made
        let client = self.client
        let logger = self.logger
        let progress = TransferProgress()
        let pin = try pinned()
        defer { count(sent: Self.headBytes(request), received: Int(progress.bytes)) }
        return try await inFlight.run(what: what) { () async throws(CouchClientError) -> Response in
            do {
                return try await self.watched(what, progress: progress) {
                    if let pin {
                        // A non-2xx body is an error document: kept (bounded), not sunk.
                        let failed = Locked<(status: Int, body: [UInt8])?>(nil)
                        let answer = try await PinnedHTTPS.perform(
                            endpoint: self.endpoint, pin: pin, method: .GET, uri: self.pinnedURI(request.url), headers: request.headers,
                            body: .none,
                            head: { h in
                                let status = Int(h.status.code)
                                if (200..<300).contains(status) { try head(status, h.headers) } else { failed.withLock { $0 = (status, []) } }
                            },
                            sink: { chunk in
                                progress.add(chunk.readableBytes)
                                let kept = failed.withLock { f -> Bool in
                                    guard f != nil else { return false }
                                    if f!.body.count < 1 << 20 { f!.body += chunk.readableBytesView }
                                    return true
                                }
                                if !kept { try sink(chunk) }
                            })
                        return Response(status: Int(answer.status.code), headers: answer.headers, body: failed.withLock { $0?.body } ?? [])
                    }
                    let response = try await client.execute(request, deadline: .distantFuture, logger: logger)
                    let status = Int(response.status.code)
                    guard (200..<300).contains(status) else {
                        var buffer = try await response.body.collect(upTo: 1 << 20)
                        return Response(status: status, headers: response.headers, body: buffer.readBytes(length: buffer.readableBytes) ?? [])
                    }
                    try head(status, response.headers)
                    for try await chunk in response.body {
                        progress.add(chunk.readableBytes)
                        try sink(chunk)
                    }
                    return Response(status: status, headers: response.headers, body: [])
                }
            } catch {
                throw self.mapped(error, what: what)
            }
        }
    }

    /// A request whose body streams from `body` (`length` bytes), never held whole; the
    /// answer (JSON) is read whole. Liveness counts the bytes sent.
    func upload(
        _ method: HTTPMethod, _ path: String, query: [(String, String)] = [], headers: [(String, String)],
        body: StreamedBody
    ) async throws(CouchClientError) -> Response {
        let what = "\(method) \(path)"
        var made = makeRequest(method, path, query: query, headers: headers)
        let progress = TransferProgress()
        made.body = .stream(body.counting(progress), length: .known(body.length))
        let request = made
        let client = self.client
        let logger = self.logger
        let pin = try pinned()
        // What moved counts: the body's bytes as the connection took them, and the answer's.
        defer { count(sent: Self.headBytes(request) + Int(progress.bytes), received: 0) }
        return try await inFlight.run(what: what) { () async throws(CouchClientError) -> Response in
            do {
                return try await self.watched(what, progress: progress) {
                    if let pin {
                        var headers = request.headers
                        headers.remove(name: "Accept-Encoding")
                        let answer = Locked<[UInt8]>([])
                        let h = try await PinnedHTTPS.perform(
                            endpoint: self.endpoint, pin: pin, method: method, uri: self.pinnedURI(request.url), headers: headers,
                            body: .stream(body.counting(progress), length: body.length),
                            sink: { chunk in
                                progress.add(chunk.readableBytes + 1)
                                try answer.withLock { all in
                                    guard all.count + chunk.readableBytes <= Self.maxResponseBytes else { throw PinnedHTTPS.TooLarge() }
                                    all += chunk.readableBytesView
                                }
                            })
                        return Response(status: Int(h.status.code), headers: h.headers, body: answer.withLock { $0 })
                    }
                    let response = try await client.execute(request, deadline: .distantFuture, logger: logger)
                    // The answer is small JSON; it counts as progress too.
                    var buffer = try await response.body.collect(upTo: Self.maxResponseBytes)
                    progress.add(buffer.readableBytes + 1)
                    return Response(status: Int(response.status.code), headers: response.headers, body: buffer.readBytes(length: buffer.readableBytes) ?? [])
                }
            } catch {
                throw self.mapped(error, what: what)
            }
        }
    }

    private static func sinkFailure(_ what: String, _ error: any Error) -> CouchClientError {
        CouchClientError(.localWriteFailed, message: "\(what): storing the content here failed: \(error)", isTransient: false)
    }

    private func mapped(_ error: any Error, what: String) -> CouchClientError {
        switch error {
        case let e as CouchClientError: return e
        case let e as StoreError: return Self.sinkFailure(what, e)
        default:
            return CouchClientError(.connectFailed, message: "\(what) at \(endpoint.serverURL) failed: \(error)", isTransient: true)
        }
    }
}

/// A request body made of byte runs and ranges of stored blobs, produced a chunk at a time
/// as the connection takes them: memory holds one chunk, whatever the body's length.
struct StreamedBody: Sendable {
    enum Piece: Sendable {
        case bytes([UInt8])
        /// `count` bytes of a blob from `offset`.
        case blob(BlobReader, offset: Int64, count: Int64)
    }
    var pieces: [Piece]

    /// Bytes read from a blob at a time: big enough that per-chunk costs vanish, small
    /// enough that a slow link holds little in flight.
    static let chunkBytes = 256 << 10

    var length: Int64 {
        pieces.reduce(0) { n, p in
            switch p {
            case .bytes(let b): return n + Int64(b.count)
            case .blob(_, _, let count): return n + count
            }
        }
    }

    /// The body as the sequence AsyncHTTPClient reads, adding each chunk to `progress`.
    func counting(_ progress: TransferProgress) -> Chunks { Chunks(pieces: pieces, progress: progress) }

    struct Chunks: AsyncSequence, Sendable {
        typealias Element = ByteBuffer
        let pieces: [Piece]
        let progress: TransferProgress

        func makeAsyncIterator() -> Iterator { Iterator(pieces: pieces, progress: progress) }

        struct Iterator: AsyncIteratorProtocol {
            var pieces: [Piece]
            var index = 0
            var done: Int64 = 0
            let progress: TransferProgress

            init(pieces: [Piece], progress: TransferProgress) {
                self.pieces = pieces
                self.progress = progress
            }

            mutating func next() async throws -> ByteBuffer? {
                while index < pieces.count {
                    switch pieces[index] {
                    case .bytes(let b):
                        index += 1
                        guard !b.isEmpty else { continue }
                        progress.add(b.count)
                        return ByteBuffer(bytes: b)
                    case .blob(let reader, let offset, let count):
                        guard done < count else {
                            index += 1
                            done = 0
                            continue
                        }
                        try Task.checkCancellation()
                        let want = Int(Swift.min(Int64(StreamedBody.chunkBytes), count - done))
                        let chunk = try reader.read(offset: offset + done, count: want)
                        guard chunk.count == want else { throw StoreError.io("blob \(reader.digest) ended early") }
                        done += Int64(want)
                        progress.add(want)
                        return ByteBuffer(bytes: chunk)
                    }
                }
                return nil
            }
        }
    }
}
