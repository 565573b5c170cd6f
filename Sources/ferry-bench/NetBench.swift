import ArgumentParser
import FerryCore
import FerryStore
import FerrySync
import FerryTransport
import Foundation
import Logging

/// Two `ferry` processes over TLS WebSocket on loopback, pulling documents, against a raw
/// TLS WebSocket one-way stream of the same bytes and a raw SQLite insert, in the same run.
struct NetBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "net",
        abstract: "Pull throughput between two ferry processes over TLS WebSocket (targets: ≥0.5 of raw TLS WS, ≥0.3 of raw insert).")

    @OptionGroup var workload: Workload

    func run() async throws {
        let ferry = Self.ferryBinary()
        let docs = DocumentGenerator(size: workload.size).documents(workload.count)
        let bodies = docs.map { $0.1.canonicalBytes }
        let totalBytes = bodies.reduce(0) { $0 + $1.count }
        let root = (workload.scratch as NSString).appendingPathComponent("ferry-net-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        print("net: \(workload.count) documents of ~\(totalBytes / max(1, workload.count)) bytes, \(workload.runs) runs, TLS 1.3 WebSocket on loopback")

        // The source node, filled once (not timed).
        let source = "\(root)/source"
        try DocumentGenerator(size: workload.size).writeNDJSON(workload.count, to: "\(root)/docs.ndjson")
        _ = try Self.spawn(ferry, ["--data", source, "import", "\(root)/docs.ndjson", "--batch-size", "10000", "--create"])
        let clientTemplate = "\(root)/client-id"
        let clientID = try Self.capture(ferry, ["--data", clientTemplate, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let sourceID = try Self.capture(ferry, ["--data", source, "id"]).trimmingCharacters(in: .whitespacesAndNewlines)

        var ferryRates: [Double] = []
        var rawWS: [Double] = []
        var rawSQL: [Double] = []
        var serverRSS: [Int] = []
        var clientRSS: [Int] = []
        var cpuPerDoc: [(server: Double, client: Double)] = []
        for run in 1...workload.runs {
            rawSQL.append(try RawSQLite.insert(docs.map(\.0.rawValue), bodies, scratch: try scratchDir(root)))
            rawWS.append(try await rawWebSocketStream(bodies: bodies, root: root))
            // Start the server process and wait for node.json.
            let server = try Self.startServe(ferry, data: source, trust: clientID)
            defer { kill(server.pid, SIGKILL); _ = Self.reap(server.pid) }
            let client = try Self.makeReceiver("\(root)/client-\(run)", identityFrom: clientTemplate)
            let serverCPUBefore = Self.cpuMilliseconds(server.pid)
            let start = ContinuousClock.now
            let result = try Self.spawn(ferry, ["--data", client, "sync", server.url, "--pin", sourceID, "--pull", "--json"])
            let elapsed = ContinuousClock.now - start
            guard result.status == 0 else { throw BenchError("ferry sync failed with status \(result.status)") }
            // Microseconds of CPU per document on each side (the client's whole run, its
            // start-up included; the server's over the same span).
            let n = Double(workload.count)
            cpuPerDoc.append((server: (Self.cpuMilliseconds(server.pid) - serverCPUBefore) * 1000 / n, client: result.cpuMilliseconds * 1000 / n))
            ferryRates.append(Double(workload.count) / elapsed.seconds)
            clientRSS.append(result.maxRSSKiB)
            serverRSS.append(Self.peakRSS(server.pid))
            try? FileManager.default.removeItem(atPath: client)
        }
        let f = Stats(ferryRates)
        let w = Stats(rawWS)
        let s = Stats(rawSQL)
        let mib = Double(totalBytes) / 1_048_576
        let perDoc = Double(totalBytes) / Double(workload.count)
        print(String(format: "raw TLS WebSocket stream %9.0f docs/s  %6.1f MiB/s (min %.0f, max %.0f)", w.median, w.median * perDoc / 1_048_576, w.min, w.max))
        print(String(format: "raw SQLite insert        %9.0f docs/s (min %.0f, max %.0f)", s.median, s.min, s.max))
        print(String(format: "ferry pull over TLS WS   %9.0f docs/s  %6.1f MiB/s (min %.0f, max %.0f); %.1f MiB total", f.median, f.median * perDoc / 1_048_576, f.min, f.max, mib))
        let rw = Stats(zip(ferryRates, rawWS).map { $0 / $1 })
        let rs = Stats(zip(ferryRates, rawSQL).map { $0 / $1 })
        print(String(format: "ratio ferry/raw TLS WS   %9.2f (min %.2f, max %.2f)  target >= 0.50  %@", rw.median, rw.min, rw.max, rw.median >= 0.5 ? "HOLDS" : "MISSES"))
        print(String(format: "ratio ferry/raw insert   %9.2f (min %.2f, max %.2f)  target >= 0.30  %@", rs.median, rs.min, rs.max, rs.median >= 0.3 ? "HOLDS" : "MISSES"))
        let cpu = Stats(cpuPerDoc.map { $0.server + $0.client })
        let cpuServer = Stats(cpuPerDoc.map(\.server))
        let cpuClient = Stats(cpuPerDoc.map(\.client))
        print(String(format: "CPU per document         %9.1f us (server %.1f, client %.1f; min %.1f, max %.1f)  target <= 20  %@",
                     cpu.median, cpuServer.median, cpuClient.median, cpu.min, cpu.max, cpu.median <= 20 ? "HOLDS" : "MISSES"))
        print("peak RSS: server \(serverRSS.max()! / 1024) MiB, client \(clientRSS.max()! / 1024) MiB")
        if let report = workload.report {
            try BenchReport.record([
                Figure(
                    id: "P1", name: "Bulk pull throughput over TLS WebSocket, relative to a raw TLS WebSocket stream of the same bytes",
                    value: f.median, unit: "docs/s", baseline: w.median, ratio: rw.median, target: ">= 0.5",
                    holds: rw.median >= 0.5, runs: zip(ferryRates, rawWS).map { ($0, $1, $0 / $1) }),
                Figure(
                    id: "P1-insert", name: "Bulk pull throughput over TLS WebSocket, relative to raw prepared SQLite inserts",
                    value: f.median, unit: "docs/s", baseline: s.median, ratio: rs.median, target: ">= 0.3",
                    holds: rs.median >= 0.3, runs: zip(ferryRates, rawSQL).map { ($0, $1, $0 / $1) }),
                Figure(
                    id: "P1-cpu", name: "Bulk pull: CPU per document, serving node and pulling client together",
                    value: cpu.median, unit: "us/doc", baseline: nil, ratio: cpu.median / 20, target: "<= 20",
                    holds: cpu.median <= 20, runs: cpuPerDoc.map { ($0.server + $0.client, nil, ($0.server + $0.client) / 20) }),
            ], in: report)
        }
    }

    func scratchDir(_ root: String) throws -> String { try makeScratchDirectory(in: root, prefix: "raw") }

    /// Streams the same bytes one way over TLS WebSocket (64 KiB messages) between two
    /// in-process endpoints on loopback; returns documents per second.
    func rawWebSocketStream(bodies: [[UInt8]], root: String) async throws -> Double {
        let total = bodies.reduce(0) { $0 + $1.count }
        let received = AsyncStream<Int>.makeStream()
        let raw = try await RawWebSocket.start(root: root, name: "raw") { endpoint in
            var n = 0
            do { for try await m in endpoint.incoming { n += m.count; if n >= total { break } } } catch {}
            received.continuation.yield(n)
        }
        defer { raw.stop() }
        let start = ContinuousClock.now
        let endpoint = try await raw.connect()
        var chunk: [UInt8] = []
        chunk.reserveCapacity(70_000)
        for b in bodies {
            chunk.append(contentsOf: b)
            if chunk.count >= 65_536 {
                try await endpoint.send(chunk)
                chunk.removeAll(keepingCapacity: true)
            }
        }
        if !chunk.isEmpty { try await endpoint.send(chunk) }
        var it = received.stream.makeAsyncIterator()
        _ = await it.next()
        let elapsed = ContinuousClock.now - start
        await endpoint.close(error: nil)
        return Double(bodies.count) / elapsed.seconds
    }

    static func ferryBinary() -> String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        return ((exe as NSString).deletingLastPathComponent as NSString).appendingPathComponent("ferry")
    }

    /// A finished child process: exit status and peak resident memory.
    struct Spawned {
        let status: Int32
        let maxRSSKiB: Int
        /// User plus system CPU time of the whole run, in milliseconds (wait4's rusage).
        var cpuMilliseconds: Double = 0
    }

    /// Runs a process to completion, returning its exit status and peak RSS.
    static func spawn(_ path: String, _ args: [String], stdout: Int32 = -1) throws -> Spawned {
        let pid = try launch(path, args, quiet: true)
        return reap(pid)
    }

    static func launch(_ path: String, _ args: [String], quiet: Bool, output: String? = nil) throws -> pid_t {
        var actions: posix_spawn_file_actions_t = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, output ?? "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let argv = ([path] + args).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, nil, argv, environ)
        guard rc == 0 else { throw BenchError("cannot run \(path): errno \(rc)") }
        Profiler.attach(to: pid, path: path, args: args)
        return pid
    }

    /// Waits for a child, sampling its VmHWM while it runs. (wait4's ru_maxrss is not used:
    /// a child made by posix_spawn is charged the parent's resident memory at spawn time.)
    static func reap(_ pid: pid_t) -> Spawned {
        var status: Int32 = 0
        var peak = 0
        var usage = rusage()
        while wait4(pid, &status, WNOHANG, &usage) == 0 {
            peak = max(peak, peakRSS(pid))
            usleep(20_000)
        }
        let exit = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
        func ms(_ t: timeval) -> Double { Double(t.tv_sec) * 1000 + Double(t.tv_usec) / 1000 }
        return Spawned(status: exit, maxRSSKiB: peak, cpuMilliseconds: ms(usage.ru_utime) + ms(usage.ru_stime))
    }

    static func capture(_ path: String, _ args: [String]) throws -> String {
        let out = NSTemporaryDirectory() + "ferry-bench-\(UUID().uuidString).out"
        defer { try? FileManager.default.removeItem(atPath: out) }
        let pid = try launch(path, args, quiet: true, output: out)
        _ = reap(pid)
        return (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
    }

    static func startServe(_ ferry: String, data: String, trust: String) throws -> (pid: pid_t, url: String) {
        try? FileManager.default.removeItem(atPath: "\(data)/node.json")
        let pid = try launch(
            ferry, ["--data", data, "serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--no-discovery", "--interface", "127.0.0.1", "--trust", trust],
            quiet: true)
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if let d = FileManager.default.contents(atPath: "\(data)/node.json"), let info = try? JSON.parse(Array(d)),
                info["pid"]?.intValue == Int64(pid), let url = info["url"]?.stringValue
            {
                return (pid, url)
            }
            usleep(20_000)
        }
        throw BenchError("ferry serve did not become ready")
    }

    /// An empty data directory at `path` that reuses the identity in `template` (so the
    /// serving node trusts it); returns `path`.
    static func makeReceiver(_ path: String, identityFrom template: String) throws -> String {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: "\(template)/identity", toPath: "\(path)/identity")
        return path
    }

    /// Waits until `dir/node.json` names `pid` (the node is ready) and returns it.
    static func waitForNodeFile(_ dir: String, pid: pid_t) async throws -> JSON {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if let d = FileManager.default.contents(atPath: "\(dir)/node.json"), let info = try? JSON.parse(Array(d)),
                info["pid"]?.intValue == Int64(pid)
            {
                AdminKeys.shared.register(info)
                return info
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw BenchError("ferry serve in \(dir) did not become ready")
    }

    /// User plus system CPU time a running process has used so far, in milliseconds
    /// (utime and stime of /proc/PID/stat, in clock ticks).
    static func cpuMilliseconds(_ pid: pid_t) -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return 0 }
        // Fields after the command name, which may itself hold spaces: state is field 3,
        // utime 14 and stime 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) * 1000 / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// VmHWM of a running process, in KiB.
    static func peakRSS(_ pid: pid_t) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
        for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
        }
        return 0
    }
}

