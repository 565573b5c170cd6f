import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// The README's two-node tour, run with the real binary in its own order: trust set up by
/// hand on each side, one after the other, must take effect at once.
@Suite(.serialized, .timeLimit(.minutes(10))) struct TourTests {
    /// Generous bound for "within 2 s" (the figure itself is printed, for reports).
    static let bound = 10.0

    /// Waits until `get note-1` succeeds on `node` through the CLI; returns the seconds since `start`.
    func waitForNote(on node: ServeProcess, since start: Date) async throws -> Double {
        try await waitUntil("note-1 from node B is visible on node A", timeout: Self.bound) {
            try await node.cli.run(["get", "note-1"]).status == 0
        }
        return Date().timeIntervalSince(start)
    }

    @Test func theTourWithAStaticPeerDeliversBsWriteToAWithinSeconds() async throws {
        let a = ServeProcess()
        let b = ServeProcess()
        let infoA = try await a.start()
        let idA = try #require(infoA["id"]?.stringValue)
        let urlA = try #require(infoA["url"]?.stringValue)
        let idB = await b.id  // `ferry --data B id` creates B's identity
        let infoB = try await b.start(["--peer", "\(urlA)#\(idA)"])
        // B dials A at once and is refused: A does not trust B yet.
        try await waitUntil("B has been refused by A") {
            let peers = try await AdminClient(nodeFile: infoB).get("/peers")["peers"]
            return peers?.first?["replication"]?["errorCode"] == .string("not_trusted_by_peer")
        }
        let trusted = Date()
        let add = try await a.cli.run(["trust", "add", idB])
        #expect(add.status == 0, "\(add.stderr)")
        // B trusts A already (a static peer is trusted); the tour's command is run all the same.
        _ = try await b.cli.run(["trust", "add", idA])
        let put = Date()
        #expect(try await b.cli.run(["put", "note-1", #"{"text":"from node B"}"#]).status == 0)
        let total = try await waitForNote(on: a, since: trusted)
        print("tour (static peer): trust add -> visible on A \(String(format: "%.2f", total)) s, put -> visible \(String(format: "%.2f", Date().timeIntervalSince(put))) s")
        // `ferry peers`: B shows A's URL; A lists B, which dialled it, as an inbound peer.
        let peersB = try await b.cli.run(["peers"])
        #expect(peersB.stdout.contains(urlA), "\(peersB.stdout)")
        try await waitUntil("A lists B as connected inbound") {
            try await a.cli.run(["peers"]).stdout.contains("connected (inbound)")
        }
        #expect(await a.stop() == 0)
        #expect(await b.stop() == 0)
        #expect(!b.logText.contains("error=none"), "\(b.logText)")
    }

    /// Runs `body` with the shared loopback avahi-daemon; one that does not start fails the
    /// test (the discovery tours run only where `LoopbackAvahi.required`).
    func withAvahi(_ body: @Sendable () async throws -> Void) async throws {
        try await LoopbackAvahi.withDaemon { why in
            if let why {
                Issue.record("the test run's avahi-daemon did not start: \(why)")
                return
            }
            try await body()
        }
    }

    /// The tour with DNS-SD, trust added on A then on B (`aFirst`) or the other way round:
    /// across the two orders, the node with the lower ID trusts both first and last.
    func discoveryTour(aFirst: Bool) async throws {
        try await withAvahi {
            let group = "tour\(UInt32.random(in: 0...UInt32.max))"
            let a = ServeProcess()
            let b = ServeProcess()
            let infoA = try await a.start(["--discovery", "--group", group, "--name", "a"])
            let idA = try #require(infoA["id"]?.stringValue)
            let idB = await b.id
            _ = try await b.start(["--discovery", "--group", group, "--name", "b"])
            // Each lists the other before any trust: discovery is done.
            try await waitUntil("A and B see each other", timeout: 30) {
                let seenByA = try await a.cli.run(["peers", "--json"]).stdout.contains(idB)
                let seenByB = try await b.cli.run(["peers", "--json"]).stdout.contains(idA)
                return seenByA && seenByB
            }
            let first = Date()
            let (x, idY, y, idX) = aFirst ? (a, idB, b, idA) : (b, idA, a, idB)
            #expect(try await x.cli.run(["trust", "add", idY]).status == 0)
            #expect(try await y.cli.run(["trust", "add", idX]).status == 0)
            let put = Date()
            #expect(try await b.cli.run(["put", "note-1", #"{"text":"from node B"}"#]).status == 0)
            let total = try await waitForNote(on: a, since: first)
            print("tour (dns-sd, \(aFirst ? "A" : "B") trusts first, lower ID \(idA < idB ? "A" : "B")): first trust add -> visible on A \(String(format: "%.2f", total)) s, put -> visible \(String(format: "%.2f", Date().timeIntervalSince(put))) s")
            #expect(await a.stop() == 0)
            #expect(await b.stop() == 0)
        }
    }

    @Test(.enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
    func theTourWithDiscoveryDeliversBsWriteToAWithinSeconds() async throws {
        try await discoveryTour(aFirst: true)
    }

    @Test(.enabled(if: LoopbackAvahi.required, "needs root for its own network namespace"))
    func theTourWithDiscoveryAndTrustAddedInTheOtherOrderDeliversToo() async throws {
        try await discoveryTour(aFirst: false)
    }
}
