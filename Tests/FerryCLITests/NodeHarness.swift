import FerryCore
import Foundation
import IntegrationHarness
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

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

