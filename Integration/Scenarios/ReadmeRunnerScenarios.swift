import Foundation
import IntegrationHarness
import Testing

/// The README runner (scripts/readme-test.py, `make test`'s README phase) run from a checkout
/// under /tmp: as root it gives the documents a private /tmp, which must not hide the
/// checkout (its .venv-couch is the python3 the documents use) or the binary.
@Suite(.serialized, .timeLimit(.minutes(5)), .enabled(if: mustRunEverything && getuid() == 0, "needs root for the runner's private /tmp"))
struct ReadmeRunnerScenarios {
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../scripts/readme-test.py").standardized.path

    @Test func aCheckoutUnderTmpStaysVisibleToTheDocumentsItRuns() async throws {
        let checkout = "/tmp/ferry-readme-checkout-\(UUID().uuidString.prefix(8))"
        let fm = FileManager.default
        defer { try? fm.removeItem(atPath: checkout) }
        try fm.createDirectory(atPath: checkout + "/scripts", withIntermediateDirectories: true)
        try fm.copyItem(atPath: Self.script, toPath: checkout + "/scripts/readme-test.py")
        try "in the checkout\n".write(toFile: checkout + "/marker.txt", atomically: true, encoding: .utf8)
        // A document that reads a file of the checkout, and runs the binary, from inside the runner.
        let document = """
            # A check

            ```
            cat \(checkout)/marker.txt
            .build/debug/ferry --version
            ```

            """
        try document.write(toFile: checkout + "/check.md", atomically: true, encoding: .utf8)
        let r = try await Shell.run(
            [checkout + "/scripts/readme-test.py", "-v", checkout + "/check.md"], executable: "/usr/bin/python3",
            environment: ProcessInfo.processInfo.environment.merging(["FERRY_BIN": Ferry.binary]) { $1 }, timeout: 120)
        #expect(r.status == 0, "\(r.stdout)\n\(r.stderr)")
        #expect(r.stdout.contains("in the checkout"), "\(r.stdout)")
    }
}
