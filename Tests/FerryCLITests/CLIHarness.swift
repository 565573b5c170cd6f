import FerryCore
import Foundation
import IntegrationHarness

/// Runs the built `ferry` binary against a temporary data directory.
struct FerryCLI {
    let dataDirectory: String

    init() {
        dataDirectory = NSTemporaryDirectory() + "ferry-cli-" + UUID().uuidString
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

    @discardableResult
    func run(_ arguments: [String], stdin: String? = nil, environment: [String: String] = [:], useDataFlag: Bool = true)
        throws -> Result
    {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments = useDataFlag ? arguments + ["--data", dataDirectory] : arguments
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "FERRY_DATA")
        for (k, v) in environment { env[k] = v }
        process.environment = env
        let out = Pipe()
        let err = Pipe()
        let input = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = input
        try process.run()
        if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
        try input.fileHandleForWriting.close()
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(
            status: process.terminationStatus, stdout: String(decoding: outData, as: UTF8.self),
            stderr: String(decoding: errData, as: UTF8.self))
    }
}
