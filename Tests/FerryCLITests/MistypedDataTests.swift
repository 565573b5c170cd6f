import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// A mistyped `--data` writes nothing: writing commands refuse a data directory that does
/// not exist, name the one the user probably meant, and `--create` makes a new one.
@Suite struct MistypedDataTests {
    @Test func aWriteIntoAMissingDataDirectoryIsRefusedNamingTheOneMeant() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let root = NSTemporaryDirectory() + "ferry-typo-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let real = root + "/ferry-data"
        #expect(try await cli.run(["--data", real, "--create", "put", "order-1", #"{"n":1}"#], useDataFlag: false).status == 0)

        // Run from the parent, as a user types a relative --data.
        let typo = try await Shell.bash(#"cd '\#(root)' && env -u FERRY_DATA '\#(FerryCLI.binary)' --data ferry-dta put order-9 '{"n":9}'"#)
        #expect(typo.status == 1)
        #expect(typo.stderr.hasPrefix("ferry: no data directory ferry-dta; did you mean ferry-data?"), "\(typo.stderr)")
        #expect(typo.stderr.contains("--create"))
        #expect(!FileManager.default.fileExists(atPath: root + "/ferry-dta"))

        for command in [["rm", "order-1", "--rev", "1-" + String(repeating: "a", count: 64)], ["import", "-"], ["trust", "add", String(repeating: "ab", count: 32)], ["compact"]] {
            let r = try await cli.run(["--data", root + "/elsewhere"] + command, stdin: "", useDataFlag: false)
            #expect(r.status == 1, "\(command): \(r.stderr)")
            #expect(r.stderr.contains("no data directory"), "\(command): \(r.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: root + "/elsewhere"))

        // --create starts one; an existing empty directory needs nothing.
        #expect(try await cli.run(["--data", root + "/new", "--create", "put", "a", "{}"], useDataFlag: false).status == 0)
        try FileManager.default.createDirectory(atPath: root + "/empty", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        #expect(try await cli.run(["--data", root + "/empty", "put", "a", "{}"], useDataFlag: false).status == 0)
        let read = try await cli.run(["--data", real, "get", "order-1"], useDataFlag: false)
        #expect(read.status == 0 && read.stdout.contains("\"n\""))
    }

    @Test func aWriteIntoADirectoryThatHoldsOtherFilesIsRefusedUnlessCreateSaysSo() async throws {
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let root = NSTemporaryDirectory() + "ferry-foreign-\(UUID().uuidString)"
        let documents = root + "/Documents"
        try FileManager.default.createDirectory(atPath: documents, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        try "my notes".write(toFile: documents + "/notes.txt", atomically: true, encoding: .utf8)
        let refused = try await cli.run(["--data", documents, "put", "order-1", "{}"], useDataFlag: false)
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("is not a Ferry data directory") && refused.stderr.contains("--create"), "\(refused.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: documents) == ["notes.txt"], "nothing was written there")
        let file = try await cli.run(["--data", documents + "/notes.txt", "put", "order-1", "{}"], useDataFlag: false)
        #expect(file.status == 1 && file.stderr.contains("is a file"), "\(file.stderr)")
        // --create says so; an empty directory (made for a node) needs nothing.
        #expect(try await cli.run(["--data", documents, "--create", "put", "order-1", "{}"], useDataFlag: false).status == 0)
        #expect(try await cli.run(["--data", documents, "put", "order-2", "{}"], useDataFlag: false).status == 0, "now it is Ferry's")
        let empty = root + "/empty"
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        #expect(try await cli.run(["--data", empty, "put", "order-1", "{}"], useDataFlag: false).status == 0)
    }
}
