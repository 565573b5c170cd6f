import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Real `ferry serve` nodes with DNS-SD on, against the test run's own avahi-daemon
/// (LoopbackAvahi, held alone), while avahi-daemon is killed (SIGKILL or SIGTERM, alone or
/// together with its D-Bus) at random points of the nodes' start, run and stop. No node may
/// die of a signal or print a crash, and a node that runs on finds the daemon again.
@Suite(.serialized, .timeLimit(.minutes(10)), .enabled(if: mustRunEverything, "needs root for its own avahi-daemon"))
struct DiscoveryFaultScenarios {
    enum Fault: CaseIterable, CustomStringConvertible {
        case killDaemon, terminateDaemon, killDaemonAndBus
        var description: String {
            switch self {
            case .killDaemon: "SIGKILL avahi-daemon"
            case .terminateDaemon: "SIGTERM avahi-daemon"
            case .killDaemonAndBus: "SIGKILL avahi-daemon and D-Bus"
            }
        }
    }

    /// In this order over the rounds, so that rounds 0–2 and 9–11 hit the nodes running.
    enum Phase: CaseIterable, CustomStringConvertible {
        /// Once each node has discovered the others (resolves and record queries open).
        case run
        /// While the nodes start (before or after they are ready).
        case start
        /// While the nodes stop after SIGTERM.
        case stop
        var description: String {
            switch self {
            case .start: "start"
            case .run: "run"
            case .stop: "stop"
            }
        }
    }

    static let rounds = 12
    static let nodesPerRound = 3

    func inject(_ fault: Fault) async {
        switch fault {
        case .killDaemon, .terminateDaemon:
            guard let avahi = LoopbackAvahi.recordedPID("avahi") else { return }
            kill(avahi, fault == .killDaemon ? SIGKILL : SIGTERM)
        case .killDaemonAndBus:
            // What a machine's shutdown does: both go at once.
            for name in ["avahi", "dbus"] { if let pid = LoopbackAvahi.recordedPID(name) { kill(pid, SIGKILL) } }
        }
    }

    /// Brings the daemon (and its bus) back after `fault`; nil when it runs again.
    func recover(from fault: Fault) async -> String? {
        if let avahi = LoopbackAvahi.recordedPID("avahi") { _ = await eventually(10, every: .milliseconds(20)) { LoopbackAvahi.hasExited(avahi) } }
        switch fault {
        case .killDaemon, .terminateDaemon:
            return await LoopbackAvahi.startDaemon()
        case .killDaemonAndBus:
            // A new namespace with a new bus at the same socket path; it still ends with this process.
            var env = ProcessInfo.processInfo.environment
            env["FERRY_AVAHI_STATE"] = LoopbackAvahi.state
            let r = try? await Shell.run(
                [LoopbackAvahi.script, "start", String(getpid())], executable: "/bin/bash", environment: env, timeout: 60)
            return r?.status == 0 ? nil : "restart failed: \(r.map { $0.stderr + $0.stdout } ?? "cannot run the script")"
        }
    }

    /// Every `.dns-sd` peer a node lists.
    func discoveredPeers(_ node: Node) async -> Set<String> {
        guard case .array(let list)? = try? await node.admin.get("/peers")["peers"] else { return [] }
        return Set(list.compactMap { $0["source"] == "dns-sd" ? $0["id"]?.stringValue : nil })
    }

    /// Lines that show a node crashed rather than stopped.
    func crashLines(_ node: Node) -> [String] {
        node.log.split(separator: "\n").map(String.init).filter {
            $0.contains("Program crashed") || $0.contains("Segmentation fault") || $0.contains("Fatal error")
                || $0.contains("Bad pointer dereference")
        }
    }

    @Test func avahiDaemonKilledAtRandomPointsOfStartRunAndStopCrashesNoNode() async throws {
        try await LoopbackAvahi.withDaemon(exclusive: true) { why in
            if let why {
                Issue.record("the test run's avahi-daemon did not start: \(why)")
                return
            }
            let cluster = Cluster("discovery-faults")
            defer { cluster.cleanUp() }
            let config = cluster.root + "/discovery.json"
            // Retries start at 1 s (and back off from there), so recovery fits a round.
            try #"{"discovery":{"enabled":true,"retrySeconds":1}}"#.write(toFile: config, atomically: true, encoding: .utf8)
            var generator = SystemRandomNumberGenerator()
            var crashed: [String] = []
            for round in 0..<Self.rounds {
                let fault = Fault.allCases[round % Fault.allCases.count]
                let phase = Phase.allCases[(round / Fault.allCases.count) % Phase.allCases.count]
                let group = "faults\(round)-\(UInt32.random(in: 0...UInt32.max))"
                let nodes = (0..<Self.nodesPerRound).map { cluster.add("r\(round)n\($0)") }
                let label = "round \(round) (\(fault) during \(phase))"
                let args = ["--discovery", "--config", config, "--group", group]
                try await withThrowingTaskGroup(of: Void.self) { starts in
                    for node in nodes { starts.addTask { try await node.start(args) } }
                    if phase == .start {
                        try await Task.sleep(for: .milliseconds(Int.random(in: 0...1500, using: &generator)))
                        await inject(fault)
                    }
                    try await starts.waitForAll()
                }
                if phase == .run {
                    let ids = try await cluster.ids(nodes)
                    let found = await eventually(30) {
                        for (node, id) in zip(nodes, ids) {
                            guard Set(ids).subtracting([id]).isSubset(of: await discoveredPeers(node)) else { return false }
                        }
                        return true
                    }
                    #expect(found, "\(label): the nodes did not discover each other")
                    try await Task.sleep(for: .milliseconds(Int.random(in: 0...500, using: &generator)))
                    await inject(fault)
                }
                var statuses: [Int32] = []
                if phase == .stop {
                    let delay = Int.random(in: 0...150, using: &generator)
                    statuses = try await withThrowingTaskGroup(of: (Int, Int32).self) { stops in
                        for (i, node) in nodes.enumerated() { stops.addTask { (i, await node.stop(grace: 20)) } }
                        try await Task.sleep(for: .milliseconds(delay))
                        await inject(fault)
                        var byIndex: [Int: Int32] = [:]
                        for try await (i, status) in stops { byIndex[i] = status }
                        return nodes.indices.map { byIndex[$0] ?? -1 }
                    }
                }
                let restarted = await recover(from: fault)
                #expect(restarted == nil, "\(label): \(restarted ?? "")")
                if phase != .stop {
                    // A running node finds the daemon again by itself.
                    let back = await eventually(30) { nodes.allSatisfy { $0.log.contains("DNS-SD available again") || !$0.isRunning } }
                    #expect(back, "\(label): a node did not report DNS-SD available again:\n\(nodes.map { $0.logTail(15) }.joined(separator: "\n"))")
                    for node in nodes { statuses.append(await node.stop(grace: 20)) }
                }
                for (node, status) in zip(nodes, statuses) {
                    let lines = crashLines(node)
                    if status > 128 || !lines.isEmpty { crashed.append("\(label) \(node.name): exit \(status)") }
                    #expect(status == 0, "\(label): \(node.name) exited \(status):\n\(node.logTail(60))")
                    #expect(lines.isEmpty, "\(label): \(node.name) crashed:\n\(node.logTail(60))")
                }
            }
            #expect(crashed.isEmpty, "nodes that died of a signal: \(crashed)")
        }
    }
}
