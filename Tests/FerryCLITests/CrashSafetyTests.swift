import FerryCore
import FerryStore
import Foundation
import Testing

/// Kills a writing `ferry` process with SIGKILL mid-batch and checks what survives.
@Suite struct CrashSafetyTests {
    @Test(arguments: [3, 11, 27])
    func everyAcknowledgedWriteSurvivesSIGKILL(killAfterAcks: Int) throws {
        let dir = NSTemporaryDirectory() + "ferry-crash-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let input = dir + "/docs.ndjson"
        var text = ""
        text.reserveCapacity(60 * 200_000)
        for i in 0..<200_000 { text += "{\"_id\":\"doc-\(i)\",\"n\":\(i),\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxx\"}\n" }
        FileManager.default.createFile(atPath: input, contents: Data(text.utf8))

        let process = Process()
        process.executableURL = URL(fileURLWithPath: FerryCLI.binary)
        process.arguments = ["import", input, "--batch-size", "100", "--data", dir + "/db"]
        let err = Pipe()
        process.standardError = err
        process.standardOutput = FileHandle.nullDevice
        try process.run()

        // Read "committed N" acknowledgements until we have enough, then kill at once.
        var acknowledged = 0
        var acks = 0
        var pending = ""
        let reader = err.fileHandleForReading
        while acks < killAfterAcks {
            let chunk = reader.availableData
            if chunk.isEmpty { break }
            pending += String(decoding: chunk, as: UTF8.self)
            while let nl = pending.firstIndex(of: "\n") {
                let line = pending[..<nl]
                pending = String(pending[pending.index(after: nl)...])
                if line.hasPrefix("committed "), let n = Int(line.dropFirst(10)) {
                    acknowledged = n
                    acks += 1
                }
            }
        }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        #expect(process.terminationReason == .uncaughtSignal, "the import finished before it was killed")
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
