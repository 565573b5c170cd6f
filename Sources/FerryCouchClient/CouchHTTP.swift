import AsyncHTTPClient
import FerryCore
import FerryCouchDocuments
import FerrySync
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL

/// One CouchDB server's HTTP/1.1 client: a keep-alive connection pool, Basic credentials
/// on every request, gzip-encoded answers decoded, and each failure mapped to a
/// `CouchClientError` that says whether a retry may help.
public final class CouchHTTP: Sendable {
    public let endpoint: CouchEndpoint
    let client: HTTPClient
    let logger: Logger
    /// Longest wait for one answer that is not a live feed.
    let requestTimeout: TimeAmount
    /// How long a streamed transfer (an attachment) may move no byte before it is declared
    /// stalled; a slow transfer that keeps moving is never cut off.
    let stallTimeout: Duration
    let clock: any Clock<Duration>
    /// Requests in flight, cancelled all at once by `abort()`.
    let inFlight = InFlightRequests()
    /// Bytes sent and received in requests and answers (bodies, plus the request line and
    /// headers as written; answer heads are not counted), for a replication's summary.
    public let traffic = Locked(Connection.Counters())

    /// Counts one exchange's traffic.
    func count(sent: Int, received: Int) {
        traffic.withLock {
            $0.bytesSent += sent
            $0.bytesReceived += received
            $0.messagesSent += 1
            $0.messagesReceived += 1
        }
    }

    /// The bytes of a request's line and headers as sent.
    static func headBytes(_ request: HTTPClientRequest) -> Int {
        request.headers.reduce(request.method.rawValue.utf8.count + request.url.utf8.count + 12) { $0 + $1.name.utf8.count + $1.value.utf8.count + 4 }
    }

    /// One answer, whatever its status.
    public struct Response: Sendable {
        public var status: Int
        public var headers: HTTPHeaders
        public var body: [UInt8]
        /// The body as JSON (nil when it is not).
        public var json: JSON? { try? JSON.parse(body) }
    }

    /// A client for `endpoint`'s server. `tls` is the TLS configuration the endpoint's trust
    /// calls for (`CouchTLS.configuration(for:)`); nil for plain http.
    public init(
        endpoint: CouchEndpoint, tls: TLSConfiguration?, requestTimeout: TimeAmount = .seconds(60), stallTimeout: Duration = .seconds(30),
        clock: any Clock<Duration> = ContinuousClock(), logger: Logger
    ) {
        self.endpoint = endpoint
        self.logger = logger
        self.requestTimeout = requestTimeout
        self.stallTimeout = stallTimeout
        self.clock = clock
        var configuration = HTTPClient.Configuration()
        configuration.tlsConfiguration = tls
        configuration.decompression = .enabled(limit: .none)
        configuration.timeout.connect = .seconds(10)
        configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 8)
        // The replicator retries with its own backoff and shows the server offline meanwhile.
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.redirectConfiguration = .disallow
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    /// Closes the pool's connections.
    public func shutdown() async {
        abort()
        try? await client.shutdown()
    }

    /// Cancels every request in flight and refuses new ones (a permanent `stopped` error):
    /// what a stop does, so that no transfer outlives it, however slow or stalled.
    public func abort() {
        inFlight.abort()
    }

    /// The path of `suffix` inside the database (`suffix` already escaped, e.g. `_changes`
    /// or an escaped document ID); empty: the database itself.
    public func databasePath(_ suffix: String = "") -> String {
        "/" + CouchEndpoint.escapeDatabase(endpoint.database) + (suffix.isEmpty ? "" : "/" + suffix)
    }

    /// Sends one request. `path` is escaped and starts with `/`; `query` values are escaped
    /// here. Network failures become transient errors; the status is left to the caller.
    public func send(
        _ method: HTTPMethod, _ path: String, query: [(String, String)] = [], headers: [(String, String)] = [],
        body: [UInt8]? = nil, timeout: TimeAmount? = nil
    ) async throws(CouchClientError) -> Response {
        try await inFlight.run(what: "\(method) \(path)") { () async throws(CouchClientError) -> Response in
            try await self.exchange(method, path, query: query, headers: headers, body: body, timeout: timeout)
        }
    }

    private func exchange(
        _ method: HTTPMethod, _ path: String, query: [(String, String)], headers: [(String, String)],
        body: [UInt8]?, timeout: TimeAmount?
    ) async throws(CouchClientError) -> Response {
        var request = makeRequest(method, path, query: query, headers: headers)
        let url = request.url
        let head = Self.headBytes(request)
        let response = try await answer(&request, url: url, method, path, body: body, headers: headers, timeout: timeout)
        count(sent: head + (body?.count ?? 0), received: response.body.count)
        return response
    }

