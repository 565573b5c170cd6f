import FerryCore
import Foundation
import IntegrationHarness
import Testing

/// Couchbase Lite C 3.2.1 (Community Edition, `../shared/cbl/`, driven by its `cbl-driver`)
/// replicating with real `ferry serve` nodes over `ws://…/{db}/_blipsync` and, pinned,
/// `wss://` on the LAN listener: pulls, pushes, continuous feeds, a conflict made on both
/// sides, users and their rules, channels.
@Suite(.serialized, .timeLimit(.minutes(10))) struct CouchbaseLiteScenarios {
    static let password = "app-Secret-3141"

    /// A node serving users `app` (reads and writes everything) and `nurse` (reads and
    /// writes `note-*` only), on loopback and, with `lan`, on an HTTPS LAN listener.
    func startNode(_ cluster: Cluster, _ name: String = "a", lan: Int? = nil, couchPort: Int = 0, extra: [String] = []) async throws -> Node {
        let node = cluster.add(name)
        try await start(node, cluster, lan: lan, couchPort: couchPort, extra: extra)
        return node
    }

    func start(_ node: Node, _ cluster: Cluster, lan: Int? = nil, couchPort: Int = 0, extra: [String] = []) async throws {
        let name = node.name
        let file = cluster.root + "/\(name).password"
        try (Self.password + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        var users: [String] = []
        let nurse: JSON = ["read": ["ids": ["note-*"]], "write": ["ids": ["note-*"]], "mayDelete": true]
        let ward: JSON = ["read": ["types": ["note"]], "write": "none", "mayDelete": false]
        for (user, policy) in [("app", JSON?.none), ("nurse", nurse), ("ward", ward)] {
            let made = try await Ferry.run(["couch-user", user, "--password-file", file, "--iterations", "10000"])
            var entry = try #require(try? JSON.parse(Array(made.stdout.utf8)), "ferry couch-user: \(made.stdout) \(made.stderr)").objectValue ?? [:]
            if let policy { entry["policy"] = policy }
            users.append(JSON.object(entry).canonicalString)
        }
        var couch = #""users":[\#(users.joined(separator: ","))]"#
        if let lan { couch += #","lan":{"interface":"127.0.0.1","port":\#(lan)}"# }
        let config = cluster.root + "/\(name).json"
        try #"{"couch":{\#(couch)}}"#.write(toFile: config, atomically: true, encoding: .utf8)
        try await node.start(["--couch-port", String(couchPort), "--config", config, "--no-discovery"] + extra)
    }

    /// The Couchbase Lite endpoint of a node: `ws://127.0.0.1:PORT/ferry`.
    func endpoint(_ node: Node) throws -> String {
        let url = try CouchSuite.couchURL(node)
        return url.replacingOccurrences(of: "http://", with: "ws://") + "ferry"
    }

    func put(_ node: Node, _ id: String, _ body: String) async throws {
        let r = try await Ferry.run(["--data", node.dataDirectory, "put", id, body])
        #expect(r.status == 0, "ferry put \(id): \(r.stderr)")
    }

    /// Each document of a node: ID → (revision, body without `_` members).
    func documents(_ node: Node) async throws -> [String: (rev: String, body: JSON)] {
        let r = try await Ferry.run(["--data", node.dataDirectory, "ls", "--json"])
        guard case .array(let rows)? = try? JSON.parse(Array(r.stdout.utf8)) else { throw HarnessError("ferry ls --json: \(r.stdout) \(r.stderr)") }
        var out: [String: (String, JSON)] = [:]
        for row in rows {
            guard let id = row["id"]?.stringValue, let rev = row["rev"]?.stringValue else { continue }
            let got = try await Ferry.run(["--data", node.dataDirectory, "get", id])
            var body = (try? JSON.parse(Array(got.stdout.utf8)))?.objectValue ?? [:]
            for key in body.keys where key.hasPrefix("_") { body.removeValue(forKey: key) }
            out[id] = (rev, .object(body))
        }
        return out
    }

    @Test func anAppPullsAndPushesThroughANodeAndResumesFromItsCheckpoint() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-basic")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        for i in 1...20 { try await put(node, "doc-\(i)", #"{"i":\#(i),"from":"ferry"}"#) }
        let app = cluster.root + "/app-db"

        let pulled = try await driver.replicate(app, try endpoint(node), ["--pull", "--user", "app", "--password", Self.password])
        #expect(pulled.summary["error"] == .null, "\(pulled.output)")
        #expect(pulled.summary["pulled"]?.intValue == 20)
        let held = try await driver.list(app)
        let docs = try await documents(node)
        for i in 1...20 {
            #expect(held["doc-\(i)"]?.rev == docs["doc-\(i)"]?.rev, "doc-\(i): the app holds the node's revision")
            #expect(held["doc-\(i)"]?.body["i"]?.intValue == Int64(i))
        }

        try await driver.put(app, count: 10, prefix: "cbl-")
        let pushed = try await driver.replicate(app, try endpoint(node), ["--push", "--user", "app", "--password", Self.password])
        #expect(pushed.summary["error"] == .null, "\(pushed.output)")
        #expect(pushed.summary["pushed"]?.intValue == 10)
        let after = try await documents(node)
        let mine = try await driver.list(app)
        for i in 1...10 {
            #expect(after["cbl-\(i)"]?.rev == mine["cbl-\(i)"]?.rev, "cbl-\(i) keeps Couchbase Lite's revision ID on the node")
            #expect(after["cbl-\(i)"]?.body["from"] == "cbl")
        }

        // Both checkpoints hold: nothing is sent again either way.
        let again = try await driver.replicate(app, try endpoint(node), ["--both", "--user", "app", "--password", Self.password])
        #expect(again.summary["error"] == .null, "\(again.output)")
        #expect(again.summary["pulled"]?.intValue == 0 && again.summary["pushed"]?.intValue == 0, "\(again.summary)")
        await finish(cluster)
    }

    @Test func aContinuousPullGetsANodeWriteWhileConnectedAndTheNodeStopsCleanlyUnderIt() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-continuous")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        try await put(node, "first", #"{"n":1}"#)
        let app = cluster.root + "/app-db"
        let log = cluster.root + "/continuous.log"
        let live = try driver.spawn(
            app, try endpoint(node), ["--pull", "--continuous", "120", "--user", "app", "--password", Self.password], log: log)
        defer { live.signal(SIGKILL) }
        func events() -> String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }
        try await waitUntil("the app caught up", timeout: 60) { events().contains(#""activity":"idle""#) }
        try await put(node, "later", #"{"n":2}"#)
        try await waitUntil("the write reached the app", timeout: 30) { events().contains(#""id":"later""#) }
        // The node stops cleanly with the app still connected (its feed waits for the next commit).
        await finish(cluster)
        live.signal(SIGKILL)
        _ = await live.wait(timeout: 30)
        let held = try await driver.list(app)
        #expect(held["later"]?.body["n"]?.intValue == 2, "\(events())")
    }

    @Test func aConflictMadeOnBothSidesConvergesAsWithSyncGateway() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-conflict")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        let app = cluster.root + "/app-db"
        try await driver.put(app, count: 1, prefix: "shared-")
        let first = try await driver.replicate(app, try endpoint(node), ["--push", "--user", "app", "--password", Self.password])
        #expect(first.summary["pushed"]?.intValue == 1, "\(first.output)")
        let base = try #require(try await documents(node)["shared-1"]?.rev)
        // Both sides edit the same revision.
        let edit = try await Ferry.run(["--data", node.dataDirectory, "put", "shared-1", #"{"by":"node"}"#, "--rev", base])
        #expect(edit.status == 0, "\(edit.stderr)")
        try await driver.put(app, count: 1, prefix: "shared-")
        // The app pulls the node's revision and resolves the conflict (a proposal of its own
        // branch made first is refused with Sync Gateway's 409); then both hold one winner.
        let both = try await driver.replicate(app, try endpoint(node), ["--both", "--user", "app", "--password", Self.password])
        #expect(both.summary["pulled"]?.intValue == 1, "\(both.output)")
        _ = try await driver.replicate(app, try endpoint(node), ["--both", "--user", "app", "--password", Self.password])
        let held = try await driver.list(app)
        let docs = try await documents(node)
        #expect(held["shared-1"]?.rev == docs["shared-1"]?.rev, "app \(held["shared-1"]?.rev ?? "-") node \(docs["shared-1"]?.rev ?? "-")")
        #expect(held["shared-1"]?.body == docs["shared-1"]?.body)
        let got = try await Ferry.run(["--data", node.dataDirectory, "get", "shared-1", "--conflicts"])
        #expect(got.stdout.contains(#""_conflicts": []"#) || !got.stdout.contains("_conflicts"), "\(got.stdout)")
        await finish(cluster)
    }

    @Test func aRestrictedUserPullsOnlyWhatItMayReadAndARefusedPushIsAnsweredPerDocument() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-rules")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        try await put(node, "note-1", #"{"text":"ward round"}"#)
        try await put(node, "secret-1", #"{"text":"payroll"}"#)
        let app = cluster.root + "/nurse-db"
        let pulled = try await driver.replicate(app, try endpoint(node), ["--pull", "--user", "nurse", "--password", Self.password])
        #expect(pulled.summary["error"] == .null, "\(pulled.output)")
        var held = try await driver.list(app)
        #expect(held["note-1"] != nil)
        #expect(held["secret-1"] == nil, "a document the user may not read never reaches the app")

        try await driver.put(app, count: 1, prefix: "note-new-")
        try await driver.put(app, count: 1, prefix: "order-")
        let pushed = try await driver.replicate(app, try endpoint(node), ["--push", "--user", "nurse", "--password", Self.password])
        let docs = try await documents(node)
        #expect(docs["note-new-1"] != nil, "\(pushed.output)")
        #expect(docs["order-1"] == nil, "a write the user's rule refuses is not stored")
        #expect(pushed.output.contains(#""id":"order-1""#) && pushed.output.contains(#""code":403"#), "\(pushed.output)")
        held = try await driver.list(app)
        #expect(held["order-1"] != nil, "the app keeps its refused document")
        await finish(cluster, allowing: ["revision refused"])
    }

    @Test func aPhotoFromAnAppReachesCouchDBClientsAndAnotherAppAndANodeBlobReachesApps() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-blobs")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        let photo = Data((0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7919 &+ $0 >> 8) })
        let photoPath = cluster.root + "/photo.jpg"
        try photo.write(to: URL(fileURLWithPath: photoPath))
        let phone = cluster.root + "/phone"
        let attached = try await driver.run(["blob", phone, "photo-1", photoPath, "--key", "photo", "--content-type", "image/jpeg"])
        #expect(attached.status == 0, "\(attached.stderr)")
        let pushed = try await driver.replicate(phone, try endpoint(node), ["--push", "--user", "app", "--password", Self.password])
        #expect(pushed.summary["pushed"]?.intValue == 1, "\(pushed.output)")

        // A CouchDB client reads the photo as the attachment `blob_/photo`, byte for byte.
        let url = try CouchSuite.couchURL(node) + "ferry/photo-1/blob_%2Fphoto"
        let fetched = try await Shell.run(["-s", "-f", "-u", "app:\(Self.password)", "-o", cluster.root + "/fetched", url], executable: "/usr/bin/curl")
        #expect(fetched.status == 0, "\(fetched.stderr)")
        #expect(FileManager.default.contents(atPath: cluster.root + "/fetched") == photo)

        // A node's own blob, referred to by a document.
        let native = Data((0..<5_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        try native.write(to: URL(fileURLWithPath: cluster.root + "/native.bin"))
        let put = try await Ferry.run(["--data", node.dataDirectory, "blob", "put", cluster.root + "/native.bin"])
        try await self.put(node, "native-1", #"{"file":\#(put.stdout.trimmingCharacters(in: .whitespacesAndNewlines))}"#)

        // Another app gets both as Couchbase Lite blobs, with the photo's own digest.
        let tablet = cluster.root + "/tablet"
        let pulled = try await driver.replicate(tablet, try endpoint(node), ["--pull", "--user", "app", "--password", Self.password])
        #expect(pulled.summary["error"] == .null, "\(pulled.output)")
        let held = try await driver.list(tablet)
        let original = try await driver.list(phone)
        #expect(held["photo-1"]?.body == original["photo-1"]?.body, "the app's blob member comes back as it was")
        #expect(held["photo-1"]?.rev == original["photo-1"]?.rev)
        #expect(held["native-1"]?.body["file"]?["@type"] == "blob")
        let blobs = tablet + "/db.cblite2/Attachments"
        let files = (try? FileManager.default.contentsOfDirectory(atPath: blobs)) ?? []
        let contents = Set(files.compactMap { FileManager.default.contents(atPath: blobs + "/" + $0) })
        #expect(contents.contains(photo) && contents.contains(native), "both blobs' content is in the app: \(files)")
        await finish(cluster)
    }

    /// The node's peak resident memory, in MiB.
    func peakMiB(_ node: Node) -> Double {
        guard let pid = node.pid, let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
        for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            return (Double(line.split(separator: " ")[1]) ?? 0) / 1024
        }
        return 0
    }

    @Test func aVideoLargerThanAnyMessageCrossesBothWaysStreamedWithTheNodesMemoryFlat() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-video")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        // 96 MiB: more than a BLIP message may hold (64 MiB), so it can only cross streamed.
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15  // xorshift: incompressible, the same each run
        let words = (0..<(96 << 20) / 8).map { _ in
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return state
        }
        let video = words.withUnsafeBytes { Data($0) }
        let videoPath = cluster.root + "/video.mp4"
        try video.write(to: URL(fileURLWithPath: videoPath))
        let phone = cluster.root + "/phone"
        let attached = try await driver.run(["blob", phone, "clip-1", videoPath, "--key", "video", "--content-type", "video/mp4"])
        #expect(attached.status == 0, "\(attached.stderr)")
        let before = peakMiB(node)
        let pushed = try await driver.replicate(phone, try endpoint(node), ["--push", "--user", "app", "--password", Self.password])
        #expect(pushed.summary["pushed"]?.intValue == 1, "\(pushed.output)")

        // A CouchDB client reads it as the attachment `blob_/video`, byte for byte.
        let url = try CouchSuite.couchURL(node) + "ferry/clip-1/blob_%2Fvideo"
        let fetched = try await Shell.run(["-s", "-f", "-u", "app:\(Self.password)", "-o", cluster.root + "/fetched", url], executable: "/usr/bin/curl")
        #expect(fetched.status == 0, "\(fetched.stderr)")
        #expect(FileManager.default.contents(atPath: cluster.root + "/fetched") == video)

        // Another app gets it back as the same blob.
        let tablet = cluster.root + "/tablet"
        let pulled = try await driver.replicate(tablet, try endpoint(node), ["--pull", "--user", "app", "--password", Self.password])
        #expect(pulled.summary["error"] == .null, "\(pulled.output)")
        let held = try await driver.list(tablet)
        #expect(held["clip-1"]?.body == (try await driver.list(phone))["clip-1"]?.body)
        let blobs = tablet + "/db.cblite2/Attachments"
        let files = (try? FileManager.default.contentsOfDirectory(atPath: blobs)) ?? []
        #expect(files.contains { FileManager.default.contents(atPath: blobs + "/" + $0) == video }, "the video is in the other app: \(files)")
        // Neither way held the video in the node's memory (the CouchDB read streams too).
        let growth = peakMiB(node) - before
        #expect(growth < 48, "the node's peak memory grew by \(growth) MiB for a 96 MiB video")
        await finish(cluster)
    }

    @Test func aDocumentEditedOutOfAUsersReachOrOutOfItsChannelsIsPurgedFromTheApp() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-removal")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        try await put(node, "n-1", #"{"type":"note","channels":["a"]}"#)
        try await put(node, "n-2", #"{"type":"note","channels":["a"]}"#)
        try await put(node, "s-1", #"{"type":"secret","channels":["a"]}"#)
        let ward = cluster.root + "/ward-db", channel = cluster.root + "/channel-db"
        let first = try await driver.replicate(ward, try endpoint(node), ["--pull", "--user", "ward", "--password", Self.password])
        #expect(Set(try await driver.list(ward).keys) == ["n-1", "n-2"], "\(first.output)")
        _ = try await driver.replicate(channel, try endpoint(node), ["--pull", "--channels", "a", "--user", "app", "--password", Self.password])
        #expect(Set(try await driver.list(channel).keys) == ["n-1", "n-2", "s-1"])

        let docs = try await documents(node)
        let toSecret = try await Ferry.run(["--data", node.dataDirectory, "put", "n-1", #"{"type":"secret","channels":["a"]}"#, "--rev", docs["n-1"]!.rev])
        #expect(toSecret.status == 0, "\(toSecret.stderr)")
        let toB = try await Ferry.run(["--data", node.dataDirectory, "put", "n-2", #"{"type":"note","channels":["b"]}"#, "--rev", docs["n-2"]!.rev])
        #expect(toB.status == 0, "\(toB.stderr)")

        let second = try await driver.replicate(ward, try endpoint(node), ["--pull", "--user", "ward", "--password", Self.password])
        #expect(second.output.contains(#""id":"n-1""#) && second.output.contains(#""accessRemoved":true"#), "\(second.output)")
        #expect(Set(try await driver.list(ward).keys) == ["n-2"], "the app purged what its user may no longer read")
        let third = try await driver.replicate(channel, try endpoint(node), ["--pull", "--channels", "a", "--user", "app", "--password", Self.password])
        #expect(Set(try await driver.list(channel).keys) == ["n-1", "s-1"], "the app purged what left its channel: \(third.output)")
        await finish(cluster)
    }

    /// A live pull follows its user's policy as it changes on the running node: narrowed, the
    /// documents the user may no longer read are purged from the app at once and those it may
    /// now read arrive; the user removed, the replication ends and nothing more arrives.
    /// Writes `open-1` and `late-1` on the node, and adds a read-only user `name` that may read `open-*`.
    func addOpenReader(_ name: String, _ node: Node, _ cluster: Cluster) async throws {
        try await put(node, "open-1", #"{"n":1}"#)
        try await put(node, "late-1", #"{"n":2}"#)
        let file = cluster.root + "/\(name).password"
        try (Self.password + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let added = try await Ferry.run(
            ["--data", node.dataDirectory, "couch-user", "add", name, "--password-file", file, "--iterations", "10000", "--read", "open-*", "--read-only"])
        #expect(added.status == 0, "\(added.stderr)")
    }

    @Test func aLivePullFollowsItsUsersPolicyAsItChangesAndEndsWithTheUser() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-live-policy")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        try await addOpenReader("live", node, cluster)
        let app = cluster.root + "/live-db", log = cluster.root + "/live.log"
        let live = try driver.spawn(app, try endpoint(node), ["--pull", "--continuous", "300", "--user", "live", "--password", Self.password], log: log)
        defer { live.signal(SIGKILL) }
        func events() -> String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }
        /// What the app holds by its document events, in order (a removal purges).
        func held() -> Set<String> {
            var ids = Set<String>()
            for line in events().split(separator: "\n") where line.contains(#""event":"document""#) {
                guard let row = try? JSON.parse(Array(line.utf8)), let id = row["id"]?.stringValue, row["error"] == .null else { continue }
                if row["accessRemoved"] == .bool(true) { ids.remove(id) } else { ids.insert(id) }
            }
            return ids
        }
        try await waitUntil("the app holds what the user may read", timeout: 60) { held() == ["open-1"] }

        let narrowed = try await Ferry.run(["--data", node.dataDirectory, "couch-user", "set", "live", "--read", "late-*"])
        #expect(narrowed.status == 0, "\(narrowed.stderr)")
        try await waitUntil("open-1 purged and late-1 arrived, with no reconnection", timeout: 60) { held() == ["late-1"] }

        let removed = try await Ferry.run(["--data", node.dataDirectory, "couch-user", "rm", "live"])
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(await live.wait(timeout: 60) != nil, "the replication ended with its user: \(events())")
        try await put(node, "late-2", #"{"n":3}"#)
        #expect(Set(try await driver.list(app).keys) == ["late-1"], "\(events())")
        await finish(cluster)
    }

    @Test func anAppAwayWhileItsUsersRulesChangedIsSentItsRemovalsAndNewlyReadableDocumentsOnItsNextPull() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-away-policy")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        try await addOpenReader("away", node, cluster)
        let app = cluster.root + "/away-db"
        let args = ["--pull", "--user", "away", "--password", Self.password]
        let first = try await driver.replicate(app, try endpoint(node), args)
        #expect(Set(try await driver.list(app).keys) == ["open-1"], "\(first.output)")

        // While the app is away, the user's rules change; neither document changes.
        let narrowed = try await Ferry.run(["--data", node.dataDirectory, "couch-user", "set", "away", "--read", "late-*"])
        #expect(narrowed.status == 0, "\(narrowed.stderr)")
        let second = try await driver.replicate(app, try endpoint(node), args)
        #expect(second.summary["error"] == .null, "\(second.output)")
        #expect(Set(try await driver.list(app).keys) == ["late-1"], "open-1 purged, late-1 sent: \(second.output)")

        // A pull with nothing changed in between sends nothing again.
        let third = try await driver.replicate(app, try endpoint(node), args)
        #expect(third.summary["pulled"]?.intValue == 0, "\(third.output)")
        #expect(Set(try await driver.list(app).keys) == ["late-1"])
        await finish(cluster)
    }

    @Test func appsOnEitherEndOfAFerryMeshOfThreeGetEachOthersDocumentsAndBlobs() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-mesh")
        defer { cluster.cleanUp() }
        let nodes = ["a", "b", "c"].map { cluster.add($0) }
        let ids = try await cluster.ids(nodes)
        // A line a – b – c: the apps' writes cross a node that no app talks to.
        for (i, node) in nodes.enumerated().reversed() {
            var args: [String] = []
            for j in [i - 1, i + 1] where j >= 0 && j < nodes.count { args += ["--trust", ids[j]] }
            if i + 1 < nodes.count { args += ["--peer", "\(nodes[i + 1].url)#\(ids[i + 1])"] }
            try await start(node, cluster, extra: args)
        }
        let phone = cluster.root + "/phone", tablet = cluster.root + "/tablet"
        try await driver.put(phone, count: 5, prefix: "phone-")
        let photo = Data((0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 13) })
        try photo.write(to: URL(fileURLWithPath: cluster.root + "/photo.jpg"))
        _ = try await driver.run(["blob", phone, "phone-photo", cluster.root + "/photo.jpg", "--key", "photo"])
        let pushed = try await driver.replicate(phone, try endpoint(nodes[0]), ["--push", "--user", "app", "--password", Self.password])
        #expect(pushed.summary["pushed"]?.intValue == 6, "\(pushed.output)")
        try await driver.put(tablet, count: 3, prefix: "tablet-")
        let tabletPush = try await driver.replicate(tablet, try endpoint(nodes[2]), ["--push", "--user", "app", "--password", Self.password])
        #expect(tabletPush.summary["pushed"]?.intValue == 3, "\(tabletPush.output)")
        try await cluster.awaitConvergence(timeout: 60)

        _ = try await driver.replicate(tablet, try endpoint(nodes[2]), ["--pull", "--user", "app", "--password", Self.password])
        _ = try await driver.replicate(phone, try endpoint(nodes[0]), ["--pull", "--user", "app", "--password", Self.password])
        let onPhone = try await driver.list(phone), onTablet = try await driver.list(tablet)
        #expect(onPhone.count == 9 && Set(onPhone.keys) == Set(onTablet.keys), "phone \(onPhone.keys.sorted()) tablet \(onTablet.keys.sorted())")
        for (id, doc) in onPhone { #expect(onTablet[id]?.rev == doc.rev && onTablet[id]?.body == doc.body, "\(id)") }
        let blobs = tablet + "/db.cblite2/Attachments"
        let files = (try? FileManager.default.contentsOfDirectory(atPath: blobs)) ?? []
        #expect(files.contains { FileManager.default.contents(atPath: blobs + "/" + $0) == photo }, "the photo crossed the mesh: \(files)")
        await finish(cluster)
    }

    @Test func aRestartOfTheNodeMidPullOrMidPushOrOfTheAppMidPullLosesNothing() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-restart")
        defer { cluster.cleanUp() }
        let couchPort = Int.random(in: 20_000..<40_000)
        let node = try await startNode(cluster, couchPort: couchPort)
        let filler = String(repeating: "x", count: 1000)
        let count = 3000
        let loaded = try await Ferry.run(
            ["--data", node.dataDirectory, "import", "-"],
            stdin: (1...count).map { #"{"_id":"doc-\#($0)","n":\#($0),"pad":"\#(filler)"}"# }.joined(separator: "\n") + "\n")
        #expect(loaded.status == 0, "ferry import: \(loaded.stderr)")
        let app = cluster.root + "/app-db"
        let log = cluster.root + "/pull.log"
        let live = try driver.spawn(app, try endpoint(node), ["--pull", "--continuous", "300", "--user", "app", "--password", Self.password], log: log)
        defer { live.signal(SIGKILL) }
        func pulledIDs() -> Set<String> {
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            return Set(text.split(separator: "\n").compactMap { line -> String? in
                guard line.contains(#""event":"document""#), let row = try? JSON.parse(Array(line.utf8)) else { return nil }
                return row["error"] == .null ? row["id"]?.stringValue : nil
            })
        }
        try await waitUntil("the pull began", timeout: 60) { !pulledIDs().isEmpty }
        #expect(await node.stop() == 0)
        let atStop = pulledIDs().count
        #expect(atStop < count, "the node stopped mid-pull (\(atStop) of \(count) pulled)")
        try await node.restart()
        try await waitUntil("the app got every document after the node's restart", timeout: 120) { pulledIDs().count == count }
        live.signal(SIGKILL)
        _ = await live.wait(timeout: 30)
        #expect(try await driver.list(app).count == count)

        // The app killed mid-pull, then started again: it ends with everything.
        let second = cluster.root + "/second-db"
        let killed = try driver.spawn(second, try endpoint(node), ["--pull", "--user", "app", "--password", Self.password], log: cluster.root + "/killed.log")
        try await waitUntil("the second app's pull began", timeout: 60) {
            ((try? String(contentsOfFile: cluster.root + "/killed.log", encoding: .utf8)) ?? "").contains(#""event":"document""#)
        }
        killed.signal(SIGKILL)
        _ = await killed.wait(timeout: 30)
        let resumed = try await driver.replicate(second, try endpoint(node), ["--pull", "--user", "app", "--password", Self.password])
        #expect(resumed.summary["error"] == .null, "\(resumed.output)")
        let held = try await driver.list(second)
        #expect(held.count == count && held["doc-\(count)"]?.body["n"]?.intValue == Int64(count))

        // A push of as many, the node stopped under it: the app retries and every revision lands.
        let pusher = cluster.root + "/pusher-db"
        try await driver.put(pusher, count: count, prefix: "app-")
        let pushLog = cluster.root + "/push.log"
        let pushing = try driver.spawn(pusher, try endpoint(node), ["--push", "--continuous", "300", "--user", "app", "--password", Self.password], log: pushLog)
        defer { pushing.signal(SIGKILL) }
        try await waitUntil("the push began", timeout: 60) {
            ((try? String(contentsOfFile: pushLog, encoding: .utf8)) ?? "").contains(#""direction":"push""#)
        }
        #expect(await node.stop() == 0)
        try await node.restart()
        try await waitUntil("every pushed revision is on the node", timeout: 120) {
            (try? await node.admin.get("/"))?["docCount"]?.intValue == Int64(2 * count)
        }
        await finish(cluster)
    }

    /// A hand-made BLIP client (Python's websocket-client): what a broken or hostile app
    /// could send. Prints one JSON object of what each probe got.
    static let hostileClient = #"""
        import base64, json, sys, zlib, websocket
        url, user, password = sys.argv[1:4]
        def varint(n):
            out = bytearray()
            while True:
                b = n & 0x7F
                n >>= 7
                if n: out.append(b | 0x80)
                else:
                    out.append(b)
                    return bytes(out)
        def connect():
            auth = base64.b64encode(f"{user}:{password}".encode()).decode()
            ws = websocket.create_connection(url + "/_blipsync", subprotocols=["BLIP_3+CBMobile_3"],
                                             header=[f"Authorization: Basic {auth}"], suppress_origin=True, timeout=20)
            return ws, {"crc": 0, "n": 0}
        def request(ws, state, props, body=b"", flags=0):
            state["n"] += 1
            encoded = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in props)
            data = varint(len(encoded)) + encoded + body
            state["crc"] = zlib.crc32(data, state["crc"])
            ws.send_binary(varint(state["n"]) + varint(flags) + data + state["crc"].to_bytes(4, "big"))
            while True:  # the reply (the server's CRC is not checked here)
                frame = ws.recv()
                if not isinstance(frame, bytes): continue
                i = 0
                while frame[i] & 0x80: i += 1
                flags_at = i + 1
                kind = frame[flags_at] & 0x07
                if kind in (0, 4, 5): continue  # the server's own requests, ACKs
                payload = frame[flags_at + 1:-4]
                plen, j = 0, 0
                shift = 0
                while True:
                    b = payload[j]; plen |= (b & 0x7F) << shift; shift += 7; j += 1
                    if not b & 0x80: break
                parts = payload[j:j + plen].split(b"\0")[:-1]
                props = dict(zip(parts[0::2], parts[1::2]))
                return {"type": kind, "code": props.get(b"Error-Code", b"").decode(), "body": payload[j + plen:].decode(errors="replace")}
        def closed(ws):
            try:
                while True:
                    ws.recv()
            except websocket.WebSocketConnectionClosedException:
                pass
            except Exception:
                pass
            return {"status": ws.status, "code": getattr(ws, "close_status", None)}
        out = {}
        ws, st = connect()
        out["unknown"] = request(ws, st, [("Profile", "nonsense")])
        out["since"] = request(ws, st, [("Profile", "subChanges"), ("since", "yesterday")])
        out["propose"] = request(ws, st, [("Profile", "proposeChanges")], b"not json")
        out["forbidden"] = request(ws, st, [("Profile", "rev"), ("id", "order-9"), ("rev", "1-aa")], b'{"x":1}')
        out["collection"] = request(ws, st, [("Profile", "getCheckpoint"), ("client", "x"), ("collection", "3")])
        out["subscribe"] = request(ws, st, [("Profile", "subChanges"), ("continuous", "true")])
        out["again"] = request(ws, st, [("Profile", "subChanges"), ("continuous", "true")])
        ws.close()
        # The 3.1+ handshake: the default collection exists (no checkpoint yet), another does not.
        ws, st = connect()
        out["collections"] = request(ws, st, [("Profile", "getCollections")],
                                     json.dumps({"checkpoint_ids": ["cp-1", "cp-2"], "collections": ["_default._default", "shop.orders"]}).encode())
        out["indexed"] = request(ws, st, [("Profile", "getCheckpoint"), ("client", "cp-1"), ("collection", "0")])
        out["unindexed"] = request(ws, st, [("Profile", "getCheckpoint"), ("client", "cp-1")])
        ws.close()
        # Bytes that are no frame; then a frame that inflates past the limit.
        for name, payload in [("garbage", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
                              ("bomb", None)]:
            ws, st = connect()
            if payload is None:
                z = zlib.compressobj(6, zlib.DEFLATED, -15)
                data = z.compress(b"\0" * (4 << 20)) + z.flush(zlib.Z_SYNC_FLUSH)
                payload = varint(1) + varint(0x08) + data[:-4] + b"\0\0\0\0"
            ws.send_binary(payload)
            reason = b""
            try:
                opcode, frame = ws.recv_data(control_frame=True)
                reason = frame
            except Exception as e:
                reason = str(e).encode()
            out[name] = {"close": reason[:2].hex() if len(reason) >= 2 else "", "reason": reason[2:].decode(errors="replace")}
            ws.close()
        print(json.dumps(out))
        """#

    @Test func badFramesAndRequestsGetAClearErrorOrCloseAndTheNodeServesOn() async throws {
        let driver = try CouchbaseLite()
        guard FileManager.default.isExecutableFile(atPath: CouchSuite.python) else {
            Issue.record("\(CouchSuite.python) is missing: run scripts/install-deps.sh to create .venv-couch")
            return
        }
        let cluster = Cluster("cbl-hostile")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        try await put(node, "note-1", #"{"x":1}"#)
        let run = try await Shell.run(
            ["-c", Self.hostileClient, try endpoint(node), "nurse", Self.password], executable: CouchSuite.python,
            environment: ["PYTHONDONTWRITEBYTECODE": "1"], timeout: 120)
        let out = try #require(try? JSON.parse(Array(run.stdout.utf8)), "\(run.stdout) \(run.stderr)")
        #expect(out["unknown"]?["code"] == "404", "\(out)")
        #expect(out["since"]?["code"] == "400", "\(out)")
        #expect(out["propose"]?["code"] == "400", "\(out)")
        #expect(out["forbidden"]?["code"] == "403", "\(out)")
        #expect(out["collection"]?["code"] == "400", "\(out)")
        #expect(out["collections"]?["body"] == #"[{},null]"#, "\(out)")
        #expect(out["indexed"]?["code"] == "404" && out["unindexed"]?["code"] == "400", "\(out)")
        #expect(out["subscribe"]?["type"] == 1 && out["again"]?["code"] == "409", "one subscription per connection: \(out)")
        #expect(out["garbage"]?["close"] == "03ea", "a protocol error (1002): \(out)")
        #expect(out["bomb"]?["close"] == "03ea" && out["bomb"]?["reason"]?.stringValue?.contains("inflates") == true, "\(out)")
        #expect(try await documents(node)["order-9"] == nil, "nothing refused was stored")
        let after = try await driver.replicate(cluster.root + "/after", try endpoint(node), ["--pull", "--user", "nurse", "--password", Self.password])
        #expect(after.summary["error"] == .null && after.summary["pulled"]?.intValue == 1, "\(after.output)")
        await finish(cluster, allowing: ["revision refused"])
    }

    @Test func aPullByChannelGetsTheDocumentsNamingThem() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-channels")
        defer { cluster.cleanUp() }
        let node = try await startNode(cluster)
        try await put(node, "ward-a-1", #"{"channels":["ward-a"]}"#)
        try await put(node, "ward-a-2", #"{"channels":"ward-a"}"#)
        try await put(node, "ward-b-1", #"{"channels":["ward-b"]}"#)
        try await put(node, "none-1", #"{"x":1}"#)
        let app = cluster.root + "/app-db"
        let pulled = try await driver.replicate(
            app, try endpoint(node), ["--pull", "--channels", "ward-a", "--user", "app", "--password", Self.password])
        #expect(pulled.summary["error"] == .null, "\(pulled.output)")
        #expect(Set(try await driver.list(app).keys) == ["ward-a-1", "ward-a-2"])
        await finish(cluster)
    }

    @Test func aPinnedAppReplicatesOverTheLANListenerASessionWorksAndAWrongPasswordIsRefused() async throws {
        let driver = try CouchbaseLite()
        let cluster = Cluster("cbl-tls")
        defer { cluster.cleanUp() }
        let port = Int.random(in: 20_000..<40_000)
        let node = try await startNode(cluster, lan: port)
        try await put(node, "doc-1", #"{"x":1}"#)
        let cert = node.dataDirectory + "/identity/cert.pem"
        let url = "wss://127.0.0.1:\(port)/ferry"
        let pinned = try await driver.replicate(
            cluster.root + "/pinned", url, ["--pull", "--pinned-cert", cert, "--user", "app", "--password", Self.password])
        #expect(pinned.summary["error"] == .null, "\(pinned.output)")
        #expect(try await driver.list(cluster.root + "/pinned")["doc-1"] != nil)
        let unpinned = try await driver.replicate(cluster.root + "/unpinned", url, ["--pull", "--user", "app", "--password", Self.password])
        #expect(unpinned.summary["error"] != .null, "a self-signed certificate is refused without its pin")
        let wrong = try await driver.replicate(cluster.root + "/wrong", try endpoint(node), ["--pull", "--user", "app", "--password", "nope"])
        #expect(wrong.summary["error"]?["code"]?.intValue == 401, "\(wrong.output)")

        // A session from Sync Gateway's login (`POST /{db}/_session`), sent under either cookie name.
        let login = try await Shell.run(
            ["-s", "-X", "POST", "-H", "Content-Type: application/json", "-d", #"{"name":"app","password":"\#(Self.password)"}"#,
             try CouchSuite.couchURL(node) + "ferry/_session"], executable: "/usr/bin/curl")
        let session = try #require(try? JSON.parse(Array(login.stdout.utf8)), "\(login.stdout)")
        let id = try #require(session["session_id"]?.stringValue, "\(session)")
        #expect(session["cookie_name"] == "AuthSession")
        for cookie in [["--cookie", "AuthSession"], []] {
            let byCookie = try await driver.replicate(cluster.root + "/session\(cookie.count)", try endpoint(node), ["--pull", "--session", id] + cookie)
            #expect(byCookie.summary["error"] == .null && byCookie.summary["pulled"]?.intValue == 1, "\(cookie): \(byCookie.output)")
        }
        await finish(cluster, allowing: ["login", "password", "TLS", "handshake", "unauthorized"])
    }

    func finish(_ cluster: Cluster, allowing: [String] = []) async {
        for node in cluster.nodes {
            #expect(await node.stop() == 0, "\(node.name) stopped cleanly")
            let problems = node.problems(allowed: allowing)
            #expect(problems.isEmpty, "\(node.name): \(problems)\n\(node.logTail(30))")
        }
    }
}

/// Couchbase Lite C's test driver (`cbl-driver`) from `../shared/cbl/` (or `$FERRY_CBL_DIR`).
struct CouchbaseLite {
    let driver: String
    let environment: [String: String]

    /// The result of one `replicate`: its last line (the summary) and all it printed.
    struct Run {
        let summary: JSON
        let output: String
    }

    init() throws {
        let dir = ProcessInfo.processInfo.environment["FERRY_CBL_DIR"] ?? (CouchSuite.root + "/../shared/cbl")
        driver = dir + "/bin/cbl-driver"
        guard FileManager.default.isExecutableFile(atPath: driver) else {
            throw HarnessError("Couchbase Lite's driver is not at \(driver): set FERRY_CBL_DIR to the Couchbase Lite C directory")
        }
        // The library's versioned name, linked where the loader looks for it (the copy's own
        // symlinks may have been flattened into files).
        let lib = NSTemporaryDirectory() + "ferry-cbl-lib"
        try? FileManager.default.createDirectory(atPath: lib, withIntermediateDirectories: true)
        let link = lib + "/libcblite.so.3"
        if (try? FileManager.default.destinationOfSymbolicLink(atPath: link)) == nil {
            try? FileManager.default.removeItem(atPath: link)
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: dir + "/lib/libcblite.so.3.2.1")
        }
        var env = ProcessInfo.processInfo.environment
        env["LD_LIBRARY_PATH"] = lib
        environment = env
    }

    func run(_ arguments: [String], timeout: Double = 120) async throws -> Ferry.Result {
        try await Shell.run(arguments, executable: driver, environment: environment, timeout: timeout)
    }

    func replicate(_ db: String, _ url: String, _ options: [String]) async throws -> Run {
        let r = try await run(["replicate", db, url, "--timeout", "90"] + options)
        let last = r.stdout.split(separator: "\n").last.map(String.init) ?? ""
        guard let summary = try? JSON.parse(Array(last.utf8)) else {
            throw HarnessError("cbl-driver replicate printed no summary (\(r.status)): \(r.stdout) \(r.stderr)")
        }
        return Run(summary: summary, output: r.stdout)
    }

    func put(_ db: String, count: Int, prefix: String) async throws {
        let r = try await run(["put", db, String(count), prefix])
        guard r.status == 0 else { throw HarnessError("cbl-driver put failed: \(r.stdout) \(r.stderr)") }
    }

    /// The app's documents: ID → (revision, body).
    func list(_ db: String) async throws -> [String: (rev: String, body: JSON)] {
        let r = try await run(["ls", db])
        var out: [String: (String, JSON)] = [:]
        for line in r.stdout.split(separator: "\n") {
            guard let row = try? JSON.parse(Array(line.utf8)), let id = row["id"]?.stringValue, let rev = row["rev"]?.stringValue else { continue }
            out[id] = (rev, row["body"] ?? .null)
        }
        return out
    }

    /// A `replicate` left running, its output in `log`.
    func spawn(_ db: String, _ url: String, _ options: [String], log: String) throws -> ChildProcess {
        try ChildProcess.spawn(driver, ["replicate", db, url] + options, environment: environment, stdoutPath: log, stderrPath: log + ".err")
    }
}
