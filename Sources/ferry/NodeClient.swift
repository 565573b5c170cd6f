import FerryCore
import Foundation

/// Talks to the admin API of the `ferry serve` running on a data directory, found through
/// its DATA/node.json and authenticated with its DATA/admin.key, so CLI writes go through
/// the node and replicate at once.
///
/// The tests and the harness share IntegrationHarness's `AdminClient`; the shipped binary
/// must not depend on test support (nor on its curl-in-a-namespace path), so it keeps this
/// client, which also owns the CLI's lock probe and maps replies to exit statuses.
struct NodeClient {
    let adminURL: String
    let nodeFile: [String: JSON]
    let dataDirectory: String

    /// The running node on `dataDirectory`, or nil when none runs there. A node runs exactly
    /// while it holds the flock on DATA/serve.lock; node.json counts only when it names
    /// that holder's pid (a node killed with SIGKILL leaves a stale file behind, and its pid
    /// may since belong to another process).
    static func running(on dataDirectory: String) -> NodeClient? {
        guard let holder = lockHolder(dataDirectory),
            let data = FileManager.default.contents(atPath: "\(dataDirectory)/node.json"),
            let info = try? JSON.parse(Array(data)).objectValue,
            let url = info["adminURL"]?.stringValue, let pid = info["pid"]?.intValue, pid == holder
        else { return nil }
        return NodeClient(adminURL: url, nodeFile: info, dataDirectory: dataDirectory)
    }

    /// The pid a running node wrote into DATA/serve.lock, or nil when the lock is free.
    /// The probe takes a shared lock for an instant and releases it at once.
    static func lockHolder(_ dataDirectory: String) -> Int64? {
        let path = "\(dataDirectory)/serve.lock"
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        if flock(fd, LOCK_SH | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return nil
        }
        guard errno == EWOULDBLOCK else { return nil }
        var buf = [UInt8](repeating: 0, count: 32)
        let n = pread(fd, &buf, 32, 0)
        // Held, but the pid not yet written: report a pid no node.json names.
        guard n > 0 else { return -1 }
        return Int64(String(decoding: buf[..<n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
    }

    /// The running node on `dataDirectory`; nil only when none holds its lock. A node that
    /// holds the lock but has not written node.json yet (starting) is waited for, up to
    /// `timeout` seconds: it has read the trust store and users files already, so a change
    /// written to them now would be lost until its restart.
    static func settled(on dataDirectory: String, timeout: Double = 30) async throws -> NodeClient? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if let client = running(on: dataDirectory) { return client }
            if lockHolder(dataDirectory) == nil { return nil }
            guard Date() < deadline else {
                throw CLIError(message: "the ferry serve on \(dataDirectory) is still starting after \(Int(timeout)) s (no node.json yet); try again")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// The node on `dataDirectory`, or a clear error telling how to start one.
    static func required(on dataDirectory: String) throws -> NodeClient {
        guard let client = running(on: dataDirectory) else {
            if lockHolder(dataDirectory) != nil {
                throw CLIError(message: "the ferry serve on \(dataDirectory) is still starting (no node.json yet); try again")
            }
            throw CLIError(message: "no ferry serve is running on \(dataDirectory) (start one with `ferry serve --data \(dataDirectory)`)")
        }
        return client
    }

    /// The node's admin key (DATA/admin.key; this CLI runs as the node's user).
    func adminKey() throws -> String {
        let path = "\(dataDirectory)/admin.key"
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw CLIError(message: "cannot read the admin key \(path); run the CLI as the node's user")
        }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    struct Reply {
        let status: Int
        let body: JSON
    }

    /// One request; the body is JSON when given. Transport failures become CLI errors.
    func request(_ method: String, _ path: String, body: JSON? = nil) async throws -> Reply {
        let reply = try await CLIHTTP.send(
            method, adminURL + path, bearer: try adminKey(), body: body, timeout: .seconds(60), what: "the node's admin API at \(adminURL)")
        return Reply(status: reply.status, body: reply.body)
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
