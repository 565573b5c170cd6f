import FerryCore
import Foundation

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A node's admin API, as the harness and every test drive it. On this machine it is plain
/// HTTP on 127.0.0.1; a LAN-lab node's API is on the lab host's own loopback, so calls run
/// `curl` inside that host. Every call carries the node's admin key; bodies are sent as JSON.
public struct AdminClient: Sendable {
    public let base: String
    public let host: LabHost?
    /// The node's admin key (DATA/admin.key), or nil to call without one.
    public let key: String?

    public init(base: String, host: LabHost?, key: String?) {
        self.base = base
        self.host = host
        self.key = key
    }

    /// The node a `node.json` describes, authenticated with the key file it names.
    public init(nodeFile: JSON) {
        base = nodeFile["adminURL"]?.stringValue ?? "http://127.0.0.1:0"
        host = nil
        key = nodeFile["adminKeyFile"]?.stringValue
            .flatMap { try? String(contentsOfFile: $0, encoding: .utf8) }?.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    public struct Reply: Sendable {
        public let status: Int
        public let text: String
        public var json: JSON { (try? JSON.parse(text)) ?? .null }
    }

    /// One request; `headers` are added after (and so may replace) the key and content type.
    @discardableResult
    public func call(_ method: String, _ path: String, body: String? = nil, headers: [String: String] = [:]) async throws -> Reply {
        if let host {
            // The key travels on stdin (`-H @-`), never on a command line others can read.
            var args = host.nsenterArguments + ["curl", "-s", "-m", "60", "-X", method, "-w", "\\n%{http_code}", "-H", "@-"]
            if let body { args += ["-H", "Content-Type: application/json", "--data-binary", body] }
            args.append(base + path)
            let lines = (key.map { "Authorization: Bearer \($0)\n" } ?? "") + headers.map { "\($0.key): \($0.value)\n" }.joined()
            let r = try await Shell.run(args, executable: "/usr/bin/nsenter", stdin: lines, timeout: 90)
            guard let cut = r.stdout.lastIndex(of: "\n"), let status = Int(r.stdout[r.stdout.index(after: cut)...]) else {
                throw HarnessError("admin call on \(host.name) failed: \(r.stderr)")
            }
            return Reply(status: status, text: String(r.stdout[..<cut]))
        }
        var request = URLRequest(url: URL(string: base + path)!)
        request.httpMethod = method
        request.timeoutInterval = 60
        if let key { request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization") }
        if let body {
            request.httpBody = Data(body.utf8)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        let (data, response) = try await URLSession.shared.data(for: request)
        return Reply(status: (response as? HTTPURLResponse)?.statusCode ?? 0, text: String(decoding: data, as: UTF8.self))
    }

    public func get(_ path: String) async throws -> JSON {
        let r = try await call("GET", path)
        guard r.status == 200 else { throw HarnessError("GET \(path) → \(r.status): \(r.text)") }
        return r.json
    }

    /// PUT a document; returns its new revision.
    @discardableResult
    public func put(_ id: String, _ body: String, rev: String? = nil) async throws -> String {
        let r = try await call("PUT", "/docs/\(id)\(rev.map { "?rev=\($0)" } ?? "")", body: body)
        guard r.status == 201, let rev = r.json["rev"]?.stringValue else { throw HarnessError("PUT \(id) → \(r.status): \(r.text)") }
        return rev
    }

    public var digest: String { get async throws { try await get("/")["digest"]?.stringValue ?? "" } }

    /// Every document's current revision (tombstones included), by ID, paging through /docs.
    public func revisions() async throws -> [String: String] {
        var out: [String: String] = [:]
        var after: String?
        while true {
            let page = try await get("/docs?limit=10000&deleted=true" + (after.map { "&after=\($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0)" } ?? ""))
            if case .array(let rows)? = page["rows"] {
                for r in rows { if let id = r["id"]?.stringValue, let rev = r["rev"]?.stringValue { out[id] = rev } }
            }
            guard let next = page["next"]?.stringValue else { return out }
            after = next
        }
    }

    /// A Prometheus counter or gauge summed over its label sets (0 when absent).
    public func metric(_ name: String, labelsContaining: [String] = []) async throws -> Double {
        Self.metricTotal(in: try await call("GET", "/metrics").text, name, labelsContaining: labelsContaining)
    }

    /// The sum of a Prometheus metric over its label sets (those whose labels contain every
    /// one of `labelsContaining`) in a `/metrics` text.
    public static func metricTotal(in text: String, _ name: String, labelsContaining: [String] = []) -> Double {
        var total = 0.0
        for line in text.split(separator: "\n") where line.hasPrefix(name) && !line.hasPrefix("#") {
            let head = line.prefix { $0 != " " }
            guard head == name || head.hasPrefix(name + "{") else { continue }
            guard labelsContaining.allSatisfy({ head.contains($0) }) else { continue }
            total += Double(line.split(separator: " ").last ?? "0") ?? 0
        }
        return total
    }
}
