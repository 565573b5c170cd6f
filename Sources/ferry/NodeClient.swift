import FerryCore
import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Talks to the admin API of the `ferry serve` running on a data directory, found through
/// its DATA/node.json, so CLI writes go through the node and replicate at once.
struct NodeClient {
    let adminURL: String
    let nodeFile: [String: JSON]

    /// The running node on `dataDirectory`, or nil when none runs there (no node.json, or
    /// its pid is gone: a node killed with SIGKILL leaves a stale file behind).
    static func running(on dataDirectory: String) -> NodeClient? {
        guard let data = FileManager.default.contents(atPath: "\(dataDirectory)/node.json"),
            let info = try? JSON.parse(Array(data)).objectValue,
            let url = info["adminURL"]?.stringValue, let pid = info["pid"]?.intValue,
            kill(pid_t(pid), 0) == 0 || errno == EPERM
        else { return nil }
        return NodeClient(adminURL: url, nodeFile: info)
    }

    /// The node on `dataDirectory`, or a clear error telling how to start one.
    static func required(on dataDirectory: String) throws -> NodeClient {
        guard let client = running(on: dataDirectory) else {
            throw CLIError(message: "no ferry serve is running on \(dataDirectory) (start one with `ferry serve --data \(dataDirectory)`)")
        }
        return client
    }

    struct Reply {
        let status: Int
        let body: JSON
    }

    /// One request; the body is JSON when given. Transport failures become CLI errors.
    func request(_ method: String, _ path: String, body: JSON? = nil) async throws -> Reply {
        guard let url = URL(string: adminURL + path) else { throw CLIError(message: "bad admin URL \(adminURL)\(path)") }
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.timeoutInterval = 60
        if let body {
            request.httpBody = Data(body.canonicalBytes)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response): (Data, URLResponse)
        do { (data, response) = try await URLSession.shared.data(for: request) } catch {
            throw CLIError(message: "the node's admin API at \(adminURL) did not answer: \(error.localizedDescription)")
        }
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        let json = (try? JSON.parse(Array(data))) ?? .string(String(decoding: data, as: UTF8.self))
        return Reply(status: status, body: json)
    }

    /// Like `request`, but a non-2xx reply becomes a CLI error with the API's reason and the
    /// matching exit status (3 not found, 4 conflict, 1 otherwise).
    func call(_ method: String, _ path: String, body: JSON? = nil) async throws -> JSON {
        let reply = try await request(method, path, body: body)
        guard (200..<300).contains(reply.status) else {
            let reason = reply.body["reason"]?.stringValue ?? "\(reply.body)"
            let status: Int32 = reply.status == 404 ? 3 : reply.status == 409 ? 4 : 1
            throw CLIError(message: reason, status: status)
        }
        return reply.body
    }

    /// Percent-encodes a document ID for a path, keeping its `/` separators.
    static func path(_ id: String) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "?#%;")
        return id.addingPercentEncoding(withAllowedCharacters: allowed) ?? id
    }
}