/// A raw TLS 1.3 WebSocket listener and a pinned client on loopback, without the protocol:
/// the same-run baseline for the network benchmarks.
struct RawWebSocket {
    let listener: WebSocketListener
    let serving: Task<Void, any Error>
    let connector: WebSocketConnector

    static func start(root: String, name: String, serve: @escaping @Sendable (any MessageEndpoint) async -> Void) async throws -> RawWebSocket {
        let serverID = try NodeIdentity.loadOrCreate(directory: "\(root)/\(name)-server")
        let clientID = try NodeIdentity.loadOrCreate(directory: "\(root)/\(name)-client")
        var config = WebSocketListener.Configuration()
        config.host = "127.0.0.1"
        config.port = 0
        config.authentication = .mutualTLS(.pinned([clientID.nodeID]))
        var quiet = Logger(label: "bench")
        quiet.logLevel = .error
        let listener = WebSocketListener(identity: serverID, configuration: config, logger: quiet) { endpoint, _ in await serve(endpoint) }
        let serving = Task { try await listener.run() }
        let port = try await listener.waitUntilBound()
        var connector = try WebSocketConnector(url: "wss://127.0.0.1:\(port)/ferry/sync", serverTrust: .pinned([serverID.nodeID]), identity: clientID)
        connector.logger = quiet
        return RawWebSocket(listener: listener, serving: serving, connector: connector)
    }

