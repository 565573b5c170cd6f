import FerryCore
import Foundation
import IntegrationHarness
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A running node's admin API, as the tests drive it: authenticated with the key file
/// node.json names, bodies sent as JSON.
struct Admin {
    let base: String
    let key: String?

    init(_ nodeFile: JSON) {
        base = nodeFile["adminURL"]?.stringValue ?? "http://127.0.0.1:0"
        key = nodeFile["adminKeyFile"]?.stringValue
            .flatMap { try? String(contentsOfFile: $0, encoding: .utf8) }?.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    struct Reply {
        let status: Int
        let text: String
        var json: JSON { (try? JSON.parse(text)) ?? .null }
    }

    @discardableResult
    func call(_ method: String, _ path: String, body: String? = nil, headers: [String: String] = [:]) async throws -> Reply {
        var request = URLRequest(url: URL(string: base + path)!)
        request.httpMethod = method
        request.timeoutInterval = 30
        if let key { request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization") }
        if let body {
            request.httpBody = Data(body.utf8)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        let (data, response) = try await URLSession.shared.data(for: request)
        return Reply(status: (response as? HTTPURLResponse)?.statusCode ?? 0, text: String(decoding: data, as: UTF8.self))
    }

    func get(_ path: String) async throws -> JSON { try await call("GET", path).json }

    var digest: String { get async throws { try await get("/")["digest"]?.stringValue ?? "" } }
}

/// Polls an async condition until it holds or the deadline passes (waiting on state, never a fixed sleep).
func waitUntil(
    _ what: String, timeout: Double = 30, sourceLocation: SourceLocation = #_sourceLocation, _ condition: () async throws -> Bool
) async throws {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(50))
    }
    Issue.record("timed out after \(timeout) s waiting for: \(what)", sourceLocation: sourceLocation)
    throw CLIFailure("timed out waiting for: \(what)")
}

/// The repository's scripts directory.
let scriptsDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../scripts").standardized.path

/// Runs a command and returns its exit status and output (stdout and stderr together).
@discardableResult
func shell(_ command: String, timeout: Double = 60) async -> (status: Int32, output: String) {
    do {
        let r = try await Shell.bash(command, timeout: timeout)
        return (r.status, r.stdout + r.stderr)
    } catch {
        return (-1, "\(error)")
    }
}

