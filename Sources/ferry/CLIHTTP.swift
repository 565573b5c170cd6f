import AsyncHTTPClient
import FerryCore
import Foundation
import NIOCore
import NIOHTTP1

/// The CLI's one HTTP client, for the node's own loopback APIs (admin and CouchDB): one
/// request with the admin key as a bearer token and a JSON body, its status and parsed body
/// back, over AsyncHTTPClient as the CouchDB replication client uses.
enum CLIHTTP {
    /// One client for the process (a CLI run makes a request or a few, then exits). It does
    /// not retry a refused connection: the APIs are on loopback, so a refusal means the node
    /// is not answering, and the shared client's retries would hold the command until the
    /// request's deadline (60 s) before saying so.
    static let client: HTTPClient = {
        var configuration = HTTPClient.Configuration()
        configuration.connectionPool.retryConnectionEstablishment = false
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }()

    struct Reply {
        let status: Int
        /// The body as JSON, or as a string when it is not JSON.
        let body: JSON
    }

    /// Largest reply read: the admin API and `_find` page their answers well under this.
    static let maximumReplyBytes = 256 * 1024 * 1024

    /// Sends one request; a transport failure throws `CLIError` starting with `what`.
    static func send(
        _ method: String, _ url: String, bearer: String, body: JSON?, timeout: TimeAmount, what: String
    ) async throws -> Reply {
        var request = HTTPClientRequest(url: url)
        request.method = HTTPMethod(rawValue: method)
        request.headers.add(name: "Authorization", value: "Bearer \(bearer)")
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body.canonicalBytes))
        }
        let status: Int
        let bytes: ByteBuffer
        do {
            let response = try await client.execute(request, timeout: timeout)
            status = Int(response.status.code)
            bytes = try await response.body.collect(upTo: maximumReplyBytes)
        } catch {
            throw CLIError(message: "\(what) did not answer: \(describe(error))")
        }
        let data = Array(bytes.readableBytesView)
        return Reply(status: status, body: (try? JSON.parse(data)) ?? .string(String(decoding: data, as: UTF8.self)))
    }

    /// A transport error in words: the system's for a failed call ("Connection refused"),
    /// not NIO's description of its error value.
    static func describe(_ error: any Error) -> String {
        if let e = error as? HTTPClientError, e == .deadlineExceeded || e == .readTimeout { return "no reply in time" }
        if let e = error as? HTTPClientError, e == .connectTimeout { return "the connection timed out" }
        if let e = error as? IOError { return String(cString: strerror(e.errnoCode)) }
        return "\(error)"
    }
}
