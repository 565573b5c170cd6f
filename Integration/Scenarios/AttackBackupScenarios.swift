import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Attacks on `ferry backup` and `ferry restore` with the real binary and a running node
/// (Integration/attacks/test_backup.py): a backup holding a link out of itself, a link loop,
/// a FIFO or a stray file is refused by name and nothing is restored; a link planted in the
/// node's data directory is never followed by a backup.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AttackBackupScenarios {
    @Test func backupsWithLinksFIFOsOrStrayFilesAreRefusedAndLinksInTheDataDirectoryAreNotFollowed() async throws {
        let cluster = Cluster("attack-backup")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        try await a.start(["--no-discovery"])
        for i in 0..<20 { try await a.admin.put("doc-\(i)", #"{"i":\#(i)}"#) }
        let blobFile = cluster.root + "/scan.bin"
        try Data((0..<100_000).map { UInt8(($0 * 7) % 251) }).write(to: URL(fileURLWithPath: blobFile))
        let blob = try await Ferry.run(["--data", a.dataDirectory, "blob", "put", blobFile, "--json"])
        #expect(blob.status == 0, "\(blob.stderr)")
        try await a.admin.put("with-blob", #"{"scan":\#(blob.stdout.trimmingCharacters(in: .whitespacesAndNewlines))}"#)

        let scratch = cluster.root + "/attack"
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        try await CouchSuite.pytest(
            CouchSuite.root + "/Integration/attacks/test_backup.py",
            environment: ["FERRY_BIN": Ferry.binary, "FERRY_DATA": a.dataDirectory, "FERRY_ROOT": scratch], timeout: 480)
        // The node went on serving through every backup.
        #expect(try await a.admin.call("GET", "/docs/with-blob").status == 200)
        await finish(cluster, allowing: expectedRefusals)
    }
}