    /// Sends `request` (its body still to be set from `body`) and reads the whole answer.
    private func answer(
        _ request: inout HTTPClientRequest, url: String, _ method: HTTPMethod, _ path: String, body: [UInt8]?,
        headers: [(String, String)], timeout: TimeAmount?
    ) async throws(CouchClientError) -> Response {
        if let body {
            if !headers.contains(where: { $0.0.lowercased() == "content-type" }) {
                request.headers.add(name: "Content-Type", value: "application/json")
            }
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        if let pin = try pinned() {
            var pinnedHeaders = request.headers
            // No gzip here: that exchange does not decode it.
            pinnedHeaders.remove(name: "Accept-Encoding")
            return try await PinnedHTTPS.exchange(
                endpoint: endpoint, pin: pin, method: method, uri: pinnedURI(url), headers: pinnedHeaders, body: body,
                timeout: timeout ?? requestTimeout, maxBytes: Self.maxResponseBytes)
        }
        do {
            let response = try await client.execute(request, timeout: timeout ?? requestTimeout, logger: logger)
            var buffer = try await response.body.collect(upTo: Self.maxResponseBytes)
            let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
            return Response(status: Int(response.status.code), headers: response.headers, body: bytes)
        } catch let e as HTTPClientError where e == .deadlineExceeded {
            throw CouchClientError(.timeout, message: "\(method) \(path): no answer from \(endpoint.serverURL) in time", isTransient: true)
        } catch let e as NIOSSLError {
            throw CouchClientError(.tlsFailed, message: "TLS with \(endpoint.serverURL) failed: \(e)", isTransient: false)
        } catch let e as NIOSSLExtraError {
            throw CouchClientError(.tlsFailed, message: "TLS with \(endpoint.serverURL) failed: \(e)", isTransient: false)
        } catch {
            throw CouchClientError(
                .connectFailed, message: "\(method) \(path) at \(endpoint.serverURL) failed: \(error)", isTransient: true)
        }
    }

    /// The normalized pin when requests go through `PinnedHTTPS` (an https endpoint with a
    /// pinned certificate), nil when they go through AsyncHTTPClient.
    func pinned() throws(CouchClientError) -> String? {
        guard endpoint.scheme == "https", case .pinned(let pin) = endpoint.trust else { return nil }
        return try CouchEndpoint.normalizedPin(pin)
    }

    /// The request target of a full URL made by `makeRequest`: its path and query.
    func pinnedURI(_ url: String) -> String { String(url.dropFirst(endpoint.serverURL.count)) }

    /// A request to `path` (escaped) with `query` (escaped here), the credentials, JSON and
    /// gzip accepted, and `headers` over those.
    func makeRequest(_ method: HTTPMethod, _ path: String, query: [(String, String)], headers: [(String, String)]) -> HTTPClientRequest {
        var url = endpoint.serverURL + path
        if !query.isEmpty {
            url += "?" + query.map { "\(Self.escapeQuery($0.0))=\(Self.escapeQuery($0.1))" }.joined(separator: "&")
        }
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers.add(name: "Accept", value: "application/json")
        request.headers.add(name: "Accept-Encoding", value: "gzip")
        if let c = endpoint.credentials {
            request.headers.add(name: "Authorization", value: "Basic " + Data("\(c.user):\(c.password)".utf8).base64EncodedString())
        }
        for (name, value) in headers { request.headers.replaceOrAdd(name: name, value: value) }
        return request
    }

    /// Sends a request with a JSON body (or none) and returns the JSON answer of a 2xx
    /// status; any other status throws `CouchClientError.http(_:)`.
    public func json(
        _ method: HTTPMethod, _ path: String, query: [(String, String)] = [], body: JSON? = nil, timeout: TimeAmount? = nil
    ) async throws(CouchClientError) -> JSON {
        let response = try await send(method, path, query: query, body: body.map { $0.canonicalBytes }, timeout: timeout)
        guard (200..<300).contains(response.status) else { throw .http(response, method: method, path: path, endpoint: endpoint) }
        guard let value = response.json else {
            throw CouchClientError(
                .badResponse, message: "\(method) \(path): the answer is not JSON", isTransient: true, status: response.status)
        }
        return value
    }

    /// Largest answer read into memory (a `_bulk_get` page with attachments).
    static let maxResponseBytes = 512 << 20

    static func escapeQuery(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-_.~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? s
    }
}

extension CouchClientError {
    /// The error for a non-2xx answer: 401/403/404/400/412 are permanent and say what to
    /// fix; 408, 429 and 5xx are transient.
    public static func http(_ response: CouchHTTP.Response, method: HTTPMethod, path: String, endpoint: CouchEndpoint) -> CouchClientError {
        let error = response.json?["error"]?.stringValue ?? "http_\(response.status)"
        let reason = response.json?["reason"]?.stringValue ?? ""
        let what = "\(method) \(endpoint.serverURL)\(path) answered \(response.status) \(error)\(reason.isEmpty ? "" : ": \(reason)")"
        switch response.status {
        case 401:
            return CouchClientError(.unauthorized, message: "\(what) (check the user and password)", isTransient: false, status: 401)
        case 403:
            return CouchClientError(.forbidden, message: "\(what) (the user may not do this)", isTransient: false, status: 403)
        case 404:
            return CouchClientError(.notFound, message: what, isTransient: false, status: 404)
        case 408, 429, 500...599:
            return CouchClientError(.serverBusy, message: what, isTransient: true, status: response.status)
        default:
            return CouchClientError(.server(error), message: what, isTransient: false, status: response.status)
        }
    }
}
