import Foundation
import IntegrationHarness
import Testing

/// Every committed fuzz corpus (Fuzz/corpus/TARGET: the seeds, and each input a fuzzer once
/// crashed on) replays through its decoder without a crash, so a fixed bug stays fixed.
struct FuzzCorpusTests {
    static let fuzzer = (Ferry.binary as NSString).deletingLastPathComponent + "/ferry-fuzz"
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Fuzz/corpus").path

    @Test func everyTargetHasACorpusAndReplaysItWithoutACrash() async throws {
        let listed = try await Shell.run(["targets"], executable: Self.fuzzer)
        #expect(listed.status == 0)
        let targets = listed.stdout.split(separator: "\n").map(String.init)
        #expect(targets.count >= 12)
        for target in targets {
            let dir = "\(Self.corpus)/\(target)"
            let files = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
            #expect(!files.isEmpty, "no corpus for \(target) in \(dir)")
            let r = try await Shell.run(["replay", target, dir], executable: Self.fuzzer)
            #expect(r.status == 0, "\(target): \(r.stderr)")
            #expect(r.stdout.contains("\(files.count) inputs, no crash"), "\(target): \(r.stdout)")
        }
    }

    @Test func anUnknownTargetOrAMissingFileIsAClearError() async throws {
        let unknown = try await Shell.run(["replay", "nonesuch", "/dev/null"], executable: Self.fuzzer)
        #expect(unknown.status == 2)
        #expect(unknown.stderr.contains("targets: frames"))
        let missing = try await Shell.run(["replay", "json", "/nonexistent/input"], executable: Self.fuzzer)
        #expect(missing.status == 2)
        #expect(missing.stderr.contains("no such file: /nonexistent/input"))
    }
}
