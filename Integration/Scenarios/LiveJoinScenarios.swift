import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Live writes on a formed mesh, then a join, in the LAN lab: five hosts discover each
/// other over mDNS (every node trusting every other, the sixth included), 3,000 documents of
/// about 1 KiB are written one by one through node1's admin API while the five are linked,
/// the five must reach one digest, and then a sixth host starts and must reach node1's
/// digest. Repeated on a fresh lab (`FERRY_IT_LIVE_JOIN_REPS`, default 5;
/// `FERRY_IT_LIVE_JOIN_DOCS`, default 3,000), because the fault it guards against showed in
/// most runs, not in all. Nested in `LabScenarios`, whose tests run one at a time: they share
/// the one lab.
extension LabScenarios {
    @Suite(
        .serialized, .timeLimit(.minutes(20)),
        .enabled(if: mustRunEverything, "the LAN lab needs root, `ip netns` and avahi-daemon (as root and in CI it always runs)"))
    struct LiveJoinScenarios {
        static let repetitions = ProcessInfo.processInfo.environment["FERRY_IT_LIVE_JOIN_REPS"].flatMap(Int.init).map { max(1, $0) } ?? 5
        static let documentCount = ProcessInfo.processInfo.environment["FERRY_IT_LIVE_JOIN_DOCS"].flatMap(Int.init).map { max(1, $0) } ?? 3_000
        /// How long each convergence may take on a loaded two-core machine.
        static let convergenceTimeout = 90.0

        @Test func liveWritesWhileTheMeshIsUpThenAJoinConvergeEveryTime() async throws {
            var outcomes: [String] = []
            for rep in 1...Self.repetitions {
                let started = Date()
                do {
                    let figures = try await repetition(rep)
                    outcomes.append("repetition \(rep): passed in \(seconds(since: started)) (\(figures))")
                } catch {
                    outcomes.append("repetition \(rep): FAILED after \(seconds(since: started))")
                    Issue.record("repetition \(rep) of \(Self.repetitions): \(error)")
                }
                print("LiveJoinScenarios: \(outcomes.last!)")
            }
            let passed = outcomes.filter { $0.contains("passed") }.count
            print("LiveJoinScenarios: \(passed) of \(Self.repetitions) repetitions passed\n  " + outcomes.joined(separator: "\n  "))
        }

        /// One run on a fresh lab of six hosts; returns its timings.
        func repetition(_ rep: Int) async throws -> String {
            var figures = ""
            try await withLab(6, "live writes then a join, repetition \(rep)") { lab in
                let cluster = Cluster("live-join-\(rep)")
                defer { cluster.cleanUp() }
                let nodes = (0..<6).map { cluster.add("node\($0 + 1)", host: lab.hosts[$0]) }
                let members = Array(nodes.prefix(5))
                let joiner = nodes[5]
                let ids = try await cluster.ids(nodes)
                func serve(_ i: Int) -> [String] {
                    ["--discovery", "--group", "live", "--interface", "0.0.0.0"]
                        + ids.enumerated().filter { $0.offset != i }.flatMap { ["--trust", $0.element] }
                }

                // 1. Five nodes, and a formed mesh: each linked to the four others.
                for (i, n) in members.enumerated() { try await n.start(serve(i)) }
                for (i, n) in members.enumerated() {
                    let others = Set(ids.prefix(5).enumerated().filter { $0.offset != i }.map(\.element))
                    guard try await eventually(Self.convergenceTimeout, { try await connectedTrustedPeers(n).isSuperset(of: others) }) else {
                        throw HarnessError("\(n.name) was not linked to the four other members in \(Self.convergenceTimeout) s:\n" + (await state(of: members)))
                    }
                }

                // 2. The writes, one by one, through node1 while the mesh is up.
                var mark = Date()
                let (statuses, connections) = try await putSequentially(Self.documentCount, through: nodes[0])
                #expect(statuses == ["201": Self.documentCount], "node1 answered the \(Self.documentCount) PUTs with \(statuses)")
                let writing = seconds(since: mark)

                // 3. The five reach one digest.
                mark = Date()
                guard try await sameDigest(members) else {
                    throw HarnessError(
                        "node1…node5 did not reach one digest in \(Self.convergenceTimeout) s after \(Self.documentCount) live writes:\n"
                            + (await state(of: members)))
                }
                let meshConvergence = seconds(since: mark)
                #expect(try await nodes[0].admin.get("/")["docCount"]?.intValue == Int64(Self.documentCount))

                // 4. The sixth joins and reaches node1's digest.
                mark = Date()
                try await joiner.start(serve(5))
                guard try await sameDigest([nodes[0], joiner]) else {
                    throw HarnessError(
                        "node6 did not reach node1's digest in \(Self.convergenceTimeout) s after joining:\n" + (await state(of: nodes)))
                }
                let join = seconds(since: mark)
                // Anti-entropy is the net, not the mechanism: how often it had to act is reported.
                var reconciliations = 0.0
                for n in nodes { reconciliations += (try? await n.admin.metric("ferry_reconciliations_total")) ?? 0 }
                // node1's /peers comes to say so too: every peer's reported digest equals its own
                // (reports travel in heartbeats, so this takes a beat or two).
                let allEqual = try await eventually(30, every: .milliseconds(250)) {
                    let peers = try await nodes[0].admin.get("/peers")["peers"]?.items ?? []
                    return peers.count == 5 && peers.allSatisfy { $0["digestMatches"]?.boolValue == true }
                }
                if !allEqual {
                    let dump = await state(of: nodes)
                    Issue.record("node1's /peers did not come to show every peer's digest equal:\n\(dump)")
                }
                figures = "\(Self.documentCount) PUTs over \(connections) connection(s) in \(writing), "
                    + "five converged \(meshConvergence) later, node6 joined in \(join), reconciliations \(Int(reconciliations))"
                await finish(cluster, allowing: expectedRefusals)
            }
            return figures
        }

