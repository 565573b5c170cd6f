import FerryCore
import Foundation
import Testing

/// The group commands' own checks, before any node is asked.
@Suite struct GroupCLITests {
    @Test func groupCommandsNeedARunningNodeAndSayHowToStartOne() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        for args in [["invite"], ["join", "ferry1-AAAA"], ["group"], ["group", "remove", "b"]] {
            let r = try await cli.run(args)
            #expect(r.status == 1 && r.stderr.contains("no ferry serve is running"), "\(args): \(r.stderr)")
        }
    }

    @Test func aBadExpiryIsAUsageError() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        for bad in ["0s", "ten", "5x", "-1m"] {
            let r = try await cli.run(["invite", "--expires", bad])
            #expect(r.status == 64 && r.stderr.contains("--expires"), "\(bad): \(r.stderr)")
        }
    }
}
