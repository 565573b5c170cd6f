import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Testing

/// Kills a writing `ferry` process with SIGKILL mid-batch and checks what survives.
@Suite(.timeLimit(.minutes(10))) struct CrashSafetyTests {
    @Test(arguments: [3, 11, 27])
    func everyAcknowledgedWriteSurvivesSIGKILL(killAfterAcks: Int) async throws {
        let dir = NSTemporaryDirectory() + "ferry-crash-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let input = dir + "/docs.ndjson"
        var text = ""
        text.reserveCapacity(60 * 200_000)
        for i in 0..<200_000 { text += "{\"_id\":\"doc-\(i)\",\"n\":\(i),\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxx\"}\n" }
        FileManager.default.createFile(atPath: input, contents: Data(text.utf8))

        let errPath = dir + "/stderr"
        let process = try ChildProcess.spawn(
            FerryCLI.binary, ["import", input, "--batch-size", "100", "--data", dir + "/db", "--create"], stderrPath: errPath)

        // Read "committed N" acknowledgements until we have enough, then kill at once.
        var acknowledged = 0
        _ = await eventually(120, every: .milliseconds(1)) {
            let text = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
            let acks = text.split(separator: "\n").compactMap { line in line.hasPrefix("committed ") ? Int(line.dropFirst(10)) : nil }
            if acks.count >= killAfterAcks { acknowledged = acks[killAfterAcks - 1] }
            return acks.count >= killAfterAcks || !process.isRunning
        }
        let status = await process.stop(SIGKILL).status
        #expect(status == 128 + SIGKILL, "the import finished before it was killed")
        #expect(acknowledged >= killAfterAcks * 100)

        let store = try DocumentStore.open(directory: dir + "/db")
        #expect(try store.integrityCheck() == ["ok"])
        let count = try store.documentCount
        #expect(count >= acknowledged)
        #expect(count % 100 == 0, "batches commit whole or not at all")
        for i in stride(from: 0, to: acknowledged, by: 97) {
            let doc = try store.document(try DocumentID("doc-\(i)"))
            #expect(doc?.body["n"] == .int(Int64(i)))
        }
        #expect(try store.document(try DocumentID("doc-\(acknowledged - 1)")) != nil)
        // The store still takes writes after recovery.
        _ = try store.put(try DocumentID("after-crash"), body: ["ok": true])
    }
}
