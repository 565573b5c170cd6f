import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// `ferry` blocks SIGTERM and SIGINT in every thread from its first line and reads them
/// itself; no command may become unkillable by that, and nothing it starts inherits the mask.
@Suite(.serialized, .timeLimit(.minutes(10))) struct SignalCLITests {
    /// Whether one of `pid`'s threads waits in read(2) on its standard input (x86-64: syscall 0, fd 0).
    func isReadingStandardInput(_ pid: pid_t) -> Bool {
        let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return threads.contains { tid in
            let call = (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/syscall", encoding: .utf8)) ?? ""
            return call.hasPrefix("0 0x0 ")
        }
    }

    /// Whether `pid` holds a second descriptor of `path` (as `serve --stdio` does, to read its
    /// standard input through NIO).
    func holdsAnotherDescriptor(of path: String, _ pid: pid_t) -> Bool {
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
        return fds.contains { fd in
            (Int(fd) ?? 0) > 2 && (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(fd)")) == path
        }
    }

    /// A signal set of `pid`'s main thread from /proc/PID/status (`SigBlk`, `SigIgn`).
    func signalSet(_ field: String, _ pid: pid_t) -> UInt64? {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }) else { return nil }
        return UInt64(line.dropFirst(field.count + 1).trimmingCharacters(in: .whitespaces), radix: 16)
    }

    func blockedSignals(_ pid: pid_t) -> UInt64? { signalSet("SigBlk", pid) }
    func ignoredSignals(_ pid: pid_t) -> UInt64? { signalSet("SigIgn", pid) }

    func mask(_ sig: Int32) -> UInt64 { 1 << UInt64(sig - 1) }

    @Test(arguments: [["import", "-"], ["put", "waiting"], ["serve", "--stdio", "--no-discovery"]])
    func aCommandWaitingOnItsInputEndsOnSIGTERMAndSIGINTAsTheDefaultActionWould(_ command: [String]) async throws {
        for sig in [SIGTERM, SIGINT] {
            let cli = FerryCLI()
            defer { cli.cleanUp() }
            try await cli.run(["id"])
            // Standard input is a FIFO this test holds open and never writes: the command waits.
            let fifo = cli.dataDirectory + ".in"
            #expect(mkfifo(fifo, 0o600) == 0)
            let writer = open(fifo, O_RDWR)
            defer {
                close(writer)
                unlink(fifo)
            }
            let log = cli.dataDirectory + ".log"
            defer { try? FileManager.default.removeItem(atPath: log) }
            let p = try ChildProcess.spawn(
                FerryCLI.binary, command + ["--data", cli.dataDirectory], stdinPath: fifo, stdoutPath: log, stderrPath: log)
            #expect(await eventually(30, every: .milliseconds(5)) { isReadingStandardInput(p.pid) || holdsAnotherDescriptor(of: fifo, p.pid) || !p.isRunning })
            // Its main thread keeps the signals blocked; they are read, not delivered there.
            if let blocked = blockedSignals(p.pid) {
                #expect(blocked & mask(SIGTERM) != 0 && blocked & mask(SIGINT) != 0, "SigBlk \(String(blocked, radix: 16))")
            }
            let sent = ContinuousClock.now
            p.signal(sig)
            let status = await p.wait(timeout: 10)
            if status == nil { p.signal(SIGKILL) }
            let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            #expect(status == 128 + sig, "\(command) on signal \(sig): \(status.map(String.init) ?? "still running 10 s later") \(output)")
            print("\(command.joined(separator: " ")): signal \(sig) ended it in \(ContinuousClock.now - sent)")
        }
    }

    @Test func aSyncExecCommandStartsWithSIGTERMAndSIGINTNeitherIgnoredNorBlocked() async throws {
        // The child prints its own signal masks; `ferry sync` used SIG_IGN, which children inherit.
        let cli = FerryCLI()
        defer { cli.cleanUp() }
        let r = try await cli.run(["sync", "--exec", "grep -E '^Sig(Ign|Blk)' /proc/self/status >&2"], timeout: 30)
        var fields: [String: UInt64] = [:]
        for line in r.stderr.split(separator: "\n") where line.hasPrefix("Sig") {
            let parts = line.split(separator: ":").map { $0.trimmingCharacters(in: .whitespaces) }
            if parts.count == 2, let value = UInt64(parts[1], radix: 16) { fields[parts[0], default: 0] |= value }
        }
        let ignored = try #require(fields["SigIgn"], "\(r.stderr)")
        let blocked = try #require(fields["SigBlk"], "\(r.stderr)")
        for sig in [SIGTERM, SIGINT] {
            #expect(ignored & mask(sig) == 0, "signal \(sig) ignored in the child: SigIgn \(String(ignored, radix: 16))")
            #expect(blocked & mask(sig) == 0, "signal \(sig) blocked in the child: SigBlk \(String(blocked, radix: 16))")
        }
    }

    @Test func watchEndsCleanlyOnSIGTERMAndSIGINT() async throws {
        for sig in [SIGTERM, SIGINT] {
            let cli = FerryCLI()
            defer { cli.cleanUp() }
            try await cli.run(["put", "a", "{}"])
            let out = cli.dataDirectory + ".out"
            defer { try? FileManager.default.removeItem(atPath: out) }
            let p = try ChildProcess.spawn(FerryCLI.binary, ["watch", "--data", cli.dataDirectory], stdoutPath: out)
            // Watching: a later write shows up in its output (flushed per change).
            let database = cli.dataDirectory + "/ferry.sqlite"
            #expect(await eventually(30, every: .milliseconds(5)) { holdsAnotherDescriptor(of: database, p.pid) || !p.isRunning })
            try await cli.run(["put", "later", "{}"])
            #expect(await eventually(30) { ((try? String(contentsOfFile: out, encoding: .utf8)) ?? "").contains("later") })
            let sent = ContinuousClock.now
            p.signal(sig)
            let status = await p.wait(timeout: 10)
            if status == nil { p.signal(SIGKILL) }
            #expect(status == 0, "watch on signal \(sig): \(status.map(String.init) ?? "still running 10 s later")")
            print("watch: signal \(sig) ended it in \(ContinuousClock.now - sent)")
        }
    }

    @Test func serveStopsGracefullyOnASignalThatComesBeforeItHasParsedItsArguments() async throws {
        for sig in [SIGTERM, SIGINT] {
            let cli = FerryCLI()
            defer { cli.cleanUp() }
            let log = cli.dataDirectory + ".log"
            defer { try? FileManager.default.removeItem(atPath: log) }
            let p = try ChildProcess.spawn(
                FerryCLI.binary,
                ["serve", "--port", "0", "--admin-port", "0", "--couch-port", "0", "--interface", "127.0.0.1", "--no-discovery", "--data", cli.dataDirectory],
                stdoutPath: log, stderrPath: log)
            // The signal comes as soon as the process blocks it: before parsing, before any
            // handler, before the node exists.
            #expect(await eventually(30, every: .milliseconds(1)) {
                blockedSignals(p.pid).map { $0 & mask(SIGTERM) != 0 && $0 & mask(SIGINT) != 0 } ?? !p.isRunning
            }, "the process never blocked SIGTERM and SIGINT")
            p.signal(sig)
            let status = await p.wait(timeout: 30)
            if status == nil { p.signal(SIGKILL) }
            let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            #expect(status == 0, "signal \(sig): \(status.map(String.init) ?? "still running 30 s later") \(output)")
            #expect(!FileManager.default.fileExists(atPath: cli.dataDirectory + "/node.json"))
        }
    }
}