        /// Whether `nodes` reach one digest within the convergence timeout.
        func sameDigest(_ nodes: [Node]) async throws -> Bool {
            try await eventually(Self.convergenceTimeout, every: .milliseconds(250)) {
                var digests = Set<String>()
                for n in nodes { digests.insert(try await n.admin.digest) }
                return digests.count == 1
            }
        }

        /// PUTs `count` documents `d000000`, `d000001`, … (`{"type":"item","pad":"x…x"}`,
        /// about 1 KiB) one after another through `node`'s admin API on its lab host: one curl
        /// walking its own URL range, so one keep-alive connection when the API keeps it open
        /// (the key on stdin, as AdminClient passes it). Returns how many PUTs got each HTTP
        /// status, and how many connections curl opened.
        func putSequentially(_ count: Int, through node: Node) async throws -> (statuses: [String: Int], connections: Int) {
            guard let host = node.host, let key = node.adminKey else { throw HarnessError("\(node.name) is not a running lab node") }
            let body = #"{"type":"item","pad":"\#(String(repeating: "x", count: 900))"}"#
            let range = "d[000000-\(String(format: "%06d", count - 1))]"
            let r = try await Shell.run(
                host.nsenterArguments + [
                    "curl", "-s", "-m", "60", "-X", "PUT", "-H", "@-", "-H", "Content-Type: application/json",
                    "--data-binary", body, "-w", "\\n%{http_code} %{num_connects}\\n", node.admin.base + "/docs/" + range,
                ],
                executable: "/usr/bin/nsenter", stdin: "Authorization: Bearer \(key)\n", environment: LabHost.environment, timeout: 600)
            var statuses: [String: Int] = [:]
            var connections = 0
            for line in r.stdout.split(separator: "\n") {
                let parts = line.split(separator: " ")
                guard parts.count == 2, parts[0].count == 3, parts[0].allSatisfy(\.isNumber), let opened = Int(parts[1]) else { continue }
                statuses[String(parts[0]), default: 0] += 1
                connections += opened
            }
            if statuses.values.reduce(0, +) != count {
                throw HarnessError("curl made \(statuses.values.reduce(0, +)) of \(count) PUTs (exit \(r.status)): \(r.stderr.suffix(500))")
            }
            return (statuses, connections)
        }

        /// Each node's document count and digest, and its `/peers`: one line per peer with its
        /// link state and both directions' replication status and counters.
        func state(of nodes: [Node]) async -> String {
            var ids: [String: String] = [:]
            for n in nodes { if let id = try? await n.id { ids[id] = n.name } }
            var lines: [String] = []
            for n in nodes {
                guard n.isRunning, let info = try? await n.admin.get("/") else {
                    lines.append("\(n.name): not answering (running: \(n.isRunning))")
                    continue
                }
                lines.append(
                    "\(n.name): \(info["docCount"]?.intValue.map(String.init) ?? "?") docs, digest \(info["digest"]?.stringValue ?? "?")")
                guard let peers = try? await n.admin.get("/peers")["peers"]?.items else {
                    lines.append("  /peers: no answer")
                    continue
                }
                for p in peers {
                    let id = p["id"]?.stringValue ?? "?"
                    var line = "  \(ids[id] ?? String(id.prefix(12))): " + ["trusted", "connected", "dialled", "direction", "source", "digestMatches"]
                        .map { "\($0)=\(text(p[$0]))" }.joined(separator: " ")
                    for key in ["replication", "inbound"] { if let s = p[key] { line += "; \(key) " + describe(s) } }
                    lines.append(line)
                }
            }
            return lines.joined(separator: "\n")
        }

        func describe(_ status: JSON) -> String {
            let fields = ["direction", "activity", "completed", "total", "pushed", "pulled", "rejected", "conflicts", "bytesSent", "bytesReceived", "error", "errorCode"]
            return fields.compactMap { f in
                guard let v = status[f], v != .null else { return nil }
                return "\(f)=\(text(v))"
            }.joined(separator: " ")
        }

        func text(_ value: JSON?) -> String {
            guard let value, value != .null else { return "-" }
            return value.stringValue ?? value.canonicalString
        }

        func seconds(since start: Date) -> String { String(format: "%.1f s", Date().timeIntervalSince(start)) }
    }
}
