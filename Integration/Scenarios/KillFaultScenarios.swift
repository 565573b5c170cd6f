import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Scenario 30: a pulling `ferry sync` killed with SIGKILL again and again at random points of
/// a large pull and of a large blob's transfer, each time started again, until one run
/// completes: nothing is lost, the store stays sound, and each kill costs at most the batches
/// in flight (documents) or one partial-file checkpoint (blob bytes) of traffic sent again.
@Suite(.serialized, .timeLimit(.minutes(30))) struct KillFaultScenarios {
    static let environment = ProcessInfo.processInfo.environment
    /// How many kills each scenario aims for (`make soak`: 100).
    static let targetKills = environment["FERRY_IT_KILLS"].flatMap(Int.init) ?? 12
    /// Documents in the pulled database (`make soak`: 100,000).
    static let documents = environment["FERRY_IT_KILL_DOCS"].flatMap(Int.init) ?? 20_000
    /// The replicator's changes page: what one checkpoint covers.
    static let batch = 1000

    @Test func aPullKilledAtRandomPointsLosesNothingAndResendsAtMostTheBatchesInFlightPerKill() async throws {
        let cluster = Cluster("kill-pull")
        defer { cluster.cleanUp() }
        let (a, b, c) = (cluster.add("a"), cluster.add("b"), cluster.add("c"))
        let (idA, idB, idC) = (try await a.id, try await b.id, try await c.id)
        let input = cluster.root + "/docs.ndjson"
        var text = ""
        text.reserveCapacity(Self.documents * 120)
        for i in 0..<Self.documents {
            text += #"{"_id":"d\#(String(format: "%07d", i))","n":\#(i),"note":"row \#(i) of a pull killed at random points"}"# + "\n"
        }
        #expect(FileManager.default.createFile(atPath: input, contents: Data(text.utf8)))
        let imported = try await Ferry.run(["--data", a.dataDirectory, "import", input], timeout: 600)
        #expect(imported.status == 0, "\(imported.stderr)")
        try await a.start(["--trust", idB, "--trust", idC])
        let sync = { (node: Node) in ["--data", node.dataDirectory, "sync", a.url, "--pin", idA, "--pull"] }

        let (cleanTime, cleanBytes, noopTime, noopBytes) = try await Self.baseline(a, sync(c))
        let killed = try await Self.killRepeatedly(sync(b), cluster: cluster, source: a, cleanTime: cleanTime, noopTime: noopTime)

        // A kill loses the page being inserted (its checkpoint not yet saved; small documents
        // travel inline in the changes page, so the page comes again whole) and the page
        // asked for ahead of it, plus the run's handshake.
        let resent = killed.bytes - cleanBytes
        let batchBytes = cleanBytes * Double(Self.batch) / Double(Self.documents)
        let allowed = Double(killed.kills) * (2 * batchBytes + noopBytes) + noopBytes
        print(
            "kill-pull: \(Self.documents) documents, \(killed.kills) SIGKILLs in \(killed.runs) runs; clean pull \(f(cleanTime)) s, "
                + "\(Int(cleanBytes)) bytes; sent again \(Int(resent)) bytes = \(f(resent / batchBytes)) batches "
                + "(\(f(resent / batchBytes / Double(max(killed.kills, 1)))) a kill; allowed 2 batches and 1 handshake a kill)")
        #expect(killed.kills >= 1, "no run was killed: the pull finished before any kill")
        #expect(resent <= allowed, "sent again \(Int(resent)) bytes for \(killed.kills) kills, allowed \(Int(allowed))")

        let check = try await Ferry.run(["--data", b.dataDirectory, "check"])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        try await b.start()
        try await cluster.awaitConvergence(among: [a, b], timeout: 30)
        #expect(try await b.admin.get("/")["docCount"]?.intValue == Int64(Self.documents))
        await finish(cluster)
    }

    @Test func aBlobPullKilledAtRandomPointsArrivesWholeAndResendsAtMostACheckpointPerKill() async throws {
        let cluster = Cluster("kill-blob")
        defer { cluster.cleanUp() }
        let (a, b, c) = (cluster.add("a"), cluster.add("b"), cluster.add("c"))
        let (idA, idB, idC) = (try await a.id, try await b.id, try await c.id)
        let length = 160 << 20
        let file = cluster.root + "/scan.bin"
        #expect(try await Shell.bash("head -c \(length) /dev/urandom > '\(file)'").status == 0)
        let put = try await Ferry.run(["--data", a.dataDirectory, "blob", "put", file])
        #expect(put.status == 0, "\(put.stderr)")
        let ref = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try await Ferry.run(["--data", a.dataDirectory, "put", "scan", #"{"file":\#(ref)}"#]).status == 0)
        try await a.start(["--trust", idB, "--trust", idC])
        let sync = { (node: Node) in ["--data", node.dataDirectory, "sync", a.url, "--pin", idA, "--pull"] }

        let (cleanTime, cleanBytes, noopTime, noopBytes) = try await Self.baseline(a, sync(c))
        let killed = try await Self.killRepeatedly(sync(b), cluster: cluster, source: a, cleanTime: cleanTime, noopTime: noopTime)

        // A kill loses at most what arrived after the partial file's last fsync, plus the
        // chunks in flight, plus the run's handshake.
        let perKill = Double(8 << 20) + Double(4 * (256 << 10)) + noopBytes
        let resent = killed.bytes - cleanBytes
        print(
            "kill-blob: \(length >> 20) MiB blob, \(killed.kills) SIGKILLs in \(killed.runs) runs; clean pull \(f(cleanTime)) s; "
                + "sent again \(f(resent / 1_048_576)) MiB (\(f(resent / 1_048_576 / Double(max(killed.kills, 1)))) MiB a kill; allowed 9 MiB and 1 handshake)")
        #expect(killed.kills >= 1, "no run was killed: the pull finished before any kill")
        #expect(resent <= Double(killed.kills) * perKill + noopBytes, "sent again \(Int(resent)) bytes for \(killed.kills) kills")

        let digest = try JSON.parse(ref)["digest"]?.stringValue ?? ""
        let copy = cluster.root + "/copy.bin"
        let get = try await Ferry.run(["--data", b.dataDirectory, "blob", "get", digest, "-o", copy])
        #expect(get.status == 0, "\(get.stderr)")
        #expect(FileManager.default.contentsEqual(atPath: copy, andPath: file))
        let check = try await Ferry.run(["--data", b.dataDirectory, "check"])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        try await b.start()
        try await cluster.awaitConvergence(among: [a, b], timeout: 30)
        await finish(cluster)
    }

    /// An uninterrupted pull into a fresh node, then one with nothing left: their wall times
    /// and the bytes the source sent for each.
    static func baseline(_ source: Node, _ arguments: [String]) async throws -> (Double, Double, Double, Double) {
        var measured: [(Double, Double)] = []
        for _ in 0..<2 {
            let before = try await source.admin.metric("ferry_bytes_sent_total")
            let started = ContinuousClock.now
            let run = try await Ferry.run(arguments, timeout: 600)
            #expect(run.status == 0, "\(run.stderr)")
            measured.append((seconds(ContinuousClock.now - started), try await source.admin.metric("ferry_bytes_sent_total") - before))
        }
        return (measured[0].0, measured[0].1, measured[1].0, measured[1].1)
    }

    /// Runs `arguments` again and again, each run killed with SIGKILL after a random delay
    /// (spread so that about `targetKills` kills fall inside the transfer), until a run ends
    /// by itself. Returns the kills, the runs and the bytes the source sent meanwhile.
    static func killRepeatedly(
        _ arguments: [String], cluster: Cluster, source: Node, cleanTime: Double, noopTime: Double
    ) async throws -> (kills: Int, runs: Int, bytes: Double) {
        let before = try await source.admin.metric("ferry_bytes_sent_total")
        let spread = 2 * max(cleanTime - noopTime, 0.05) / Double(targetKills)
        var (kills, runs) = (0, 0)
        while true {
            runs += 1
            let log = cluster.root + "/run-\(runs).log"
            let run = try ChildProcess.spawn(Ferry.binary, arguments, stdoutPath: log, stderrPath: log)
            // Past three times the target, the runs are left to finish (a pull that started
            // over every time would otherwise never end).
            if kills < 3 * targetKills {
                _ = await run.wait(timeout: Double.random(in: 0...(noopTime + spread)))
                if run.isRunning, await run.stop(SIGKILL).status == 128 + SIGKILL {
                    kills += 1
                    continue
                }
            }
            let status = await run.wait(timeout: 600)
            let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            #expect(status == 0, "run \(runs) after \(kills) kills ended with \(status.map(String.init) ?? "no exit"): \(output)")
            if status == nil { _ = await run.stop(SIGKILL) }
            break
        }
        return (kills, runs, try await source.admin.metric("ferry_bytes_sent_total") - before)
    }
}

private func seconds(_ d: Duration) -> Double {
    let (whole, atto) = d.components
    return Double(whole) + Double(atto) / 1e18
}

private func f(_ x: Double) -> String { String(format: "%.2f", x) }
