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
        let python = CouchSuite.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
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
        var environment = ProcessInfo.processInfo.environment
        environment["FERRY_BIN"] = Ferry.binary
        environment["FERRY_DATA"] = a.dataDirectory
        environment["FERRY_ROOT"] = scratch
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let result = try await Shell.run(
            ["-m", "pytest", CouchSuite.root + "/Integration/attacks/test_backup.py", "-q", "-s", "-p", "no:cacheprovider", "-rfE"],
            executable: python, environment: environment, timeout: 480)
        print(result.stdout.suffix(3000))
        if result.status != 0 {
            Issue.record("pytest test_backup.py exited \(result.status):\n\(result.stdout.suffix(6000))\n\(result.stderr.suffix(2000))")
        }
        // The node went on serving through every backup.
        #expect(try await a.admin.call("GET", "/docs/with-blob").status == 200)
        await finish(cluster, allowing: expectedRefusals)
    }
}
