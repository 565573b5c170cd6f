import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Enrollment on loopback with real `ferry serve` processes: invitation codes, joins,
/// group-wide trust without `ferry trust add`, and removal.
@Suite(.serialized, .timeLimit(.minutes(10))) struct EnrollmentScenarios {
    /// `ferry invite` on `node`; returns the code (and the JSON reply).
    func invite(_ node: Node, _ extra: [String] = []) async throws -> (code: String, reply: JSON) {
        let r = try await Ferry.run(["--data", node.dataDirectory, "invite", "--json"] + extra)
        guard r.status == 0 else { throw HarnessError("invite on \(node.name) failed: \(r.stderr)") }
        let reply = try JSON.parse(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        return (reply["code"]?.stringValue ?? "", reply)
    }

    func join(_ node: Node, _ code: String) async throws -> Ferry.Result {
        try await Ferry.run(["--data", node.dataDirectory, "join", code])
    }

    /// The IDs a node trusts (manual and group), from its admin API.
    func trusted(_ node: Node) async throws -> Set<String> {
        Set((try await node.admin.get("/trust")["trusted"]?.items ?? []).compactMap { $0["id"]?.stringValue })
    }

    func connected(_ node: Node, to id: String) async throws -> Bool {
        (try await node.admin.get("/peers")["peers"]?.items ?? []).contains { $0["id"]?.stringValue == id && $0["connected"]?.boolValue == true }
    }

    /// Discovery left on, as by default, on hosts with no avahi-daemon: members enrolled
    /// with `invite`/`join` dial each other where their member entries say they listen.
    @Test func membersConnectWithoutAvahiWhenDiscoveryIsLeftOn() async throws {
        let cluster = Cluster("enroll-no-avahi")
        defer { cluster.cleanUp() }
        let (a, b, c) = (cluster.add("a"), cluster.add("b"), cluster.add("c"))
        // No D-Bus system bus at this address: the compat library cannot reach an avahi-daemon.
        let noAvahi = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"]
        for n in [a, b, c] { try await n.start(["--discovery"], environment: noAvahi) }
        let (idB, idC) = (try await b.id, try await c.id)
        for n in [b, c] {
            let joined = try await join(n, try await invite(a).code)
            #expect(joined.status == 0, "\(joined.stderr)")
        }
        // B and C were never introduced to each other: only their member entries tell where they are.
        try await waitUntil("B and C connect to each other", timeout: 30) {
            let bc = try await connected(b, to: idC)
            let cb = try await connected(c, to: idB)
            return bc && cb
        }
        // The lower ID dials, and lists the other with the source `group`.
        let (dialler, dialled) = idB < idC ? (b, idC) : (c, idB)
        let listed = try await dialler.admin.get("/peers")["peers"]?.items.first { $0["id"]?.stringValue == dialled }
        #expect(listed?["source"]?.stringValue?.contains("group") == true, "\(String(describing: listed))")
        try await c.admin.put("from-c", #"{"by":"c"}"#)
        try await cluster.awaitConvergence(timeout: 30)
        #expect(try await b.admin.get("/docs/from-c")["by"]?.stringValue == "c")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// A peer first trusted by hand without a name is listed, once it joins the group, by
    /// the name the group knows it by: in the admin API's `/peers` (which the dashboard shows)
    /// and in `ferry peers`, never as `-`.
    @Test func aPeerTrustedWithoutANameIsListedByItsMemberNameOnceItJoins() async throws {
        let cluster = Cluster("enroll-names")
        defer { cluster.cleanUp() }
        let (a, b) = (cluster.add("a"), cluster.add("vm-node-b"))
        let noAvahi = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"]
        for n in [a, b] { try await n.start(["--discovery"], environment: noAvahi) }
        let idB = try await b.id
        let trusted = try await Ferry.run(["--data", a.dataDirectory, "trust", "add", idB])
        #expect(trusted.status == 0, "\(trusted.stderr)")
        let joined = try await join(b, try await invite(a).code)
        #expect(joined.status == 0, "\(joined.stderr)")
        func listed() async throws -> JSON? {
            try await a.admin.get("/peers")["peers"]?.items.first { $0["id"]?.stringValue == idB }
        }
        try await waitUntil("A lists B, connected", timeout: 30) { try await listed()?["connected"]?.boolValue == true }
        try await waitUntil("A lists B by its member name", timeout: 30) { try await listed()?["name"]?.stringValue == "vm-node-b" }
        let peers = try await Ferry.run(["--data", a.dataDirectory, "peers"])
        #expect(peers.status == 0, "\(peers.stderr)")
        let line = peers.stdout.split(separator: "\n").first { $0.contains(idB) }.map(String.init) ?? ""
        #expect(line.contains("  \(idB)  vm-node-b  "), "\(peers.stdout)")
        await finish(cluster, allowing: expectedRefusals)
    }

    /// A member restarted on another port, with no DNS-SD to say so, tells the group where
    /// it listens now (a record it signs itself, pushed to the members that dial it), and
    /// they dial it there.
    @Test func aMemberRestartedOnAnotherPortIsDialledThereWithoutAvahi() async throws {
        let cluster = Cluster("enroll-moved")
        defer { cluster.cleanUp() }
        let (a, b, c) = (cluster.add("a"), cluster.add("b"), cluster.add("c"))
        let noAvahi = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"]
        for n in [a, b, c] { try await n.start(["--discovery"], environment: noAvahi) }
        for n in [b, c] {
            let joined = try await join(n, try await invite(a).code)
            #expect(joined.status == 0, "\(joined.stderr)")
        }
        // The member with the highest ID dials nobody: every other member dials it.
        let nodes = [a, b, c]
        let ids = try await cluster.ids(nodes)
        let top = ids.indices.max { ids[$0] < ids[$1] }!
        let moved = nodes[top]
        let others = nodes.indices.filter { $0 != top }
        try await waitUntil("every member is connected to the top one", timeout: 30) {
            for i in others where !(try await connected(nodes[i], to: ids[top])) { return false }
            return true
        }
        let oldURL = moved.url
        _ = await moved.stop()
        try await moved.restart(["--discovery"])
        #expect(moved.url != oldURL, "the restarted node took its old port again")
        try await waitUntil("the others dial the moved member at its new port", timeout: 60) {
            for i in others where !(try await connected(nodes[i], to: ids[top])) { return false }
            return true
        }
        try await nodes[others[0]].admin.put("after-move", #"{"n":1}"#)
        try await waitUntil("a write reaches the moved member", timeout: 30) {
            try await moved.admin.call("GET", "/docs/after-move").status == 200
        }
        await finish(cluster, allowing: expectedRefusals + ["connect_failed", "replication offline"])
    }

    /// A node given a member as a static peer (`--peer URL#ID`) before it joined the group
    /// follows that member to its new port: the member's newer signed address record wins
    /// over the static URL (the ID stays pinned). The moved member keeps listing the peer,
    /// offline while it is not connected.
    @Test func aStaticPeerThatMovedIsDialledWhereItsAddressRecordSays() async throws {
        let cluster = Cluster("enroll-static-moved")
        defer { cluster.cleanUp() }
        let (member, p) = (cluster.add("member"), cluster.add("static"))
        let noAvahi = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/ferry-no-dbus"]
        try await member.start(["--discovery"], environment: noAvahi)
        let idM = try await member.id
        let staticURL = member.url
        try await p.start(["--discovery", "--trust", idM, "--peer", "\(staticURL)#\(idM)"], environment: noAvahi)
        let idP = try await p.id
        let joined = try await join(p, try await invite(member).code)
        #expect(joined.status == 0, "\(joined.stderr)")
        /// The link `p` dialled to the member (its static peer, whichever ID is lower), up.
        func dialledAt(_ url: String) async throws -> Bool {
            let list = try await p.admin.get("/peers")["peers"]?.items ?? []
            guard let entry = list.first(where: { $0["id"]?.stringValue == idM }) else { return false }
            let outbound = ["outbound", "both"].contains(entry["direction"]?.stringValue ?? "")
            return entry["url"]?.stringValue == url && outbound
        }
        try await waitUntil("the static peer is dialled where it was given", timeout: 30) { try await dialledAt(staticURL) }

        _ = await member.stop()
        try await member.restart()
        #expect(member.url != staticURL, "the restarted member took its old port again")
        try await waitUntil("the static peer is dialled at its new port", timeout: 30) { try await dialledAt(member.url) }
        try await waitUntil("the moved member lists the peer", timeout: 30) { try await connected(member, to: idP) }

        // The peer is down while the member moves again: still listed there, offline.
        _ = await p.stop()
        _ = await member.stop()
        try await member.restart()
        let list = try await member.admin.get("/peers")["peers"]?.items ?? []
        let entry = list.first { $0["id"]?.stringValue == idP }
        #expect(entry != nil && entry?["connected"]?.boolValue == false, "the moved member no longer lists its peer: \(list)")
        await finish(cluster, allowing: expectedRefusals + ["connect_failed", "replication offline"])
    }

    /// K nodes (8, or FERRY_ENROLL_K) enrolled with 2(K−1) commands form a full mesh of
    /// trust and links, converge, and keep their group across a restart.
    @Test func aGroupOfKNodesEnrollsWithTwoCommandsPerNewNode() async throws {
        let k = Int(ProcessInfo.processInfo.environment["FERRY_ENROLL_K"] ?? "") ?? 8
        let cluster = Cluster("enroll-k")
        defer { cluster.cleanUp() }
        let nodes = (0..<k).map { cluster.add("n\($0)") }
        for n in nodes { try await n.start() }
        let ids = try await cluster.ids(nodes)
        let started = ContinuousClock.now
        var commands = 0
        for n in nodes.dropFirst() {
            let code = try await invite(nodes[0]).code
            let r = try await join(n, code)
            commands += 2
            #expect(r.status == 0, "\(n.name): \(r.stderr)")
        }
        let joined = ContinuousClock.now - started
        #expect(commands == 2 * (k - 1))
        try await waitUntil("every node trusts every other", timeout: 60) {
            for (i, n) in nodes.enumerated() where !(try await trusted(n)).isSuperset(of: Set(ids).subtracting([ids[i]])) { return false }
            return true
        }
        let trustedAll = ContinuousClock.now - started
        try await waitUntil("every node is connected to every other", timeout: 60) {
            for (i, n) in nodes.enumerated() {
                let peers = try await n.admin.get("/peers")["peers"]?.items ?? []
                let up = Set(peers.filter { $0["connected"]?.boolValue == true }.compactMap { $0["id"]?.stringValue })
                if !up.isSuperset(of: Set(ids).subtracting([ids[i]])) { return false }
            }
            return true
        }
        let meshed = ContinuousClock.now - started
        try await nodes[k - 1].admin.put("from-last", "{}")
        try await cluster.awaitConvergence(timeout: 60)
        print("enrollment K=\(k): \(commands) commands; joins done \(joined), full trust \(trustedAll), full mesh \(meshed)")
        // A restart keeps the group: the node trusts the members again at once. Without
        // DNS-SD members dial the addresses in each other's entries, so the node comes back
        // on the port it joined with (docs/operations.md: ports must stay fixed then).
        let port = nodes[1].info["port"]?.intValue ?? 0
        await nodes[1].stop()
        try await nodes[1].restart(["--port", String(port)])
        #expect((try await trusted(nodes[1])).isSuperset(of: Set(ids).subtracting([ids[1]])))
        try await nodes[0].admin.put("after-restart", "{}")
        try await cluster.awaitConvergence(timeout: 60)
        await finish(cluster, allowing: expectedRefusals)
    }

    @Test func invitedNodesTrustEachOtherConvergeAndARemovedNodeIsDropped() async throws {
        let cluster = Cluster("enroll")
        defer { cluster.cleanUp() }
        let (a, b, c, d) = (cluster.add("a"), cluster.add("b"), cluster.add("c"), cluster.add("d"))
        for n in [a, b, c, d] { try await n.start() }
        let (idA, idB, idC) = (try await a.id, try await b.id, try await c.id)

        // One invite on A and one join on each new node: no `trust add` anywhere.
        let first = try await invite(a)
        #expect(first.code.hasPrefix("ferry1-"))
        let joinB = try await join(b, first.code)
        #expect(joinB.status == 0, "\(joinB.stderr)")
        let second = try await invite(a)
        let joinC = try await join(c, second.code)
        #expect(joinC.status == 0, "\(joinC.stderr)")
        try await waitUntil("A, B and C trust each other", timeout: 30) {
            let (ta, tb, tc) = (try await trusted(a), try await trusted(b), try await trusted(c))
            return ta.isSuperset(of: [idB, idC]) && tb.isSuperset(of: [idA, idC]) && tc.isSuperset(of: [idA, idB])
        }
        // B and C dial each other directly, from the addresses in their signed entries.
        try await waitUntil("B and C connect to each other", timeout: 30) {
            let bc = try await connected(b, to: idC)
            let cb = try await connected(c, to: idB)
            return bc && cb
        }
        try await c.admin.put("from-c", #"{"by":"c"}"#)
        try await cluster.awaitConvergence(among: [a, b, c], timeout: 30)
        #expect(try await b.admin.get("/docs/from-c")["by"]?.stringValue == "c")

        // Keep one invitation open, so D's attempts reach the inviter's own checks.
        let open = try await invite(a)
        // The same code twice: refused.
        let reuse = try await join(d, first.code)
        #expect(reuse.status != 0)
        #expect(reuse.stderr.contains("already used"), "\(reuse.stderr)")
        // An expired code: refused once its expiry has passed.
        let short = try await invite(a, ["--expires", "1s"])
        let expiry = ISO8601DateFormatter().date(from: short.reply["expires"]?.stringValue ?? "") ?? Date()
        // The reply's expiry is in whole seconds (ISO 8601): allow for the truncated fraction.
        try await waitUntil("the short invitation expired", timeout: 10, every: .milliseconds(100)) { Date() > expiry.addingTimeInterval(1.2) }
        let late = try await join(d, short.code)
        #expect(late.status != 0)
        #expect(late.stderr.contains("expired"), "\(late.stderr)")
        // A wrong secret (a forged code for A): refused as unknown.
        var forged = Array(open.code.utf8)
        forged[60] = forged[60] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        let wrong = try await join(d, String(decoding: forged, as: UTF8.self))
        #expect(wrong.status != 0)
        #expect(wrong.stderr.contains("no such invitation") || wrong.stderr.contains("not a valid invitation code"), "\(wrong.stderr)")
        #expect(!(try await trusted(a)).contains(try await d.id))

        // A member that is no admin cannot invite.
        let denied = try await Ferry.run(["--data", b.dataDirectory, "invite"])
        #expect(denied.status != 0)
        #expect(denied.stderr.contains("not an admin"), "\(denied.stderr)")

        // The group lists all three, A the founder.
        let listing = try await Ferry.run(["--data", c.dataDirectory, "group"])
        #expect(listing.status == 0 && listing.stdout.contains(String(idA.prefix(12))) && listing.stdout.contains("founder"), "\(listing.stdout)")

        // Removal on A reaches C: C stops trusting B, and B's links to A and C close.
        let removal = try await Ferry.run(["--data", a.dataDirectory, "group", "remove", "b"])
        #expect(removal.status == 0, "\(removal.stderr)")
        try await waitUntil("C drops B", timeout: 30) { !(try await trusted(c)).contains(idB) }
        try await waitUntil("B's connections close", timeout: 30) {
            let aToB = try await connected(a, to: idB)
            let cToB = try await connected(c, to: idB)
            return !aToB && !cToB
        }
        try await b.admin.put("b-after-removal", "{}")
        try await a.admin.put("a-after-removal", "{}")
        try await cluster.awaitConvergence(among: [a, c], timeout: 30)
        for n in [a, c] {
            #expect(try await n.admin.call("GET", "/docs/b-after-removal").status == 404, "\(n.name) received B's write after the removal")
        }
        let group = try await c.admin.get("/group")
        #expect(group["members"]?.items.first { $0["id"]?.stringValue == idB }?["state"]?.stringValue == "removed")
        await finish(cluster, allowing: expectedRefusals + ["refused a join", "no longer trusts", "forbids this connection"])
    }
}

/// Enrollment in the LAN lab with DNS-SD on: members find each other over mDNS once the
/// group makes them trusted; nothing but `invite` and `join` is typed. Part of
/// LabScenarios, so it is serialized with the other users of the one lab.
extension LabScenarios {
    @Test func threeHostsEnrollOverTheLANAndARemovalReachesEveryMember() async throws {
        try await withLab(3, "enrollment across hosts") { lab in try await enrollmentScenario(lab) }
    }

    /// Four hosts with no avahi-daemon (nor D-Bus) at all, discovery left at its default:
    /// enrolled with `invite`/`join` only, the members dial each other at the addresses in
    /// their member entries and converge; a member restarted on another port is reached there
    /// again through the address record it signs.
    @Test func fourHostsWithoutAvahiEnrollConvergeAndReachAMemberThatMoved() async throws {
        try await withLab(4, "enrollment without avahi", avahi: false) { lab in
            let cluster = Cluster("lab-enroll-no-avahi")
            defer { cluster.cleanUp() }
            let nodes = (0..<4).map { cluster.add("node\($0 + 1)", host: lab.hosts[$0]) }
            // `--discovery`: the harness turns it off unless asked; a user leaves it at its default, on.
            for n in nodes { try await n.start(["--discovery", "--group", "lab", "--interface", "0.0.0.0"]) }
            #expect(nodes[0].log.contains("discovery: DNS-SD unavailable"), "serve says which discovery it uses: \(nodes[0].logTail(20))")
            let ids = try await cluster.ids(nodes)
            for n in nodes.dropFirst() {
                let invite = try await Ferry.run(["--data", nodes[0].dataDirectory, "invite"], host: nodes[0].host)
                #expect(invite.status == 0, "\(invite.stderr)")
                let join = try await Ferry.run(["--data", n.dataDirectory, "join", invite.stdout.trimmingCharacters(in: .whitespacesAndNewlines)], host: n.host)
                #expect(join.status == 0, "\(join.stderr)")
            }
            try await nodes[3].admin.put("from-4", #"{"by":4}"#)
            try await nodes[1].admin.put("from-2", #"{"by":2}"#)
            try await cluster.awaitConvergence(timeout: 90)
            // Every pair is linked, though only node1 was ever introduced to the others.
            func linkedToAll(_ i: Int) async throws -> Bool {
                let peers = try await nodes[i].admin.get("/peers")["peers"]?.items ?? []
                return ids.indices.filter { $0 != i }.allSatisfy { j in
                    peers.contains { $0["id"]?.stringValue == ids[j] && $0["connected"] == true }
                }
            }
            try await waitUntil("a full mesh of member links", timeout: 60) {
                for i in nodes.indices where !(try await linkedToAll(i)) { return false }
                return true
            }
            // The member every other one dials (the highest ID) moves to another port.
            let top = ids.indices.max { ids[$0] < ids[$1] }!
            let moved = nodes[top]
            let oldURL = moved.url
            _ = await moved.stop()
            try await moved.restart(["--discovery", "--group", "lab", "--interface", "0.0.0.0"])
            #expect(moved.url != oldURL, "the restarted node took its old port again")
            try await waitUntil("every member reaches the moved one at its new port", timeout: 90) {
                for i in nodes.indices where i != top {
                    let peers = try await nodes[i].admin.get("/peers")["peers"]?.items ?? []
                    if !peers.contains(where: { $0["id"]?.stringValue == ids[top] && $0["connected"] == true }) { return false }
                }
                return true
            }
            let writer = nodes[(top + 1) % nodes.count]
            try await writer.admin.put("after-move", #"{"n":1}"#)
            try await cluster.awaitConvergence(timeout: 90)
            #expect(try await moved.admin.call("GET", "/docs/after-move").status == 200)
            await finish(cluster, allowing: expectedRefusals + ["connect_failed", "replication offline"])
        }
    }

    func enrollmentScenario(_ lab: Lab) async throws {
        let cluster = Cluster("lab-enroll")
        defer { cluster.cleanUp() }
        let nodes = (0..<3).map { cluster.add("node\($0 + 1)", host: lab.hosts[$0]) }
        for n in nodes { try await n.start(["--discovery", "--group", "lab", "--interface", "0.0.0.0"]) }
        let ids = try await cluster.ids(nodes)
        for n in nodes.dropFirst() {
            let invite = try await Ferry.run(["--data", nodes[0].dataDirectory, "invite"], host: nodes[0].host)
            #expect(invite.status == 0, "\(invite.stderr)")
            let code = invite.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            // The code names the inviter's LAN address, not loopback.
            #expect(try InvitationAddresses.of(code).contains("\(lab.hosts[0].address):\(nodes[0].info["port"]?.intValue ?? 0)"))
            let join = try await Ferry.run(["--data", n.dataDirectory, "join", code], host: n.host)
            #expect(join.status == 0, "\(join.stderr)")
        }
        try await nodes[2].admin.put("from-3", "{}")
        try await cluster.awaitConvergence(timeout: 90)
        try await waitUntil("node2 and node3 connect over DNS-SD", timeout: 60) {
            let peers = try await nodes[1].admin.get("/peers")["peers"]?.items ?? []
            // Found by DNS-SD and known from its member entry: `dns-sd+group`.
            return peers.contains {
                $0["id"]?.stringValue == ids[2] && $0["connected"] == true && $0["source"]?.stringValue?.contains("dns-sd") == true
            }
        }
        let removal = try await Ferry.run(["--data", nodes[0].dataDirectory, "group", "remove", ids[1]], host: nodes[0].host)
        #expect(removal.status == 0, "\(removal.stderr)")
        try await waitUntil("node3 drops node2", timeout: 30) {
            let peers = try await nodes[2].admin.get("/peers")["peers"]?.items ?? []
            return !peers.contains { $0["id"]?.stringValue == ids[1] && ($0["trusted"] == true || $0["connected"] == true) }
        }
        await finish(cluster, allowing: expectedRefusals + ["no longer trusts", "forbids this connection"])
    }
}

/// Reads the addresses out of an invitation code, as `ferry join` does.
enum InvitationAddresses {
    static func of(_ code: String) throws -> [String] {
        var text = String(code.dropFirst("ferry1-".count)).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        guard let data = Data(base64Encoded: text), data.count > 49 else { throw HarnessError("not an invitation code: \(code)") }
        return String(decoding: data.dropFirst(49), as: UTF8.self).split(separator: ",").map(String.init)
    }
}
