import FerryCore
import Foundation
import Testing

/// `ferry sync` piped (not a terminal): no progress line, and a plain summary at the end
/// that counts blob bytes.
@Suite(.timeLimit(.minutes(5))) struct SyncProgressCLITests {
    @Test func aPipedSyncEndsWithASummaryThatCountsBlobBytes() async throws {
        let source = FerryCLI()
        let receiver = FerryCLI()
        defer {
            source.cleanUp()
            receiver.cleanUp()
        }
        // 1 MiB + 1 byte: several chunks, and not a multiple of the chunk size.
        let length = (1 << 20) + 1
        let file = source.dataDirectory + ".bin"
        defer { try? FileManager.default.removeItem(atPath: file) }
        var bytes = [UInt8](repeating: 0, count: length)
        for i in bytes.indices { bytes[i] = UInt8(truncatingIfNeeded: i &* 2_654_435_761 >> 13) }
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try await source.run(["blob", "put", file])
        #expect(put.status == 0, "\(put.stderr)")
        let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try await source.run(["put", "with-blob", #"{"file":\#(ref)}"#]).status == 0)
        #expect(try await receiver.run(["id"]).status == 0)

        let pulled = try await receiver.run(["sync", source.dataDirectory, "--pull"])
        #expect(pulled.status == 0, "\(pulled.stderr)")
        let lines = pulled.stdout.split(separator: "\n")
        #expect(lines.count == 1, "one summary line: \(pulled.stdout)")
        #expect(pulled.stdout.contains("pulled 1,"), "\(pulled.stdout)")
        #expect(pulled.stdout.contains("blobs 0 sent / 1 received, blob bytes 0 sent / \(length) received"), "\(pulled.stdout)")
        // Piped, stderr carries no progress line (no carriage returns, no escape codes).
        #expect(!pulled.stderr.contains("\r") && !pulled.stderr.contains("\u{1B}["), "\(pulled.stderr)")

        let json = try await receiver.run(["sync", source.dataDirectory, "--pull", "--reset-checkpoint", "--json"]).json()
        #expect(json["blobBytesReceived"] == 0, "the blob is already here: \(json)")
        #expect(json["ok"] == true)
    }
}
