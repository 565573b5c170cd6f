import ArgumentParser
import FerryCore
import FerrySync
import Foundation
import IntegrationHarness

/// P14: one large blob pulled natively between two `ferry` processes over TLS WebSocket.
/// P14a against a raw TLS WebSocket stream of the same file on loopback (same run); P14b on
/// a `tbf`-limited link between two lab hosts, against the link rate; P14c the sender's and
/// receiver's peak RSS for a large against a small blob; P14d against Syncthing moving the
/// same file (loopback, private network namespace).
struct BlobBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blob",
        abstract: "P14: a large blob over TLS WebSocket: vs a raw TLS stream (>= 0.7), vs a tbf link's rate (>= 0.9), peak RSS large vs small (<= 1.2x), vs Syncthing (<= 0.5x its time).")

    @Option(help: "Blob size for P14a, P14c and P14d (suffix k, m or g: KiB, MiB, GiB).") var size = "1g"
    @Option(help: "The small blob P14c compares with.") var small = "10m"
    @Option(help: "Blob size for P14b, on the limited link.") var linkSize = "256m"
    @Option(help: "The P14b link's rate, as tc takes it (kbit, mbit or gbit).") var linkRate = "100mbit"
    @Option(help: "Loopback runs for P14a (median reported).") var runs = 3
    @Option(help: "Which figures: any of a, b, c, d, comma-separated (b and d need root).") var parts = "a,b,c,d"
    @Option(help: "Directory for scratch data.") var scratch = "/var/tmp"
    @Option(help: "Also record the figures in this JSON report.") var report: String?
    @Flag(help: .hidden) var inNamespace = false

    func validate() throws {
        for (flag, value) in [("--size", size), ("--small", small), ("--link-size", linkSize)] where Self.bytes(value) == nil {
            throw ValidationError("\(flag) takes a size such as 1g, 300m or 512k")
        }
        guard Self.bitsPerSecond(linkRate) != nil else { throw ValidationError("--link-rate takes a rate such as 100mbit") }
        guard runs >= 1 else { throw ValidationError("--runs must be at least 1") }
    }

    var selected: Set<String> { Set(parts.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }) }

    func run() async throws {
        let length = Self.bytes(size)!
        if inNamespace { return try await syncthingFigure(length) }
        let root = try makeScratchDirectory(in: scratch, prefix: "ferry-bench-blob")
        defer { try? FileManager.default.removeItem(atPath: root) }
        var figures: [Figure] = []
        print("blob: \(Self.describe(length)) blob, TLS 1.3 WebSocket; release build: \(NetBench.ferryBinary())")
        if !selected.isDisjoint(with: ["a", "c"]) {
            let large = try Source(root: "\(root)/large", length: length)
            if selected.contains("a") { figures += try await loopbackFigure(large, root: root) }
            if selected.contains("c") {
                let smallSource = try Source(root: "\(root)/small", length: Self.bytes(small)!)
                figures += try memoryFigure(large: large, small: smallSource, root: root)
            }
            large.remove()
        }
        if selected.contains("b") {
            if getuid() == 0 { figures += try await linkFigure(root: root) } else { print("P14b not measured: the lab needs root") }
        }
        if let report, !figures.isEmpty { try BenchReport.record(figures, in: report) }
        if selected.contains("d") {
            guard getuid() == 0 else {
                print("P14d not measured: Syncthing runs in a private network namespace, which needs root")
                return
            }
            try reexecInPrivateNetwork()
        }
    }

    // MARK: P14a: loopback against a raw TLS WebSocket stream

    func loopbackFigure(_ source: Source, root: String) async throws -> [Figure] {
        var ferry: [Double] = []
        var raw: [Double] = []
        for run in 1...runs {
            // Alternate the order so neither side always runs on a warmer machine.
            if run % 2 == 1 {
                raw.append(try await rawStream(source.file, length: source.length, root: root))
                ferry.append(try pull(source, into: "\(root)/receiver-\(run)").seconds)
            } else {
                ferry.append(try pull(source, into: "\(root)/receiver-\(run)").seconds)
                raw.append(try await rawStream(source.file, length: source.length, root: root))
            }
            print(String(format: "  run %d: ferry %.2f s (%.0f MiB/s), raw TLS WebSocket %.2f s (%.0f MiB/s)", run, ferry.last!,
                Self.mibps(source.length, ferry.last!), raw.last!, Self.mibps(source.length, raw.last!)))
        }
        let rates = ferry.map { Double(source.length) / $0 }, rawRates = raw.map { Double(source.length) / $0 }
        let ratios = zip(rates, rawRates).map { $0 / $1 }
        let (f, r, q) = (Stats(rates), Stats(rawRates), Stats(ratios))
        print(String(format: "P14a raw TLS WebSocket stream %7.1f MiB/s (min %.1f, max %.1f)", r.median / 1_048_576, r.min / 1_048_576, r.max / 1_048_576))
        print(String(format: "P14a ferry pull               %7.1f MiB/s (min %.1f, max %.1f)", f.median / 1_048_576, f.min / 1_048_576, f.max / 1_048_576))
        print(String(format: "P14a ratio ferry/raw          %7.2f (min %.2f, max %.2f)  target >= 0.70  %@", q.median, q.min, q.max, q.median >= 0.7 ? "HOLDS" : "MISSES"))
        return [
            Figure(
                id: "P14a", name: "One \(Self.describe(source.length)) blob pulled between two processes over TLS WebSocket on loopback, relative to a raw TLS WebSocket stream of the same file",
                value: f.median / 1_048_576, unit: "MiB/s", baseline: r.median / 1_048_576, ratio: q.median, target: ">= 0.7", holds: q.median >= 0.7,
                runs: zip(rates, rawRates).map { ($0 / 1_048_576, $1 / 1_048_576, $0 / $1) })
        ]
    }

    /// Seconds to stream `file` one way over an in-process TLS 1.3 WebSocket pair on
    /// loopback, read from disk in 256 KiB messages and written to disk on the other side.
    func rawStream(_ file: String, length: Int64, root: String) async throws -> Double {
        let target = "\(root)/raw-received"
        let done = AsyncStream<Int64>.makeStream()
        let raw = try await RawWebSocket.start(root: root, name: "raw-blob") { endpoint in
            var n: Int64 = 0
            let fd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            do {
                for try await m in endpoint.incoming {
                    _ = m.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                    n += Int64(m.count)
                    if n >= length { break }
                }
            } catch {}
            fsync(fd)
            close(fd)
            done.continuation.yield(n)
        }
        defer {
            raw.stop()
            try? FileManager.default.removeItem(atPath: target)
        }
        let start = ContinuousClock.now
        let endpoint = try await raw.connect()
        guard let input = FileHandle(forReadingAtPath: file) else { throw BenchError("cannot read \(file)") }
        defer { try? input.close() }
        while let chunk = try input.read(upToCount: SyncProtocol.blobChunkSize), !chunk.isEmpty {
            try await endpoint.send(Array(chunk))
        }
        var it = done.stream.makeAsyncIterator()
        let received = await it.next() ?? 0
        let elapsed = (ContinuousClock.now - start).seconds
        await endpoint.close(error: nil)
        guard received == length else { throw BenchError("raw stream delivered \(received) of \(length) bytes") }
        return elapsed
    }

    // MARK: P14c: peak RSS, large against small

    func memoryFigure(large: Source, small: Source, root: String) throws -> [Figure] {
        let big = try pull(large, into: "\(root)/rss-large")
        let little = try pull(small, into: "\(root)/rss-small")
        small.remove()
        let receiverRatio = Double(big.receiverKiB) / Double(little.receiverKiB)
        let senderRatio = Double(big.senderKiB) / Double(little.senderKiB)
        let worst = max(receiverRatio, senderRatio)
        print(String(format: "P14c peak RSS, %@ vs %@: receiver %.1f vs %.1f MiB (%.2fx), sender %.1f vs %.1f MiB (%.2fx)  target <= 1.2x  %@",
            Self.describe(large.length), Self.describe(small.length), Double(big.receiverKiB) / 1024, Double(little.receiverKiB) / 1024, receiverRatio,
            Double(big.senderKiB) / 1024, Double(little.senderKiB) / 1024, senderRatio, worst <= 1.2 ? "HOLDS" : "MISSES"))
        return [
            Figure(
                id: "P14c-receiver", name: "Receiver (ferry sync --pull) peak RSS pulling a \(Self.describe(large.length)) blob vs a \(Self.describe(small.length)) one",
                value: Double(big.receiverKiB) / 1024, unit: "MiB", baseline: Double(little.receiverKiB) / 1024, ratio: receiverRatio,
                target: "<= 1.2", holds: receiverRatio <= 1.2, runs: [(Double(big.receiverKiB) / 1024, Double(little.receiverKiB) / 1024, receiverRatio)]),
            Figure(
                id: "P14c-sender", name: "Sender (ferry serve) peak RSS serving a \(Self.describe(large.length)) blob vs a \(Self.describe(small.length)) one",
                value: Double(big.senderKiB) / 1024, unit: "MiB", baseline: Double(little.senderKiB) / 1024, ratio: senderRatio,
                target: "<= 1.2", holds: senderRatio <= 1.2, runs: [(Double(big.senderKiB) / 1024, Double(little.senderKiB) / 1024, senderRatio)]),
        ]
    }

    // MARK: P14b: a tbf-limited link between two lab hosts

    func linkFigure(root: String) async throws -> [Figure] {
        if let why = await Lab.unavailableReason() { throw BenchError("P14b: \(why)") }
        let length = Self.bytes(linkSize)!, rate = Self.bitsPerSecond(linkRate)!
        let source = try Source(root: "\(root)/link", length: length)
        defer { source.remove() }
        let lab = try await Lab(hosts: 2)
        var server: pid_t = 0
        do {
            for host in lab.hosts { try await lab.limitLink(host, rate: linkRate) }
            let (h1, h2) = (lab.hosts[0], lab.hosts[1])
            let ferry = NetBench.ferryBinary()
            let receiver = "\(root)/link-receiver"
            let receiverID = try NetBench.capture(ferry, ["--data", receiver, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
            try? FileManager.default.removeItem(atPath: "\(source.data)/node.json")
            server = try NetBench.launch(
                "/usr/bin/nsenter", h1.nsenterArguments + [ferry, "--data", source.data, "serve", "--port", "0", "--admin-port", "0", "--couch-port", "0",
                    "--no-discovery", "--interface", h1.address, "--trust", receiverID], quiet: true)
            let url = try await NetBench.waitForNodeFile(source.data, pid: server)["url"]?.stringValue ?? ""
            let before = try await lab.counters(h1)
            let start = ContinuousClock.now
            let r = NetBench.reap(try NetBench.launch(
                "/usr/bin/nsenter", h2.nsenterArguments + [ferry, "--data", receiver, "sync", url, "--pin", source.id, "--pull"], quiet: true))
            let seconds = (ContinuousClock.now - start).seconds
            guard r.status == 0 else { throw BenchError("ferry sync over the limited link failed with status \(r.status)") }
            let wire = try await lab.counters(h1) - before
            kill(server, SIGKILL)
            _ = NetBench.reap(server)
            server = 0
            await lab.tearDown()
            let goodput = Double(length) * 8 / seconds
            let ratio = goodput / rate
            print(String(format: "P14b %@ over a %@ tbf link: %.1f s, %.1f Mbit/s of blob, %.2f of the link rate  target >= 0.9  %@; %.3fx the blob on the wire",
                Self.describe(length), linkRate, seconds, goodput / 1e6, ratio, ratio >= 0.9 ? "HOLDS" : "MISSES", Double(wire.total) / Double(length)))
            return [
                Figure(
                    id: "P14b", name: "One \(Self.describe(length)) blob pulled over a \(linkRate) tbf link between two lab hosts: blob bits per second relative to the link rate",
                    value: goodput / 1e6, unit: "Mbit/s", baseline: rate / 1e6, ratio: ratio, target: ">= 0.9", holds: ratio >= 0.9,
                    runs: [(goodput / 1e6, rate / 1e6, ratio)])
            ]
        } catch {
            if server != 0 { kill(server, SIGKILL); _ = NetBench.reap(server) }
            await lab.tearDown()
            throw error
        }
    }

    // MARK: P14d: against Syncthing (inside a private network namespace)

    func syncthingFigure(_ length: Int64) async throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/syncthing") else { throw BenchError("syncthing is not installed") }
        guard SyncthingBench.run("/usr/sbin/ip", ["link", "set", "lo", "up"]) == 0 else { throw BenchError("cannot bring up loopback in the private namespace") }
        setenv("STNOUPGRADE", "1", 1)
        setenv("STNORESTART", "1", 1)
        let root = try makeScratchDirectory(in: scratch, prefix: "ferry-bench-blob-st")
        defer { try? FileManager.default.removeItem(atPath: root) }
        let file = "\(root)/blob.bin"
        try Self.writeRandomFile(file, length: length)

        // Ferry: store the file as a blob in a document, then pull it into another process.
        let putStart = ContinuousClock.now
        let source = try Source(root: "\(root)/ferry", file: file, length: length)
        let putSeconds = (ContinuousClock.now - putStart).seconds
        let pulled = try pull(source, into: "\(root)/ferry-receiver")
        let ferrySeconds = putSeconds + pulled.seconds
        try? FileManager.default.removeItem(atPath: source.data)  // the file goes on to Syncthing

        // Syncthing: the same file in a shared folder, from the folder's addition (scan and
        // hash included, as Ferry's time includes storing the blob) to the file on B.
        let (a, b) = try await Syncthing.connectedPair(root: root, gui: 18484, listen: 22101)
        defer { a.stop(); b.stop() }
        let folderA = "\(a.home)/blob", folderB = "\(b.home)/blob"
        try FileManager.default.createDirectory(atPath: folderA, withIntermediateDirectories: true)
        try FileManager.default.moveItem(atPath: file, toPath: "\(folderA)/blob.bin")
        try await b.addFolder("blob", path: folderB, sharedWith: a, watcher: false)
        let stStart = ContinuousClock.now
        try await a.addFolder("blob", path: folderA, sharedWith: b, watcher: false)
        let arrived = "\(folderB)/blob.bin"
        while ((try? FileManager.default.attributesOfItem(atPath: arrived))?[.size] as? NSNumber)?.int64Value != length {
            guard ContinuousClock.now - stStart < .seconds(1800) else { throw BenchError("syncthing did not deliver the file in 30 minutes") }
            try await Task.sleep(for: .milliseconds(20))
        }
        let stSeconds = (ContinuousClock.now - stStart).seconds
        let ratio = ferrySeconds / stSeconds
        print(String(format: "P14d %@ on loopback: ferry %.2f s (blob put %.2f s + pull %.2f s), syncthing %.2f s: %.2f of Syncthing's time  target <= 0.5  %@",
            Self.describe(length), ferrySeconds, putSeconds, pulled.seconds, stSeconds, ratio, ratio <= 0.5 ? "HOLDS" : "MISSES"))
        if let report {
            try BenchReport.record([
                Figure(
                    id: "P14d", name: "One \(Self.describe(length)) file on loopback: Ferry (blob put + native pull) vs Syncthing 1.19 (scan, hash and transfer), time",
                    value: ferrySeconds, unit: "s", baseline: stSeconds, ratio: ratio, target: "<= 0.5", holds: ratio <= 0.5,
                    runs: [(ferrySeconds, stSeconds, ratio)])
            ], in: report)
        }
    }

    /// Runs this command again inside `unshare --net` (a namespace with only loopback), for P14d.
    func reexecInPrivateNetwork() throws {
        let exe = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        var args = ["--net", "--", exe, "blob", "--size", size, "--scratch", scratch, "--in-namespace"]
        if let report { args += ["--report", report] }
        let argv = (["/usr/bin/unshare"] + args).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/usr/bin/unshare", nil, nil, argv, environ)
        guard rc == 0 else { throw BenchError("cannot run unshare: errno \(rc)") }
        guard NetBench.reap(pid).status == 0 else { throw BenchError("P14d failed") }
    }

    // MARK: The Ferry side

    /// A data directory holding one document that refers to a blob of `length` random bytes.
    struct Source {
        let data: String
        let file: String
        let length: Int64
        let id: String
        /// The blob's digest in hex.
        let hex: String

        init(root: String, length: Int64) throws {
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            let file = "\(root)/blob.bin"
            try BlobBench.writeRandomFile(file, length: length)
            try self.init(root: root, file: file, length: length)
        }

        /// Stores `file` (`ferry blob put`) and a document referring to it (`ferry put`).
        init(root: String, file: String, length: Int64) throws {
            let ferry = NetBench.ferryBinary()
            data = "\(root)/source"
            self.file = file
            self.length = length
            let ref = try NetBench.capture(ferry, ["--data", data, "blob", "put", file, "--create"]).trimmingCharacters(in: .whitespacesAndNewlines)
            guard let digest = (try? JSON.parse(Array(ref.utf8)))?["digest"]?.stringValue, digest.hasPrefix("sha256-") else {
                throw BenchError("ferry blob put printed \(ref)")
            }
            hex = String(digest.dropFirst(7))
            guard try NetBench.spawn(ferry, ["--data", data, "put", "blob-doc", #"{"file":\#(ref)}"#]).status == 0 else {
                throw BenchError("ferry put failed")
            }
            id = try NetBench.capture(ferry, ["--data", data, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        }

        func remove() {
            try? FileManager.default.removeItem(atPath: data)
            try? FileManager.default.removeItem(atPath: file)
        }
    }

    /// One pull of `source`'s blob into a fresh directory: `ferry serve` on the source,
    /// `ferry sync --pull` into `receiver`; wall time of the sync process and peak RSS of both.
    func pull(_ source: Source, into receiver: String) throws -> (seconds: Double, receiverKiB: Int, senderKiB: Int) {
        let ferry = NetBench.ferryBinary()
        defer { try? FileManager.default.removeItem(atPath: receiver) }
        let receiverID = try NetBench.capture(ferry, ["--data", receiver, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let server = try NetBench.startServe(ferry, data: source.data, trust: receiverID)
        defer { kill(server.pid, SIGKILL); _ = NetBench.reap(server.pid) }
        // Dirty pages of earlier writes (the blob file, a previous receiver) are flushed
        // first, so that this pull does not pay for them.
        sync()
        let start = ContinuousClock.now
        let r = try NetBench.spawn(ferry, ["--data", receiver, "sync", server.url, "--pin", source.id, "--pull"])
        let seconds = (ContinuousClock.now - start).seconds
        guard r.status == 0 else { throw BenchError("ferry sync --pull of the blob failed with status \(r.status)") }
        let stored = "\(receiver)/blobs/\(source.hex.prefix(2))/\(source.hex)"
        guard ((try? FileManager.default.attributesOfItem(atPath: stored))?[.size] as? NSNumber)?.int64Value == source.length else {
            throw BenchError("the receiver does not hold the whole blob after the pull")
        }
        return (seconds, r.maxRSSKiB, NetBench.peakRSS(server.pid))
    }

    // MARK: Sizes and files

    /// Writes `length` deterministic pseudo-random (incompressible) bytes, 1 MiB at a time.
    static func writeRandomFile(_ path: String, length: Int64) throws {
        guard FileManager.default.createFile(atPath: path, contents: nil), let out = FileHandle(forWritingAtPath: path) else {
            throw BenchError("cannot create \(path)")
        }
        defer { try? out.close() }
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15 &+ UInt64(length)
        var chunk = [UInt64](repeating: 0, count: 1 << 17)
        var written: Int64 = 0
        while written < length {
            for i in chunk.indices {
                state &+= 0x9E37_79B9_7F4A_7C15
                var z = state
                z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
                z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
                chunk[i] = z ^ (z >> 31)
            }
            let n = Int(min(Int64(chunk.count * 8), length - written))
            try chunk.withUnsafeBytes { try out.write(contentsOf: Data($0.prefix(n))) }
            written += Int64(n)
        }
    }

    /// "1g", "300m", "512k" or plain bytes.
    static func bytes(_ text: String) -> Int64? {
        let t = text.lowercased()
        let units: [Character: Int64] = ["k": 1 << 10, "m": 1 << 20, "g": 1 << 30]
        if let last = t.last, let unit = units[last] { return Int64(t.dropLast()).map { $0 * unit }.flatMap { $0 > 0 ? $0 : nil } }
        return Int64(t).flatMap { $0 > 0 ? $0 : nil }
    }

    /// tc's "100mbit", "500kbit", "1gbit" in bits per second.
    static func bitsPerSecond(_ text: String) -> Double? {
        let t = text.lowercased()
        for (suffix, unit) in [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)] where t.hasSuffix(suffix) {
            return Double(t.dropLast(suffix.count)).map { $0 * unit }
        }
        return nil
    }

    static func describe(_ n: Int64) -> String {
        n >= 1 << 30 && n % (1 << 30) == 0 ? "\(n >> 30) GiB" : n >= 1 << 20 ? "\(n >> 20) MiB" : "\(n) bytes"
    }

    static func mibps(_ n: Int64, _ seconds: Double) -> Double { Double(n) / 1_048_576 / seconds }
}
