import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Large blobs over a slow link (LAN lab, `tc tbf` at 20 Mbit/s on both hosts): a 50 MiB
/// blob replicates natively between two `ferry serve` processes, and when the link is cut
/// half-way, or the receiver is killed half-way and restarted, the transfer resumes from
/// the partial file: the link carries at most 1.2× the blob in all.
///
/// Named `…LabScenarios` so that `make test` runs it with the lab, on its own.
@Suite(.serialized, .timeLimit(.minutes(10)))
struct BlobTransferLabScenarios {
    static let blobLength = 50 << 20
    static let rate = "20mbit"

    /// Two lab hosts with a 20 Mbit/s link, a sender holding a document with a 50 MiB blob,
    /// and a receiver dialling it (not yet started); `body` drives the transfer.
    func withSlowLink(
        _ scenario: String, _ body: (Lab, _ sender: Node, _ receiver: Node, _ start: () async throws -> Void, _ blob: BlobFile) async throws -> Void
    ) async throws {
        try await withLab(2, scenario) { lab in
            let cluster = Cluster("blob-\(scenario.replacingOccurrences(of: " ", with: "-"))")
            defer { cluster.cleanUp() }
            for host in lab.hosts { try await lab.limitLink(host, rate: Self.rate) }
            let sender = cluster.add("sender", host: lab.hosts[0])
            let receiver = cluster.add("receiver", host: lab.hosts[1])
            let (senderID, receiverID) = (try await sender.id, try await receiver.id)
            let blob = try BlobFile(length: Self.blobLength, in: cluster.root)
            let put = try await Ferry.run(["--data", sender.dataDirectory, "blob", "put", blob.path, "--content-type", "application/octet-stream"])
            #expect(put.status == 0, "ferry blob put: \(put.stderr)")
            let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(ref.contains(blob.digest), "blob put printed \(ref), digest \(blob.digest)")
            let doc = try await Ferry.run(["--data", sender.dataDirectory, "put", "scan", #"{"type":"scan","file":\#(ref)}"#])
            #expect(doc.status == 0, "ferry put: \(doc.stderr)")
            try await sender.start(["--interface", lab.hosts[0].address, "--trust", receiverID])
            let start = {
                try await receiver.start(["--interface", lab.hosts[1].address, "--trust", senderID, "--peer", "\(sender.url)#\(senderID)"])
            }
            try await body(lab, sender, receiver, start, blob)
            await finish(cluster, allowing: expectedRefusals + ["replication offline"])
        }
    }

    /// Bytes of the blob the receiver's partial file holds (0 when there is none yet).
    func partialBytes(_ receiver: Node, _ blob: BlobFile) -> Int64 {
        let path = "\(receiver.dataDirectory)/blobs/partial/\(blob.hex)"
        return ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? NSNumber)?.int64Value ?? 0
    }

    /// Waits until the receiver's partial file holds at least half of the blob.
    func awaitHalfWay(_ receiver: Node, _ blob: BlobFile) async throws {
        try await waitUntil("the receiver holds half of the blob", timeout: 120, every: .milliseconds(20)) {
            partialBytes(receiver, blob) >= Int64(Self.blobLength / 2)
        }
    }

    /// Waits until the receiver stores the document (only once its blob is complete and
    /// verified), then checks the blob's content there.
    func awaitDelivered(_ receiver: Node, _ blob: BlobFile) async throws {
        try await waitUntil("the receiver stores the document and its blob", timeout: 240, every: .milliseconds(100)) {
            try await receiver.admin.call("GET", "/docs/scan").status == 200
        }
        let copy = "\(receiver.dataDirectory)/../received-\(blob.hex.prefix(8))"
        let got = try await Ferry.run(["--data", receiver.dataDirectory, "blob", "get", "sha256-\(blob.hex)", "--output", copy])
        #expect(got.status == 0, "ferry blob get: \(got.stderr)")
        #expect(BlobFile.sha256(ofFileAt: copy) == blob.hex, "the received blob's content differs")
        try? FileManager.default.removeItem(atPath: copy)
    }

    func expectWithinBudget(_ bytes: LinkCounters, _ what: String) {
        let ratio = Double(bytes.total) / Double(Self.blobLength)
        print(String(format: "blob over %@ (%@): %d bytes on the sender's link (%d sent, %d received), %.3fx the blob", Self.rate, what, bytes.total, bytes.sent, bytes.received, ratio))
        #expect(ratio <= 1.2, "\(what): \(bytes.total) bytes on the link for a \(Self.blobLength)-byte blob (\(ratio)x)")
        #expect(bytes.sent >= Int64(Self.blobLength), "the sender's link carried less than the blob: \(bytes)")
    }

    @Test func aBlobResumesAfterTheLinkIsCutHalfWay() async throws {
        try await withSlowLink("link cut") { lab, sender, receiver, start, blob in
            let before = try await lab.counters(lab.hosts[0])
            try await start()
            try await awaitHalfWay(receiver, blob)
            try await lab.partition(lab.hosts[1])
            let senderID = try await sender.id
            // The receiver notices the silent link (liveness) and suspends the transfer.
            try await waitUntil("the receiver shows the sender offline", timeout: 60, every: .milliseconds(100)) {
                let peers = try await receiver.admin.get("/peers")["peers"]?.items ?? []
                return peers.first { $0["id"]?.stringValue == senderID }?["connected"]?.boolValue == false
            }
            let cutAt = partialBytes(receiver, blob)
            #expect(cutAt < Int64(Self.blobLength), "the blob was complete before the cut")
            try await lab.heal(lab.hosts[1])
            try await awaitDelivered(receiver, blob)
            let used = try await lab.counters(lab.hosts[0]) - before
            print("link cut at \(cutAt) of \(Self.blobLength) bytes")
            expectWithinBudget(used, "link cut half-way")
        }
    }

    @Test func aBlobResumesAfterTheReceiverIsKilledHalfWay() async throws {
        try await withSlowLink("receiver killed") { lab, _, receiver, start, blob in
            let before = try await lab.counters(lab.hosts[0])
            try await start()
            try await awaitHalfWay(receiver, blob)
            await receiver.kill()
            let killedAt = partialBytes(receiver, blob)
            #expect(killedAt < Int64(Self.blobLength), "the blob was complete before the kill")
            try await receiver.restart()
            try await awaitDelivered(receiver, blob)
            let used = try await lab.counters(lab.hosts[0]) - before
            print("receiver killed with \(killedAt) of \(Self.blobLength) bytes in its partial file")
            expectWithinBudget(used, "receiver killed half-way")
        }
    }
}

/// A file of pseudo-random bytes (incompressible, deterministic) and its digest.
struct BlobFile {
    let path: String
    let hex: String
    var digest: String { "sha256-\(hex)" }

    init(length: Int, in directory: String) throws {
        path = "\(directory)/blob-\(length).bin"
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        var bytes = [UInt8](repeating: 0, count: (length + 7) / 8 * 8)
        bytes.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for i in words.indices {
                // splitmix64
                state &+= 0x9E37_79B9_7F4A_7C15
                var z = state
                z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
                z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
                words[i] = z ^ (z >> 31)
            }
        }
        bytes.removeLast(bytes.count - length)
        guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else { throw HarnessError("cannot create \(path)") }
        hex = BlobDigest.of(bytes).hex
    }

    static func sha256(ofFileAt path: String) -> String? {
        FileManager.default.contents(atPath: path).map { BlobDigest.of($0).hex }
    }
}
