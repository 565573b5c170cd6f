import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// A real `ferry serve` node whose data directory is a small tmpfs that fills up: during
/// local writes, and during a pull of a document with a blob. Every refused write says the
/// disk is full, the node stays up, `ferry check` finds nothing corrupted, and once the disk
/// grows the same writes and the same pull succeed without losing anything stored before.
/// And one whose data disk turns read-only under it (an ext4 error): writes are refused as
/// such, reads go on, and after a repair every document is there.
@Suite(.serialized, .timeLimit(.minutes(5)), .enabled(if: mustRunEverything, "needs root to mount a small tmpfs and a loop device"))
struct DiskFaultScenarios {
    /// A tmpfs mounted on `path` (an empty directory) of `megabytes`; grown or unmounted later.
    struct SmallDisk {
        let path: String

        init(on path: String, megabytes: Int) async throws {
            self.path = path
            try await Self.mount(["-t", "tmpfs", "-o", "size=\(megabytes)m,mode=700", "tmpfs", path])
        }

        func grow(to megabytes: Int) async throws { try await Self.mount(["-o", "remount,size=\(megabytes)m", path]) }

        func release() async { _ = try? await Shell.run(["-l", path], executable: "/bin/umount") }

        static func mount(_ arguments: [String]) async throws {
            let r = try await Shell.run(arguments, executable: "/bin/mount")
            guard r.status == 0 else { throw ScenarioFailure("mount \(arguments.joined(separator: " ")): \(r.stderr)") }
        }
    }

    struct ScenarioFailure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    static let fullDisk = "the disk holding the data directory is full"

    func ferry(_ node: Node, _ arguments: [String]) async throws -> Ferry.Result {
        try await Ferry.run(["--data", node.dataDirectory] + arguments)
    }

    /// SIGTERMs the node (it must exit 0), checks its log, then unmounts the disk and removes the rest.
    func end(_ cluster: Cluster, _ disk: SmallDisk, sourceLocation: SourceLocation = #_sourceLocation) async {
        let failures = await cluster.shutDown(allowedLogLines: ["admin API request failed", Self.fullDisk])
        for f in failures { Issue.record(Comment(rawValue: f), sourceLocation: sourceLocation) }
        await disk.release()
        cluster.cleanUp()
    }

    /// Runs `body` with node `a` of a new cluster on a tmpfs of `megabytes`, unmounted however it ends.
    func withNodeOnSmallDisk(_ label: String, megabytes: Int, _ body: (Cluster, Node, SmallDisk) async throws -> Void) async throws {
        let cluster = Cluster(label)
        let node = cluster.add("a")
        let disk = try await SmallDisk(on: node.dataDirectory, megabytes: megabytes)
        do {
            try await node.start(["--no-discovery"])
            try await body(cluster, node, disk)
        } catch {
            _ = await cluster.shutDown()
            await disk.release()
            cluster.cleanUp()
            throw error
        }
        await end(cluster, disk)
    }

