import FerryCore
import FerryCouchDocuments
import FerryPinning
import FerryStore
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// HTTP/1.1 exchanges over TLS connections that are refused unless the server's certificate
/// has the pinned SHA-256: how a pinned endpoint is reached, with request and answer bodies
/// streamed so that memory holds a few chunks whatever their length.
///
/// AsyncHTTPClient can only trust a pinned certificate as a trust root, which BoringSSL
/// refuses for a certificate that may not sign certificates (a Ferry node's, and many
/// self-made ones). These connections check the pin in the handshake's verification callback
/// instead, with `.noHostnameVerification` (under `.none` the callback's verdict is ignored).
/// One connection per exchange (`Connection: close`): simple, at the cost of a handshake each.
enum PinnedHTTPS {
    /// What a request sends after its head.
    enum Body: Sendable {
        case none
        case bytes([UInt8])
        /// Read a chunk at a time as the connection takes them.
        case stream(StreamedBody.Chunks, length: Int64)

        var length: Int64 {
            switch self {
            case .none: return 0
            case .bytes(let b): return Int64(b.count)
            case .stream(_, let length): return length
            }
        }
    }

    typealias Connection = NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>

    /// One exchange whose answer is read whole (up to `maxBytes`), ended by `timeout` if it
    /// takes longer.
    static func exchange(
        endpoint: CouchEndpoint, pin: String, method: HTTPMethod, uri: String, headers: HTTPHeaders, body: [UInt8]?,
        timeout: TimeAmount, maxBytes: Int
    ) async throws(CouchClientError) -> CouchHTTP.Response {
        let collected = Locked<[UInt8]>([])
        let nanoseconds = timeout.nanoseconds
        do {
            let head = try await Race.first(
                {
                    try await perform(
                        endpoint: endpoint, pin: pin, method: method, uri: uri, headers: headers,
                        body: body.map { .bytes($0) } ?? .none
                    ) { chunk in
                        try collected.withLock { all in
                            guard all.count + chunk.readableBytes <= maxBytes else { throw TooLarge() }
                            all += chunk.readableBytesView
                        }
                    }
                },
                {
                    try await Task.sleep(nanoseconds: UInt64(max(0, nanoseconds)))
                    throw PinnedTimeout()
                })
            return CouchHTTP.Response(status: Int(head.status.code), headers: head.headers, body: collected.withLock { $0 })
        } catch is PinnedTimeout {
            throw CouchClientError(.timeout, message: "\(method) \(uri): no answer from \(endpoint.serverURL) in time", isTransient: true)
        } catch is TooLarge {
            throw CouchClientError(
                .badResponse, message: "\(method) \(uri): the answer from \(endpoint.serverURL) is larger than \(maxBytes >> 20) MiB",
                isTransient: false)
        } catch let e as CouchClientError {
            throw e
        } catch {
            throw CouchClientError(.connectFailed, message: "\(method) \(uri) at \(endpoint.serverURL) failed: \(error)", isTransient: true)
        }
    }

    /// Sends one request and streams its answer: `head` sees the answer's head first, then
    /// `sink` each body chunk as it arrives (the connection reads no further until `sink`
    /// returns). Returns the answer's head once its body has ended. Task cancellation ends the
    /// exchange at once, closing the connection.
    static func perform(
        endpoint: CouchEndpoint, pin: String, method: HTTPMethod, uri: String, headers: HTTPHeaders, body: Body,
        head: @escaping @Sendable (HTTPResponseHead) throws -> Void = { _ in },
        sink: @escaping @Sendable (ByteBuffer) throws -> Void
    ) async throws -> HTTPResponseHead {
        let seen = Locked<String?>(nil)
        let connection: Connection
        do {
            connection = try await connect(endpoint: endpoint, pin: pin, seen: seen)
        } catch {
            throw CouchClientError(.connectFailed, message: "connecting to \(endpoint.serverURL) failed: \(error)", isTransient: true)
        }
        var requestHead = HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: headers)
        requestHead.headers.replaceOrAdd(name: "Host", value: endpoint.port == 443 ? endpoint.host : "\(endpoint.host):\(endpoint.port)")
        requestHead.headers.replaceOrAdd(name: "Connection", value: "close")
        requestHead.headers.replaceOrAdd(name: "Content-Length", value: "\(body.length)")
        let sendHead = requestHead
        do {
            return try await connection.executeThenClose { inbound, outbound in
                try await withThrowingTaskGroup(of: HTTPResponseHead?.self) { group in
                    // The body is written beside the read, so that a server answering before
                    // it has read the whole body (a refusal) is heard, and the write stopped.
                    group.addTask {
                        try await outbound.write(.head(sendHead))
                        switch body {
                        case .none: break
                        case .bytes(let bytes): try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: bytes))))
                        case .stream(let chunks, _):
                            for try await chunk in chunks { try await outbound.write(.body(.byteBuffer(chunk))) }
                        }
                        try await outbound.write(.end(nil))
                        return nil
                    }
                    group.addTask {
                        var answer: HTTPResponseHead?
                        for try await part in inbound {
                            switch part {
                            case .head(let h):
                                // 1xx heads (100 Continue) precede the real one.
                                guard h.status.code >= 200 else { continue }
                                answer = h
                                try head(h)
                            case .body(let chunk):
                                try sink(chunk)
                            case .end:
                                if let answer { return answer }
                            }
                        }
                        try Task.checkCancellation()
                        throw ChannelError.eof
                    }
                    defer { group.cancelAll() }
                    while let next = try await group.next() {
                        if let answer = next { return answer }
                    }
                    throw CancellationError()
                }
            }
        } catch let e as CouchClientError {
            throw e
        } catch let e as StoreError {
            throw e
        } catch {
            if Task.isCancelled { throw CancellationError() }
            if let print = seen.withLock({ $0 }), print != pin {
                throw CouchClientError(
                    .pinMismatch,
                    message: "\(endpoint.serverURL) presented the certificate with SHA-256 \(print), not the pinned \(pin)",
                    isTransient: false)
            }
            if error is NIOSSLError, seen.withLock({ $0 }) == nil {
                throw CouchClientError(.tlsFailed, message: "TLS with \(endpoint.serverURL) failed: \(error)", isTransient: false)
            }
            throw error
        }
    }

    /// A TLS connection to the endpoint's server that completes its handshake only if the
    /// server's certificate has the SHA-256 `pin` (recorded in `seen`, for the error), with
    /// HTTP/1.1 client handlers, as an async channel.
    static func connect(endpoint: CouchEndpoint, pin: String, seen: Locked<String?>) async throws -> Connection {
        let context = try PinnedTLS.clientContext(roots: .none)
        let sni = PinnedTLS.serverName(endpoint.host)
        return try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(10))
            .connect(host: endpoint.host, port: endpoint.port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let ssl = try NIOSSLClientHandler(
                        context: context, serverHostname: sni,
                        customVerificationCallback: PinnedTLS.verifier { print, _ in
                            seen.withLock { $0 = print }
                            return print == pin
                        })
                    try channel.pipeline.syncOperations.addHandler(ssl)
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    return try Connection(wrappingChannelSynchronously: channel)
                }
            }
    }

    struct PinnedTimeout: Error {}
    struct TooLarge: Error {}
}
