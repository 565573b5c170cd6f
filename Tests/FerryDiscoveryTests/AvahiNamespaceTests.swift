import Foundation
import IntegrationHarness
import Testing

/// scripts/avahi-loopback.sh on instances of its own: the daemons run outside this network
/// namespace, and everything it started ends on `stop`, or when the watched process exits.
@Suite(.serialized, .timeLimit(.minutes(5)), .enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
struct AvahiNamespaceTests {
    func script(_ state: String, _ arguments: [String]) async throws -> Ferry.Result {
        var env = ProcessInfo.processInfo.environment
        env["FERRY_AVAHI_STATE"] = state
        return try await Shell.run([LoopbackAvahi.script] + arguments, executable: "/bin/bash", environment: env, timeout: 60)
    }

    /// The holder's, the bus's and avahi-daemon's pids, as the script recorded them.
    func recordedPIDs(_ state: String) -> [pid_t] {
        ["holder", "dbus", "avahi"].compactMap { name in
            (try? String(contentsOfFile: "\(state)/\(name).pid", encoding: .utf8)).flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }
    }

    /// Whether `pid` still runs (an exited child that nobody has reaped yet does not).
    func isRunning(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return false }
        return !stat[close...].hasPrefix(") Z")
    }

    func networkNamespace(_ pid: String) -> String? { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/ns/net") }

    @Test func stopEndsTheHolderTheBusAndAvahiDaemonInTheirOwnNamespace() async throws {
        let state = "/var/tmp/ferry-avahi-test-\(UUID().uuidString.prefix(8))"
        let started = try await script(state, ["start"])
        #expect(started.status == 0, "\(started.stderr)")
        #expect(started.stdout.contains("DBUS_SYSTEM_BUS_ADDRESS=unix:path=\(state)/system_bus_socket"))
        let pids = recordedPIDs(state)
        #expect(pids.count == 3 && pids.allSatisfy(isRunning), "\(pids)")
        let avahi = try #require(pids.last)
        #expect(networkNamespace(String(avahi)) != nil && networkNamespace(String(avahi)) != networkNamespace("self"))
        #expect(try await script(state, ["status"]).stdout == "running\n")
        #expect(try await script(state, ["stop"]).status == 0)
        #expect(!pids.contains(where: isRunning), "still running: \(pids.filter(isRunning))")
        #expect(!FileManager.default.fileExists(atPath: state))
    }

    @Test func everythingEndsWhenTheWatchedProcessExitsWithoutStopping() async throws {
        let state = "/var/tmp/ferry-avahi-test-\(UUID().uuidString.prefix(8))"
        let watched = try ChildProcess.spawn("/bin/sleep", ["600"])
        let started = try await script(state, ["start", String(watched.pid)])
        #expect(started.status == 0, "\(started.stderr)")
        let pids = recordedPIDs(state)
        #expect(pids.count == 3 && pids.allSatisfy(isRunning), "\(pids)")
        _ = await watched.stop(SIGKILL, grace: 10)
        #expect(await eventually { !pids.contains(where: isRunning) }, "still running: \(pids.filter(isRunning))")
        #expect(await eventually { !FileManager.default.fileExists(atPath: state) })
        _ = try? await script(state, ["stop"])
    }
}
