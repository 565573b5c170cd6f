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

/// The same slow link, crossed by the CouchDB replication protocol: `ferry sync
/// https://SENDER:6984/ferry --pin ID --pull` on the receiving host fetches the 50 MiB
/// attachment from the sender's `couch.lan` listener, streamed into a resume file. A sync
/// SIGKILLed half-way, or one whose link is cut until its transfer stalls, resumes with a
/// `Range` request: the link carries at most 1.2× the blob in all.
///
/// Named `…LabScenarios` so that `make test` runs it with the lab, on its own.
@Suite(.serialized, .timeLimit(.minutes(10)))
struct CouchBlobTransferLabScenarios {
    typealias Native = BlobTransferLabScenarios
    static let couchPort = 6984

    /// A sender on host 0 serving the CouchDB API over HTTPS to user `hub`, holding a
    /// document with a 50 MiB blob; `body` gets the `ferry sync` arguments that pull it
    /// into `receiver` (a data directory on host 1).
    func withSlowCouchLink(
        _ scenario: String, _ body: (Lab, _ receiver: String, _ sync: [String], _ blob: BlobFile, _ cluster: Cluster) async throws -> Void
    ) async throws {
        try await withLab(2, scenario) { lab in
            let cluster = Cluster("couch-blob-\(scenario.replacingOccurrences(of: " ", with: "-"))")
            defer { cluster.cleanUp() }
            for host in lab.hosts { try await lab.limitLink(host, rate: Native.rate) }
            let sender = cluster.add("sender", host: lab.hosts[0])
            let senderID = try await sender.id
            let password = cluster.root + "/hub.password"
            try "hub-pass-2231\n".write(toFile: password, atomically: true, encoding: .utf8)
            let made = try await Ferry.run(["couch-user", "hub", "--password-file", password, "--iterations", "10000"])
            let user = try #require(try? JSON.parse(Array(made.stdout.utf8)), "ferry couch-user: \(made.stdout) \(made.stderr)")
            let config = cluster.root + "/sender.json"
            try #"{"couch":{"users":[\#(user.canonicalString)],"lan":{"interface":"\#(lab.hosts[0].address)","port":\#(Self.couchPort)}}}"#
                .write(toFile: config, atomically: true, encoding: .utf8)
            let credentials = cluster.root + "/hub.credentials"
            try "hub:hub-pass-2231\n".write(toFile: credentials, atomically: true, encoding: .utf8)
            chmod(credentials, 0o600)
            let blob = try BlobFile(length: Native.blobLength, in: cluster.root)
            let put = try await Ferry.run(["--data", sender.dataDirectory, "blob", "put", blob.path, "--content-type", "application/octet-stream"])
            #expect(put.status == 0, "ferry blob put: \(put.stderr)")
            let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            let doc = try await Ferry.run(["--data", sender.dataDirectory, "put", "scan", #"{"type":"scan","file":\#(ref)}"#])
            #expect(doc.status == 0, "ferry put: \(doc.stderr)")
            try await sender.start(["--interface", lab.hosts[0].address, "--config", config, "--no-discovery"])
            let receiver = cluster.root + "/receiver"
            let sync = [
                "--data", receiver, "sync", "https://\(lab.hosts[0].address):\(Self.couchPort)/ferry", "--pin", senderID,
                "--credentials-file", credentials, "--pull",
            ]
            try await body(lab, receiver, sync, blob, cluster)
            await finish(cluster, allowing: expectedRefusals)
        }
    }

    /// `ferry sync ARGS` on `host`, not waited for; its output and its log (info and up)
    /// go to `log`.
    func spawnSync(_ lab: Lab, _ host: LabHost, _ arguments: [String], log: String) throws -> ChildProcess {
        var environment = LabHost.environment
        environment["FERRY_LOG_LEVEL"] = "info"
        return try ChildProcess.spawn(
            "/usr/bin/nsenter", host.nsenterArguments + [Ferry.binary] + arguments, environment: environment,
            stdoutPath: log, stderrPath: log)
    }

    /// Bytes in the receiver's resume file for the attachment (0 when there is none).
    func resumeBytes(_ receiver: String) -> Int64 {
        let tmp = receiver + "/blobs/tmp"
        let names = (try? FileManager.default.contentsOfDirectory(atPath: tmp)) ?? []
        return names.filter { $0.hasPrefix("resume-couch-") }.compactMap { name in
            ((try? FileManager.default.attributesOfItem(atPath: "\(tmp)/\(name)"))?[.size] as? NSNumber)?.int64Value
        }.max() ?? 0
    }

    func awaitHalfWay(_ receiver: String) async throws {
        try await waitUntil("the receiver's resume file holds half of the blob", timeout: 120, every: .milliseconds(20)) {
            resumeBytes(receiver) >= Int64(Native.blobLength / 2)
        }
    }

    /// Checks that the receiver holds the document and exactly the blob.
    func expectDelivered(_ receiver: String, _ blob: BlobFile) async throws {
        let got = try await Ferry.run(["--data", receiver, "get", "scan"])
        #expect(got.status == 0, "ferry get scan: \(got.stderr)")
        let copy = receiver + "/../received.bin"
        let out = try await Ferry.run(["--data", receiver, "blob", "get", blob.digest, "--output", copy])
        #expect(out.status == 0, "ferry blob get: \(out.stderr)")
        #expect(BlobFile.sha256(ofFileAt: copy) == blob.hex, "the received blob's content differs")
        try? FileManager.default.removeItem(atPath: copy)
    }

    @Test func aCouchDBProtocolPullSIGKILLedHalfWayResumesWithARange() async throws {
        try await withSlowCouchLink("sync killed") { lab, receiver, sync, blob, cluster in
            let before = try await lab.counters(lab.hosts[0])
            let first = try spawnSync(lab, lab.hosts[1], sync, log: cluster.root + "/sync-1.log")
            try await awaitHalfWay(receiver)
            first.signal(SIGKILL)
            _ = await first.wait(timeout: 30)
            let killedAt = resumeBytes(receiver)
            #expect(killedAt < Int64(Native.blobLength), "the attachment was complete before the kill")
            let second = try await Ferry.run(sync, host: lab.hosts[1], timeout: 240)
            #expect(second.status == 0, "the second sync: \(second.stderr)")
            try await expectDelivered(receiver, blob)
            let used = try await lab.counters(lab.hosts[0]) - before
            print("CouchDB-protocol sync killed with \(killedAt) of \(Native.blobLength) bytes in its resume file")
            BlobTransferLabScenarios().expectWithinBudget(used, "CouchDB protocol, sync killed half-way")
        }
    }

    @Test func aCouchDBProtocolPullWhoseLinkIsCutResumesOnceTheTransferStalls() async throws {
        try await withSlowCouchLink("couch link cut") { lab, receiver, sync, blob, cluster in
            let before = try await lab.counters(lab.hosts[0])
            let log = cluster.root + "/sync.log"
            let running = try spawnSync(lab, lab.hosts[1], sync, log: log)
            try await awaitHalfWay(receiver)
            try await lab.partition(lab.hosts[1])
            // No byte moves: the transfer is declared stalled (30 s) and retried.
            try await waitUntil("the sync reports the stalled transfer", timeout: 90, every: .milliseconds(200)) {
                ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("stalled")
            }
            let cutAt = resumeBytes(receiver)
            try await lab.heal(lab.hosts[1])
            let status = await running.wait(timeout: 240)
            #expect(status == 0, "the sync ended with \(String(describing: status)): \((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")")
            try await expectDelivered(receiver, blob)
            let used = try await lab.counters(lab.hosts[0]) - before
            print("CouchDB-protocol link cut with \(cutAt) of \(Native.blobLength) bytes in the resume file")
            BlobTransferLabScenarios().expectWithinBudget(used, "CouchDB protocol, link cut half-way")
        }
    }
}