    func connect() async throws -> any MessageEndpoint { try await connector.connect() }

    func stop() {
        serving.cancel()
        listener.stop()
    }
}

/// With `FERRY_BENCH_PROFILE=DIR` (set by `make profile`, which samples the whole machine
/// while the benchmark runs), every `ferry` process a benchmark starts, directly or through
/// `nsenter`, is listed in `DIR/pids` as `PID ROLE`, ROLE being its subcommand (`serve`,
/// `sync`, …), so that each side's samples can be told apart.
enum Profiler {
    static let directory = ProcessInfo.processInfo.environment["FERRY_BENCH_PROFILE"].flatMap { $0.isEmpty ? nil : $0 }

    static func attach(to pid: pid_t, path: String, args: [String]) {
        guard let directory else { return }
        let command = [path] + args
        guard let at = command.firstIndex(where: { $0.hasSuffix("/ferry") || $0 == "ferry" }) else { return }
        var role = "ferry"
        var rest = command[(at + 1)...].makeIterator()
        while let arg = rest.next() {
            if arg == "--data" {
                _ = rest.next()
                continue
            }
            if !arg.hasPrefix("-") {
                role = arg
                break
            }
        }
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let line = Array("\(pid) \(role)\n".utf8)
        let fd = open("\(directory)/pids", O_WRONLY | O_CREAT | O_APPEND, 0o644)
        guard fd >= 0 else { return }
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}
