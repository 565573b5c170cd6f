import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Scenario 31: a node's wall clock set back a day, then forward two, while it runs
/// (libfaketime reading its offset from a file the test rewrites; the monotonic and boot
/// clocks are left alone, as a real clock step leaves them). Invitations end on time either
/// way, and nodes whose clocks disagree by a day still pin, join and replicate.
@Suite(.serialized, .timeLimit(.minutes(5))) struct ClockJumpScenarios {
    static let faketime = ["x86_64", "aarch64"].map { "/usr/lib/\($0)-linux-gnu/faketime/libfaketimeMT.so.1" }
        .first { FileManager.default.fileExists(atPath: $0) } ?? "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

    func invite(_ node: Node, _ extra: [String]) async throws -> (code: String, expires: Date) {
        let r = try await Ferry.run(["--data", node.dataDirectory, "invite", "--json"] + extra)
        guard r.status == 0 else { throw HarnessError("invite on \(node.name) failed: \(r.stderr)") }
        let reply = try JSON.parse(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        let expires = ISO8601DateFormatter().date(from: reply["expires"]?.stringValue ?? "") ?? .distantPast
        return (reply["code"]?.stringValue ?? "", expires)
    }

    func join(_ node: Node, _ code: String) async throws -> Ferry.Result {
        try await Ferry.run(["--data", node.dataDirectory, "join", code])
    }

    /// Rewrites the offset and waits until the node's clock shows it: a 10-minute code it
    /// issues then expires `offset` seconds away from ten minutes from now.
    func setClock(_ node: Node, file: String, _ text: String, offset: TimeInterval) async throws -> (code: String, expires: Date) {
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        var probe = (code: "", expires: Date.distantPast)
        try await waitUntil("\(node.name)'s clock reads \(text)", timeout: 30, every: .milliseconds(200)) {
            probe = try await invite(node, ["--expires", "10m"])
            return abs(probe.expires.timeIntervalSinceNow - 600 - offset) < 3600
        }
        return probe
    }

    @Test(.enabled(if: FileManager.default.fileExists(atPath: Self.faketime) || mustRunEverything, "needs libfaketime (make deps)"))
    func invitationsEndOnTimeAndNodesADayApartReplicateWhenAClockJumps() async throws {
        #expect(FileManager.default.fileExists(atPath: Self.faketime), "libfaketime is missing: run make deps")
        let cluster = Cluster("clock")
        defer { cluster.cleanUp() }
        let (a, b, c) = (cluster.add("a"), cluster.add("b"), cluster.add("c"))
        let offsetFile = cluster.root + "/a.faketime"
        try "+0".write(toFile: offsetFile, atomically: true, encoding: .utf8)
        // Started through /usr/bin/env: the first process libfaketime loads into sets
        // FAKETIME_SHARED, which moves the environment, and Swift finds its command line
        // by walking back from the environment the process started with (`ferry` loaded
        // that way sees no arguments). Its exec'd child inherits the variable, and the pid.
        try await a.start(
            [],
            environment: [
                "LD_PRELOAD": Self.faketime, "FAKETIME_TIMESTAMP_FILE": offsetFile, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "FAKETIME_CACHE_DURATION": "1",
            ], launcher: ["/usr/bin/env"])
        let pid = a.pid ?? 0
        defer {
            // libfaketime's shared memory, named after the process that made it.
            try? FileManager.default.removeItem(atPath: "/dev/shm/faketime_shm_\(pid)")
            try? FileManager.default.removeItem(atPath: "/dev/shm/sem.faketime_sem_\(pid)")
        }
        try await b.start()
        try await c.start()
        let day: TimeInterval = 86_400

        // Set back a day right after issuing a 3-second code: the code still ends 3 s later
        // (by the wall clock alone it would stay open for a day).
        let short = try await invite(a, ["--expires", "3s"])
        let issued = ContinuousClock.now
        let behind = try await setClock(a, file: offsetFile, "-1d", offset: -day)
        try await waitUntil("3 s passed", timeout: 30, every: .milliseconds(100)) { ContinuousClock.now - issued > .seconds(4) }
        let late = try await join(b, short.code)
        #expect(late.status != 0, "a code kept open by a clock set back a day was accepted")
        #expect(late.stderr.contains("expired"), "\(late.stderr)")

        // A day behind everyone else, A still takes a join and replicates both ways.
        let joined = try await join(c, behind.code)
        #expect(joined.status == 0, "\(joined.stderr)")
        try await c.admin.put("from-c", #"{"by":"c"}"#)
        try await a.admin.put("from-a-behind", #"{"by":"a"}"#)
        // 60 s: on a loaded machine a link closed as silent around the clock step redials
        // with backoff (seen once in ten runs beside three compilers, never on an idle one).
        try await cluster.awaitConvergence(among: [a, c], timeout: 60)

        // Set forward two days (a day ahead of the others): a 10-minute code issued just
        // before has expired, and A's writes still reach C, C's still reach A.
        let pending = try await invite(a, ["--expires", "10m"])
        _ = try await setClock(a, file: offsetFile, "+1d", offset: day)
        let jumped = try await join(b, pending.code)
        #expect(jumped.status != 0, "a code past its expiry on the node's clock was accepted")
        // Issued on the day-behind clock, two days before the node's clock now: a record
        // more than a day past its expiry is forgotten, so the code is unknown rather than expired.
        #expect(jumped.stderr.contains("expired") || jumped.stderr.contains("no such invitation"), "\(jumped.stderr)")
        try await a.admin.put("from-a-ahead", #"{"by":"a"}"#)
        try await c.admin.put("from-c-later", #"{"by":"c"}"#)
        try await cluster.awaitConvergence(among: [a, c], timeout: 60)
        #expect(try await c.admin.get("/docs/from-a-ahead")["by"]?.stringValue == "a")
        await finish(cluster, allowing: expectedRefusals + ["refused a join"])
    }
}
