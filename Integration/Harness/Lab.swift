import Foundation

/// One host of the LAN lab: a network namespace with its own /run, D-Bus and avahi-daemon,
/// entered through its holder process.
public struct LabHost: Sendable {
    public let name: String
    public let number: Int
    public let holderPID: Int32
    /// The host's address on the lab bridge.
    public var address: String { "10.213.0.\(number)" }

    /// `nsenter` arguments that run the rest of the command line on this host.
    public var nsenterArguments: [String] { ["--target", String(holderPID), "--mount", "--net", "--"] }

    /// The environment for commands on a host: this process's, without FERRY_DATA, and
    /// without the bus address LoopbackAvahi sets (a host's daemons and clients use the bus
    /// in the host's own /run).
    public static var environment: [String: String] {
        ProcessInfo.processInfo.environment.filter { $0.key != "FERRY_DATA" && $0.key != "DBUS_SYSTEM_BUS_ADDRESS" }
    }
}

/// The LAN lab (Integration/lab/lab.sh): K hosts on one bridge, torn down by recorded pids
/// even after a failure. Needs root and `ip netns`.
public final class Lab: @unchecked Sendable {
    // @unchecked: driven by one test at a time.
    public let hosts: [LabHost]

    public static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../lab/lab.sh").standardized.path

    /// Why this machine cannot run the lab, or nil when it can.
    public static func unavailableReason() async -> String? {
        if getuid() != 0 { return "the LAN lab needs root" }
        guard (try? await Shell.bash("ip netns list"))?.status == 0 else { return "`ip netns` does not work here" }
        guard FileManager.default.isExecutableFile(atPath: "/usr/sbin/avahi-daemon") else { return "avahi-daemon is not installed" }
        return nil
    }

    /// Brings up K hosts, each with its own D-Bus and avahi-daemon unless `avahi` is false
    /// (hosts with neither, as on a minimal install).
    public init(hosts k: Int, avahi: Bool = true) async throws {
        var environment = LabHost.environment
        environment["LAB_AVAHI"] = avahi ? "1" : "0"
        let r = try await Shell.run(
            [Self.script, "up", String(k)], executable: "/bin/bash", environment: environment, timeout: 180)
        guard r.status == 0 else { throw HarnessError("lab up failed: \(r.stderr)\(r.stdout)") }
        hosts = r.stdout.split(separator: "\n").compactMap { line in
            let parts = line.split(separator: " ")
            guard parts.count == 2, let pid = Int32(parts[1]), let n = Int(parts[0].dropFirst()) else { return nil }
            return LabHost(name: String(parts[0]), number: n, holderPID: pid)
        }
        guard hosts.count == k else { throw HarnessError("lab up reported \(hosts.count) hosts: \(r.stdout)") }
    }

    /// Pulls host N's cable.
    public func partition(_ host: LabHost) async throws {
        let r = try await Shell.run([Self.script, "partition", String(host.number)], executable: "/bin/bash")
        guard r.status == 0 else { throw HarnessError("partition failed: \(r.stderr)") }
    }

    public func heal(_ host: LabHost) async throws {
        let r = try await Shell.run([Self.script, "heal", String(host.number)], executable: "/bin/bash")
        guard r.status == 0 else { throw HarnessError("heal failed: \(r.stderr)") }
    }

    /// Runs a command on a host.
    public func run(_ host: LabHost, _ command: [String]) async throws -> Ferry.Result {
        try await Shell.run(host.nsenterArguments + command, executable: "/usr/bin/nsenter", environment: LabHost.environment)
    }

    /// Kills everything the lab started and deletes its namespaces.
    public func tearDown() async {
        _ = try? await Shell.run([Self.script, "down"], executable: "/bin/bash", timeout: 120)
    }
}
