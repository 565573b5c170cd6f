import FerryCore
import Foundation
import IntegrationHarness

/// Runs the built `ferry` binary against a temporary data directory.
struct FerryCLI {
    let dataDirectory: String

    /// A fresh, empty data directory (writing commands refuse one that does not exist).
    init() {
        dataDirectory = NSTemporaryDirectory() + "ferry-cli-" + UUID().uuidString
        try? FileManager.default.createDirectory(
            atPath: dataDirectory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    func cleanUp() { try? FileManager.default.removeItem(atPath: dataDirectory) }

    /// The `ferry` executable beside this test bundle (SwiftPM builds it first), or $FERRY_BINARY.
    static let binary = Ferry.binary

    struct Result {
        let status: Int32
        let stdout: String
        let stderr: String

        func json() throws -> JSON { try JSON.parse(stdout.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// Runs `ferry ARGS --data DIR` to completion (killed after `timeout` seconds), with
    /// `stdin` as its input; never blocks a thread of the cooperative pool.
    @discardableResult
    func run(
        _ arguments: [String], stdin: String? = nil, environment: [String: String] = [:], useDataFlag: Bool = true,
        timeout: Double = 120
    ) async throws -> Result {
        var env = ProcessInfo.processInfo.environment.filter { $0.key != "FERRY_DATA" }
        for (k, v) in environment { env[k] = v }
        let r = try await Shell.run(
            useDataFlag ? arguments + ["--data", dataDirectory] : arguments, executable: Self.binary, stdin: stdin ?? "",
            environment: env, timeout: timeout)
        return Result(status: r.status, stdout: r.stdout, stderr: r.stderr)
    }
}
