import FerryCore
import FerryStore
import Foundation
import IntegrationHarness
import Logging
import Testing

@testable import FerrySync

/// Anti-entropy on a link under the group's access rules: both ends compare digests over what
/// both may read (a station's ward), and a difference left by a lost message or a race is
/// reconciled, without ever moving what the reader may not read.
@Suite(.timeLimit(.minutes(3))) struct ViewDigestTests {
    static let version = "rules-1"

    static func ward(_ w: String) -> AccessRule {
        AccessRule.all.restricted(by: AccessGrant(clauses: [try! AccessClause(selector: ["ward": .string(w)])]))
    }

    /// What the supervisor lets a ward-a station do, as the group's rules grant it.
    static let station = PeerPolicy(
        read: ward("a"), write: ward("a"), mayDelete: false, groupRules: GroupRulesApplied(version: version, unnarrowed: true))
    /// What a station lets the supervisor do (everything), by the same rules.
    static let supervisor = PeerPolicy(groupRules: GroupRulesApplied(version: version, unnarrowed: true))

    /// A ward-a station `a` and a supervisor `b`, each with its digests and the rules' policies.
    struct Pair {
        let a: JoinNode
        let b: JoinNode
        let aDigests: MeshDigests
        let bDigests: MeshDigests
        let link: Link

        init() throws {
            a = try JoinNode("a")
            b = try JoinNode("b")
            aDigests = MeshDigests(store: a.store, minInterval: .milliseconds(50))
            bDigests = MeshDigests(store: b.store, minInterval: .milliseconds(50))
            var options = ReplicationResponder.Options()
            options.nodeID = "b"
            options.policyLookup = { _ in ViewDigestTests.station }
            options.liveness.interval = .milliseconds(100)
            options.liveness.deadAfter = .seconds(30)
            options.digests = bDigests
            link = Link(to: b.store, options: options, quiet: true)
        }

        /// The station's replicator to the supervisor: continuous both ways, or one pass.
        func replicator(continuous: Bool, antiEntropy: Bool = true) -> Replicator {
            var config = ReplicatorConfiguration()
            config.wiring.nodeID = "a"
            config.continuous = continuous
            config.remotePolicy = ViewDigestTests.supervisor
            config.ownRead = { ViewDigestTests.ward("a") }
            config.checksHeldAccess = true
            config.wiring.metrics = a.metrics.sync
            config.wiring.digests = aDigests
            config.wiring.antiEntropy.enabled = antiEntropy
            AntiEntropyTests.fast(&config)
            var quiet = Logger(label: "ferry.viewdigest")
            quiet.logLevel = .critical
            return Replicator(store: a.store, connector: link.connector, configuration: config, logger: quiet)
        }

        /// The documents the station should hold: the supervisor's that ward a admits, at its revisions.
        func expected() throws -> [String: String] {
            let access = DocumentAccess(ViewDigestTests.station)
            var out: [String: String] = [:]
            for doc in try b.store.allDocuments() {
                guard let tree = try b.store.revisionTree(doc.id), access.mayRead(doc.id, tree: tree) else { continue }
                out[doc.id.rawValue] = doc.revision.description
            }
            return out
        }

        func held() throws -> [String: String] {
            Dictionary(uniqueKeysWithValues: try a.store.allDocuments().map { ($0.id.rawValue, $0.revision.description) })
        }
    }

    static func patient(_ ward: String, _ n: Int) -> JSON { ["ward": .string(ward), "n": .int(Int64(n))] }

    /// The supervisor holds patients of both wards; the station got ward a's in one pass, and
    /// then lost one of them (as a lost message would leave it): its checkpoint is past it.
    func drifted(_ p: Pair) async throws {
        for i in 0..<20 { try p.b.store.put(docID("patient-\(i)"), body: Self.patient(i % 2 == 0 ? "a" : "b", i)) }
        let once = p.replicator(continuous: false)
        await once.run()
        #expect(try p.held() == p.expected())
        #expect(try p.a.store.purge(docID("patient-4")))
    }

    @Test func aRestrictedLinkWithADriftedReaderReconcilesWhatTheReaderMayRead() async throws {
        let p = try Pair()
        try await drifted(p)
        let r = p.replicator(continuous: true)
        r.start()
        try await waitUntil("a reconciliation", timeout: 60, every: .milliseconds(5)) { p.a.metrics["ferry_reconciliations_total"] >= 1 }
        try await waitUntil("the station holds exactly ward a", timeout: 60, every: .milliseconds(10)) { try p.held() == p.expected() }
        // Ward b never moved, and both ends now see their views as equal.
        #expect(try p.held().keys.allSatisfy { Int($0.dropFirst(8))! % 2 == 0 })
        try await waitUntil("the views' digests match", timeout: 60, every: .milliseconds(10)) {
            p.aDigests.matches("b") == true && p.bDigests.matches("a") == true
        }
        r.stop()
        await r.waitUntilStopped()
    }

    @Test func withoutAntiEntropyTheDriftedRestrictedLinkStaysApart() async throws {
        // The baseline: the drift above does not heal by itself, so the test above can fail.
        let p = try Pair()
        try await drifted(p)
        let r = p.replicator(continuous: true, antiEntropy: false)
        r.start()
        try await waitUntil("the link is up and idle", timeout: 120, every: .milliseconds(20)) { r.status.activity == .idle }
        try await waitUntil("the views' digests are compared", timeout: 120, every: .milliseconds(20)) { p.aDigests.matches("b") != nil }
        try await Task.sleep(for: .seconds(1))
        #expect(try p.held() != p.expected())
        #expect(p.aDigests.matches("b") == false)
        r.stop()
        await r.waitUntilStopped()
    }

    @Test func aHeartbeatOnARestrictedLinkCarriesTheViewDigestAndNeverTheWholeStores() throws {
        var m = HeartbeatMessage()
        m.view = "sha256-ab"
        let decoded = try HeartbeatMessage(body: m.bytes)
        #expect(decoded.view == "sha256-ab" && decoded.digest == nil)
        var unknown = HeartbeatMessage()
        unknown.viewUnknown = true
        #expect(try HeartbeatMessage(body: unknown.bytes).viewUnknown)
        #expect(throws: SyncError.self) { try HeartbeatMessage(body: Array(#"{"view": 3}"#.utf8)) }
        // The two ends' views agree whichever end computes it, and a full link has none.
        let own = Self.ward("a")
        let atStation = LivenessPlan.view(localGrant: true, peerRead: Self.supervisor.read, ownRead: own)
        let atSupervisor = LivenessPlan.view(localGrant: true, peerRead: Self.station.read, ownRead: .all)
        #expect(atStation != nil && atSupervisor != nil)
        #expect(LivenessPlan.view(localGrant: true, peerRead: .all, ownRead: .all) == nil)
        #expect(LivenessPlan.view(localGrant: false, peerRead: Self.station.read, ownRead: .all) == nil)
    }
}
