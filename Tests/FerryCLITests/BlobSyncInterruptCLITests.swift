import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// `ferry sync` stopped by SIGTERM in the middle of a large blob: it ends at once with its
/// partial file kept, and the next sync fetches only the rest.
@Suite(.timeLimit(.minutes(5))) struct BlobSyncInterruptCLITests {
    @Test func aSyncInterruptedMidBlobEndsAtOnceAndTheNextOneFetchesOnlyTheRest() async throws {
        let source = FerryCLI()
        let receiver = FerryCLI()
        defer {
            source.cleanUp()
            receiver.cleanUp()
        }
        let length = 120_000_000
        let file = source.dataDirectory + ".bin"
        defer { try? FileManager.default.removeItem(atPath: file) }
        let made = try await Shell.bash("head -c \(length) /dev/urandom > '\(file)'")
        #expect(made.status == 0)
        let put = try await source.run(["blob", "put", file])
        #expect(put.status == 0, "\(put.stderr)")
        let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try await source.run(["put", "scan", #"{"file":\#(ref)}"#]).status == 0)
        let digest = try JSON.parse(ref)["digest"]?.stringValue ?? ""
        let hex = String(digest.dropFirst("sha256-".count))

        let out = receiver.dataDirectory + ".out"
        defer { try? FileManager.default.removeItem(atPath: out) }
        let sync = try ChildProcess.spawn(
            FerryCLI.binary, ["--data", receiver.dataDirectory, "sync", source.dataDirectory, "--pull"], stdoutPath: out, stderrPath: out)
        // Once a quarter of the blob is in the partial file, SIGTERM.
        let partial = receiver.dataDirectory + "/blobs/partial/\(hex)"
        try await waitUntil("a quarter of the blob arrived", timeout: 120, every: .milliseconds(10)) {
            let size = (try? FileManager.default.attributesOfItem(atPath: partial)[.size] as? NSNumber)?.intValue ?? 0
            return size > length / 4 || !sync.isRunning
        }
        let signalled = ContinuousClock.now
        sync.signal(SIGTERM)
        let status = await sync.wait(timeout: 30)
        let took = ContinuousClock.now - signalled
        #expect(status == 143, "\((try? String(contentsOfFile: out, encoding: .utf8)) ?? "")")
        // Reported, not asserted on (timings are noisy): the issue's bound is 2 s.
        print("sync ended \(took) after SIGTERM, mid-blob")
        let resumed = try await receiver.run(["sync", source.dataDirectory, "--pull", "--json"])
        #expect(resumed.status == 0, "\(resumed.stderr)")
        let summary = try resumed.json()
        let again = summary["blobBytesReceived"]?.intValue ?? -1
        #expect(again > 0 && again < Int64(length) * 4 / 5, "resumed, not started over: \(summary)")
        let copy = receiver.dataDirectory + ".copy"
        defer { try? FileManager.default.removeItem(atPath: copy) }
        #expect(try await receiver.run(["blob", "get", digest, "-o", copy]).status == 0)
        #expect(FileManager.default.contentsEqual(atPath: copy, andPath: file))
    }
}
