import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// `ferry backup` and `ferry restore` with real processes: a backup of a node that goes on
/// writing and replicating, restored as the same node, which its peer then brings up to
/// date; and a backup killed half-way, which leaves the node and earlier backups intact.
@Suite(.serialized, .timeLimit(.minutes(10))) struct BackupScenarios {
    /// A backs up while it writes; A stops; the backup is restored into a new directory and
    /// started as A again. B (which had everything A wrote, also after the backup) sends the
    /// restored node what its backup lacks, and a write on the restored node reaches B:
    /// nothing written anywhere is lost, and the two converge.
    @Test func aBackupOfARunningNodeRestoresAsTheSameNodeAndCatchesUpFromItsPeer() async throws {
        let cluster = Cluster("backup-restore")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        let b = cluster.add("b")
        let (idA, idB) = (try await a.id, try await b.id)
        try await a.start(["--trust", idB, "--no-discovery"])
        try await b.start(["--trust", idA, "--no-discovery", "--peer", "\(a.url)#\(idA)"])
        let blobFile = cluster.root + "/scan.bin"
        try Data((0..<300_000).map { UInt8(($0 * 7) % 251) }).write(to: URL(fileURLWithPath: blobFile))
        let blob = try await Ferry.run(["--data", a.dataDirectory, "blob", "put", blobFile, "--json"])
        #expect(blob.status == 0, "\(blob.stderr)")
        try await a.admin.put("with-blob", #"{"scan":\#(blob.stdout.trimmingCharacters(in: .whitespacesAndNewlines))}"#)
        for i in 0..<300 { try await a.admin.put("before-\(i)", #"{"i":\#(i)}"#) }

        // Writes keep coming while the backup runs. Stopped by a flag, not by cancelling the
        // task: a cancelled URLSession request on Linux can wait forever.
        let stopWriting = Locked(false)
        let writer = Task {
            var i = 0
            while !stopWriting.withLock({ $0 }) && i < 2_000 {
                _ = try? await a.admin.put("during-\(i)", #"{"i":\#(i)}"#)
                i += 1
            }
            return i
        }
        let backupDirectory = cluster.root + "/backup-a"
        let backup = try await Ferry.run(["--data", a.dataDirectory, "--json", "backup", backupDirectory])
        stopWriting.withLock { $0 = true }
        let written = await writer.value
        #expect(backup.status == 0, "\(backup.stderr)")
        let summary = try JSON.parse(backup.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(summary["node"]?.stringValue == idA)
        #expect(summary["blobs"]?.intValue == 1)
        let inBackup = summary["documents"]?.intValue ?? 0
        #expect(inBackup >= 301, "the backup lacks documents written before it started: \(inBackup)")
        let check = try await Ferry.run(["--data", backupDirectory, "check"])
        #expect(check.status == 0 && check.stdout.contains("ok"), "\(check.stdout)\(check.stderr)")
        let refused = try await Ferry.run(["--data", backupDirectory, "serve", "--ports", "auto"])
        #expect(refused.status != 0 && refused.stderr.contains("is a backup"), "a node must never run on a backup: \(refused.stderr)")

        try await a.admin.put("after-backup-a", "{}")
        try await cluster.awaitConvergence()
        _ = await a.stop()
        try await b.admin.put("after-backup-b", "{}")

        let a2 = cluster.add("a2")
        let restored = try await Ferry.run(["--data", a2.dataDirectory, "--json", "restore", backupDirectory])
        #expect(restored.status == 0, "\(restored.stderr)")
        let restoredSummary = try JSON.parse(restored.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(restoredSummary["node"]?.stringValue == idA, "restored as the same node")
        #expect(restoredSummary["database"]?.stringValue != summary["database"]?.stringValue, "the database UUID is renewed")
        try await a2.start(["--trust", idB, "--no-discovery", "--peer", "\(b.url)#\(idB)"])
        try await a2.admin.put("after-restore", "{}")
        try await cluster.awaitConvergence(among: [a2, b])
        let count = try await a2.admin.get("/")["docCount"]?.intValue ?? 0
        #expect(count == 301 + written + 3, "every document written anywhere is on the restored node: \(count), \(written) written during the backup")
        #expect(try await b.admin.call("GET", "/docs/after-restore").status == 200)
        let fetched = cluster.root + "/fetched.bin"
        let digest = try JSON.parse(blob.stdout)["digest"]?.stringValue ?? ""
        let get = try await Ferry.run(["--data", a2.dataDirectory, "blob", "get", digest, "-o", fetched])
        #expect(get.status == 0 && FileManager.default.contentsEqual(atPath: fetched, andPath: blobFile), "\(get.stderr)")
        await finish(cluster, allowing: expectedRefusals + ["connect_failed", "peer_silent"])
    }

    /// A `ferry backup` SIGKILLed while it copies a large blob leaves no backup directory,
    /// the node serving and writable, and an earlier backup that still restores; the next
    /// backup to the same place succeeds and clears what the killed one left.
    @Test func aBackupKilledHalfWayLeavesTheNodeAndEarlierBackupsIntact() async throws {
        let cluster = Cluster("backup-kill")
        defer { cluster.cleanUp() }
        let a = cluster.add("a")
        try await a.start(["--no-discovery"])
        for i in 0..<200 { try await a.admin.put("doc-\(i)", #"{"i":\#(i)}"#) }
        let earlier = cluster.root + "/earlier"
        #expect(try await Ferry.run(["--data", a.dataDirectory, "backup", earlier]).status == 0)

        // A blob large enough that copying it (with --copy, fsynced) takes a while.
        let blobFile = cluster.root + "/big.bin"
        let handle = try #require(FileHandle(forWritingAtPath: { FileManager.default.createFile(atPath: blobFile, contents: nil); return blobFile }()))
        let chunk = Data((0..<(1 << 20)).map { UInt8($0 % 253) })
        for i in 0..<256 {
            var c = chunk
            c[0] = UInt8(i)
            handle.write(c)
        }
        try handle.close()
        let put = try await Ferry.run(["--data", a.dataDirectory, "blob", "put", blobFile, "--json"], timeout: 300)
        #expect(put.status == 0, "\(put.stderr)")
        try await a.admin.put("big", #"{"file":\#(put.stdout.trimmingCharacters(in: .whitespacesAndNewlines))}"#)

        let target = cluster.root + "/killed"
        let child = try ChildProcess.spawn(
            Ferry.binary, ["--data", a.dataDirectory, "backup", target, "--copy"], stdoutPath: cluster.root + "/backup.out",
            stderrPath: cluster.root + "/backup.err")
        // Killed once its copy of the blob has begun (and not finished).
        let work = cluster.root + "/.killed.backup-\(child.pid)"
        try await waitUntil("the backup copies the blob", timeout: 120) {
            let shards = (try? FileManager.default.contentsOfDirectory(atPath: work + "/blobs")) ?? []
            return shards.contains { name in
                name.count == 2
                    && ((try? FileManager.default.contentsOfDirectory(atPath: "\(work)/blobs/\(name)")) ?? []).contains { file in
                        let size = (try? FileManager.default.attributesOfItem(atPath: "\(work)/blobs/\(name)/\(file)"))?[.size] as? NSNumber
                        return (size?.int64Value ?? 0) > 0
                    }
            }
        }
        child.signal(SIGKILL)
        _ = await child.wait(timeout: 30)
        #expect(!FileManager.default.fileExists(atPath: target), "a killed backup must leave no backup directory")

        // The node goes on: it answers and takes writes.
        try await a.admin.put("after-kill", "{}")
        #expect(try await a.admin.get("/")["docCount"]?.intValue == 202)
        // The earlier backup still restores and checks.
        let r = cluster.root + "/restored"
        let restored = try await Ferry.run(["--data", r, "--json", "restore", earlier])
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(try JSON.parse(restored.stdout)["documents"]?.intValue == 200)
        #expect(try await Ferry.run(["--data", r, "check"]).status == 0)
        // The next backup there succeeds and removes the killed one's leftovers.
        let again = try await Ferry.run(["--data", a.dataDirectory, "--json", "backup", target], timeout: 300)
        #expect(again.status == 0, "\(again.stderr)")
        #expect(try JSON.parse(again.stdout)["documents"]?.intValue == 202)
        #expect(!FileManager.default.fileExists(atPath: work), "the killed backup's work directory is removed")
        await finish(cluster)
    }
}