    @Test func localWritesOnAFullDiskAreRefusedClearlyAndSucceedOnceSpaceReturns() async throws {
        try await withNodeOnSmallDisk("disk-writes", megabytes: 8) { cluster, node, disk in
            let fill = String(repeating: "x", count: 200_000)
            var stored: [String: String] = [:]
            var refused: AdminClient.Reply?
            for i in 0..<200 {
                let reply = try await node.admin.call("PUT", "/docs/doc-\(i)", body: #"{"pad":"\#(fill)"}"#)
                if reply.status >= 300 {
                    refused = reply
                    break
                }
                stored["doc-\(i)"] = reply.json["rev"]?.stringValue
            }
            let refusal = try #require(refused, "8 MB never filled up")
            #expect(refusal.text.contains(Self.fullDisk), "\(refusal.status) \(refusal.text)")
            #expect(stored.count > 10)
            // The CLI says the same, and the node still answers.
            let bodyFile = cluster.root + "/one-more.json"
            #expect(FileManager.default.createFile(atPath: bodyFile, contents: Data(#"{"pad":"\#(fill)"}"#.utf8)))
            let cli = try await ferry(node, ["put", "one-more", "@" + bodyFile])
            #expect(cli.status != 0)
            #expect(cli.stderr.contains(Self.fullDisk), "\(cli.stderr)")
            #expect(try await node.admin.get("/")["id"] != nil)
            #expect(node.isRunning)

            try await disk.grow(to: 64)
            let after = try await node.admin.call("PUT", "/docs/one-more", body: #"{"pad":"\#(fill)"}"#)
            #expect(after.status == 201, "\(after.text)")
            // Everything stored before the disk filled is intact.
            let revisions = try await node.admin.revisions()
            for (id, rev) in stored { #expect(revisions[id] == rev, "\(id)") }
            let check = try await ferry(node, ["check"])
            #expect(check.status == 0, "\(check.stdout) \(check.stderr)")
        }
    }

    @Test func aPullOfABlobOntoAFullDiskFailsClearlyAndResumesOnceSpaceReturns() async throws {
        try await withNodeOnSmallDisk("disk-pull", megabytes: 6) { cluster, node, disk in
            // The source: a data directory on the ordinary disk with 20 documents and a 12 MB blob.
            let source = cluster.root + "/source"
            let blobFile = cluster.root + "/scan.bin"
            var bytes = [UInt8](repeating: 0, count: 12 << 20)
            for i in stride(from: 0, to: bytes.count, by: 4096) { bytes[i] = UInt8(truncatingIfNeeded: i >> 12) }
            #expect(FileManager.default.createFile(atPath: blobFile, contents: Data(bytes)))
            let put = try await Ferry.run(["--data", source, "--create", "blob", "put", blobFile])
            #expect(put.status == 0, "\(put.stderr)")
            let blob = try JSON.parse(put.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
            let digest = try #require(blob["digest"]?.stringValue)
            for i in 0..<20 {
                #expect(try await Ferry.run(["--data", source, "put", "note-\(i)", #"{"n":\#(i)}"#]).status == 0)
            }
            let scan = #"{"scan":{"@type":"blob","digest":"\#(digest)","length":\#(bytes.count)}}"#
            #expect(try await Ferry.run(["--data", source, "put", "scan", scan]).status == 0)

            let first = try await ferry(node, ["sync", source, "--pull"])
            #expect(first.status != 0)
            #expect(first.stderr.contains(Self.fullDisk), "\(first.stderr)")
            #expect(node.isRunning)
            #expect(try await node.admin.get("/")["id"] != nil)
            let check = try await ferry(node, ["check"])
            #expect(check.status == 0, "\(check.stdout) \(check.stderr)")

            try await disk.grow(to: 64)
            let second = try await ferry(node, ["sync", source, "--pull", "--json"])
            #expect(second.status == 0, "\(second.stderr)")
            let here = try await node.admin.revisions()
            #expect(here.count == 21)
            let copy = cluster.root + "/scan.copy"
            let got = try await ferry(node, ["blob", "get", digest, "-o", copy])
            #expect(got.status == 0, "\(got.stderr)")
            #expect(FileManager.default.contents(atPath: copy) == Data(bytes))
            #expect(try await ferry(node, ["check"]).status == 0)
        }
    }

    static let readOnly = "read-only"

    /// An ext4 file system in an image on a loop device, mounted on `path` with
    /// `errors=remount-ro`: what a data disk does after an I/O error.
    struct LoopDisk {
        let path: String
        let image: String

        init(on path: String, image: String) async throws {
            self.path = path
            self.image = image
            for (tool, arguments) in [("/usr/bin/truncate", ["-s", "64M", image]), ("/usr/sbin/mkfs.ext4", ["-q", "-F", image])] {
                let r = try await Shell.run(arguments, executable: tool)
                guard r.status == 0 else { throw ScenarioFailure("\(tool): \(r.stderr)") }
            }
            try await mount()
        }

        func mount() async throws { try await SmallDisk.mount(["-o", "loop,errors=remount-ro", image, path]) }

        /// The kernel's own error path (ext4's trigger_fs_error): the file system turns
        /// read-only at once, for every open file too.
        func failWithAnError() async throws {
            let device = try await Shell.run(["-n", "-o", "SOURCE", path], executable: "/usr/bin/findmnt").stdout
                .trimmingCharacters(in: .whitespacesAndNewlines)
            let trigger = "/sys/fs/ext4/\((device as NSString).lastPathComponent)/trigger_fs_error"
            guard FileManager.default.fileExists(atPath: trigger) else { throw ScenarioFailure("no \(trigger) (device \(device))") }
            try "a disk fault injected by DiskFaultScenarios".write(toFile: trigger, atomically: false, encoding: .utf8)
        }

        /// Unmounts, repairs with e2fsck, and mounts read-write again, as an operator would.
        /// The old loop device is detached first: one left attached (its release is lazy) is
        /// reused by the next `mount -o loop` with the failed file system's blocks still in its
        /// cache, and the disk came back read-only.
        func repair() async throws {
            var umountSaid = ""
            let unmounted = try await eventually(30, every: .milliseconds(200)) {
                umountSaid = try await Shell.run([path], executable: "/bin/umount").stderr
                return try await !isMounted()
            }
            guard unmounted else { throw ScenarioFailure("\(path) stays mounted: \(umountSaid)") }
            try await detachLoopDevices()
            let fsck = try await Shell.run(["-f", "-y", image], executable: "/usr/sbin/e2fsck")
            guard fsck.status < 4 else { throw ScenarioFailure("e2fsck: \(fsck.status) \(fsck.stdout) \(fsck.stderr)") }
            try await mount()
            let options = try await Shell.run(["-n", "-o", "OPTIONS", path], executable: "/usr/bin/findmnt").stdout
            guard options.split(separator: ",").first == "rw" else {
                throw ScenarioFailure("\(path) mounted again as \(options) after e2fsck")
            }
        }

        func isMounted() async throws -> Bool {
            try await Shell.run(["-n", path], executable: "/usr/bin/findmnt").status == 0
        }

        /// Detaches every loop device backed by the image and waits until none is left.
        func detachLoopDevices() async throws {
            var left = ""
            let detached = try await eventually(30, every: .milliseconds(200)) {
                let listed = try await Shell.run(["-j", image, "-O", "NAME", "-n"], executable: "/usr/sbin/losetup").stdout
                let devices = listed.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
                    .filter { !$0.isEmpty }
                left = devices.joined(separator: " ")
                for device in devices { _ = try await Shell.run(["-d", device], executable: "/usr/sbin/losetup") }
                return devices.isEmpty
            }
            guard detached else { throw ScenarioFailure("loop devices of \(image) stay attached: \(left)") }
        }

        func release() async {
            _ = try? await Shell.run(["-l", path], executable: "/bin/umount")
            try? FileManager.default.removeItem(atPath: image)
        }
    }

    @Test func aDataDirectoryWhoseFileSystemTurnsReadOnlyRefusesWritesClearlyAndLosesNothing() async throws {
        let cluster = Cluster("disk-ro")
        let node = cluster.add("a")
        let disk = try await LoopDisk(on: node.dataDirectory, image: cluster.root + "/disk.img")
        do {
            try await node.start(["--no-discovery"])
            var stored: [String: String] = [:]
            for i in 0..<20 { stored["doc-\(i)"] = try await node.admin.put("doc-\(i)", #"{"n":\#(i)}"#) }
            try await disk.failWithAnError()

            let refused = try await node.admin.call("PUT", "/docs/after", body: #"{"n":-1}"#)
            #expect(refused.status >= 400)
            #expect(refused.text.contains(Self.readOnly), "\(refused.status) \(refused.text)")
            let cli = try await ferry(node, ["put", "after-cli", #"{"n":-2}"#])
            #expect(cli.status != 0)
            #expect(cli.stderr.contains(Self.readOnly), "\(cli.stderr)")
            // Reads go on, and the node stays up until it is stopped.
            #expect(try await node.admin.get("/docs/doc-7")["n"] == 7)
            #expect(node.isRunning)
            let stopped = await node.stop()
            #expect(stopped == 0, "\(node.logTail(30))")

            try await disk.repair()
            try await node.restart()
            let revisions = try await node.admin.revisions()
            for (id, rev) in stored { #expect(revisions[id] == rev, "\(id)") }
            #expect(try await node.admin.call("PUT", "/docs/after", body: #"{"n":-1}"#).status == 201)
            let check = try await ferry(node, ["check"])
            #expect(check.status == 0, "\(check.stdout) \(check.stderr)")
        } catch {
            _ = await cluster.shutDown()
            await disk.release()
            cluster.cleanUp()
            throw error
        }
        let failures = await cluster.shutDown(allowedLogLines: ["admin API request failed", Self.readOnly])
        for f in failures { Issue.record(Comment(rawValue: f)) }
        await disk.release()
        cluster.cleanUp()
    }
}
