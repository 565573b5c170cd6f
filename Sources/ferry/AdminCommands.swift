import ArgumentParser
import FerryCore
import FerryNode
import Foundation

/// `ferry status`: the running node, its peers and its replications.
struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the running node (through its admin API): identity, documents, peers and replications.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let info = try await node.call("GET", "/")
        let peers = try await node.call("GET", "/peers")
        let replications = try await node.call("GET", "/replications")
        let group = try await node.call("GET", "/group")
        if global.json {
            Output.json(["node": info, "peers": peers["peers"] ?? [], "replications": replications["replications"] ?? [], "group": group])
            return
        }
        Output.line("""
            node     \(info["id"]?.stringValue ?? "?") (\(info["name"]?.stringValue ?? "?"), version \(info["version"]?.stringValue ?? "?"))
            group    \(info["group"]?.stringValue ?? "?"), listening on port \(info["port"]?.intValue ?? 0), admin \(node.adminURL)
            couchdb  \(node.nodeFile["couchURL"]?.stringValue ?? "-")\(node.nodeFile["couchLANURL"]?.stringValue.map { ", LAN \($0)" } ?? "")
            docs     \(info["docCount"]?.intValue ?? 0) live, \(info["deletedCount"]?.intValue ?? 0) deleted, \(info["conflictedCount"]?.intValue ?? 0) conflicted; last sequence \(info["lastSequence"]?.intValue ?? 0)
            digest   \(info["digest"]?.stringValue ?? "?")
            """)
        if let id = group["group"]?.stringValue {
            let members = group["members"]?.items.filter { $0["state"]?.stringValue == "member" }.count ?? 0
            Output.line("members  group \(id.prefix(12)): \(members) active\(group["admin"]?.boolValue == true ? ", this node is an admin" : "")")
        }
        if let lag = info["schedulerLag"], let worst = lag["worstMs"]?.intValue {
            let slow = lag["slowWakes"]?.intValue ?? 0
            Output.line("sched    woken \(lag["lastMs"]?.intValue ?? 0) ms late last, \(worst) ms at worst\(slow > 0 ? "; \(slow) wakes over 500 ms: something blocked the node's threads" : "")")
        }
        if let access = info["access"], let version = access["version"]?.stringValue, version != "none" {
            Output.line("access   rules version \(version): \(access["rules"]?.intValue ?? 0) rules, \(access["removed"]?.intValue ?? 0) documents removed here")
        }
        PeerTable.print(peers["peers"], discovery: peers["discovery"])
        if case .array(let list)? = replications["replications"], !list.isEmpty {
            Output.line("replications:")
            for r in list {
                let s = r["status"]
                // The URL comes without its password (the admin API never returns one).
                let kind = r["kind"]?.stringValue == "couchdb" ? " (CouchDB)" : ""
                let error = s?["error"]?.stringValue.map { e in
                    let how = s?["errorTransient"]?.boolValue == true ? "transient, retrying" : "permanent"
                    return "  error (\(how)): \(e)"
                } ?? ""
                Output.line(
                    "  \(r["id"]?.stringValue ?? "?")  \(r["direction"]?.stringValue ?? "?") \(r["url"]?.stringValue ?? "?")\(kind)  \(s?["activity"]?.stringValue ?? "?")  pushed \(s?["pushed"]?.intValue ?? 0) pulled \(s?["pulled"]?.intValue ?? 0) rejected \(s?["rejected"]?.intValue ?? 0)\(error)"
                )
            }
        }
    }
}

/// `ferry peers`: every peer the running node knows, trusted or not.
struct Peers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the peers the running node knows (discovered or static), whether trusted and connected.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let peers = try await node.call("GET", "/peers")
        if global.json { Output.json(peers["peers"] ?? []) } else { PeerTable.print(peers["peers"], discovery: peers["discovery"]) }
    }
}

/// Prints peers one per line.
enum PeerTable {
    static func print(_ peers: JSON?, discovery: JSON? = nil) {
        let note = discoveryNote(discovery)
        guard case .array(let list)? = peers, !list.isEmpty else {
            Output.line("peers: none seen yet")
            if let note { Output.line(note) }
            return
        }
        // With peers listed, only discovery that should work and does not is worth a line.
        if let note, discovery?["state"]?.stringValue == "unavailable" { Output.line(note) }
        Output.line("peers:")
        for p in list {
            let trusted = p["trusted"]?.boolValue == true ? "trusted" : "UNTRUSTED"
            var connected = p["connected"]?.boolValue == true ? "connected" : "not connected"
            if let direction = p["direction"]?.stringValue { connected += " (\(direction))" }
            var activity = p["replication"]?["activity"]?.stringValue.map { ", replication \($0)" } ?? ""
            if let blobs = blobProgress(p["replication"]) { activity += " (\(blobs))" }
            let error = p["replication"]?["error"]?.stringValue.map { "  error: \($0)" } ?? ""
            // Only a connected peer's report is current.
            var digest = ""
            if p["connected"]?.boolValue == true, let same = p["digestMatches"]?.boolValue {
                digest = same ? ", digest equal" : ", digest DIFFERS"
            }
            // Names and addresses come from other nodes (DNS-SD): shown escaped, never raw.
            Output.line(
                "  \(p["id"]?.stringValue ?? "?")  \(LogText.escape(p["name"]?.stringValue ?? "-"))  \(LogText.escape(location(p)))  [\(p["source"]?.stringValue ?? "?")] \(trusted), \(connected)\(activity)\(digest)\(LogText.escape(error))"
            )
        }
    }

    /// Blob bytes moved of those under way in each direction, while a transfer is unfinished:
    /// `blobs 120.0 MiB/200.0 MiB received (60%)`; nil when none is.
    static func blobProgress(_ status: JSON?) -> String? {
        var parts: [String] = []
        for (done, total, verb) in [("blobBytesReceived", "blobBytesToReceive", "received"), ("blobBytesSent", "blobBytesToSend", "sent")] {
            guard let moved = status?[done]?.intValue, let all = status?[total]?.intValue, all > 0, moved < all else { continue }
            parts.append("\(ProgressBar.bytes(moved))/\(ProgressBar.bytes(all)) \(verb) (\(moved * 100 / all)%)")
        }
        return parts.isEmpty ? nil : "blobs " + parts.joined(separator: ", ")
    }

    /// A line on discovery when it finds no one (off or unavailable), with what to do instead.
    static func discoveryNote(_ discovery: JSON?) -> String? {
        let instead = "add a peer with `ferry serve --peer wss://HOST:PORT/ferry/sync#NODEID`, or join a group with `ferry join CODE`"
        switch discovery?["state"]?.stringValue {
        case "off": return "discovery: off (--no-discovery); \(instead)"
        case "unavailable":
            let reason = discovery?["reason"]?.stringValue.map { " (\(LogText.escape($0)))" } ?? ""
            return "discovery: DNS-SD unavailable\(reason): start avahi-daemon (Debian: apt-get install avahi-daemon), or \(instead)"
        default: return nil
        }
    }

    /// Where the peer is: the URL this node dials (a static peer's), else the discovered
    /// addresses and port, else the address an inbound peer connected from.
    static func location(_ p: JSON) -> String {
        if let url = p["url"]?.stringValue { return url }
        let addresses = strings(p["addresses"])
        if !addresses.isEmpty { return addresses.joined(separator: ",") + ":" + (p["port"]?.intValue.map(String.init) ?? "-") }
        let remote = strings(p["replication"]?["remoteAddresses"])
        return remote.isEmpty ? "-" : "from " + remote.joined(separator: ",")
    }

    static func strings(_ json: JSON?) -> [String] {
        if case .array(let a)? = json { return a.compactMap(\.stringValue) }
        return []
    }
}

/// `ferry trust`: the node's trust store (which node IDs may replicate, and how).
struct Trust: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Manage the trust store: the node IDs allowed to replicate with this node.",
        discussion: """
            Changes go through the running node when there is one (they apply to the next \
            connection), else to DATA/trust.json. Entries from a config file are read-only here. \
            `add` refuses an ID already trusted; `set` changes an entry, and only what it names.
            """,
        subcommands: [TrustAdd.self, TrustSet.self, TrustList.self, TrustRemove.self])
}

struct TrustAdd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "add", abstract: "Trust a node ID, optionally with a restricted policy.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The node ID (its `ferry id`).") var id: String
    @Option(help: "A name to show for it.") var name: String?
    @Option(help: "Document-ID globs it may read (repeatable; default all).") var read: [String] = []
    @Option(help: "Document-ID globs it may write (repeatable; default all).") var write: [String] = []
    @Option(help: "Document types it may write (repeatable).") var writeType: [String] = []
    @Flag(help: "Refuse its deletions.") var noDelete = false
    @Flag(help: "Read only: it may pull, but none of its writes are accepted.") var readOnly = false

    func validate() throws {
        if NodeIDFormat.normalized(id) == nil { throw ValidationError("\(id): \(NodeIDFormat.requirement)") }
        if let name { try TrustList.validateName(name) }
    }

    func run() async throws {
        var entry: [String: JSON] = ["id": .string(id.lowercased())]
        if let name { entry["name"] = .string(name) }
        var policy: [String: JSON] = [:]
        if !read.isEmpty { policy["read"] = ["ids": .array(read.map(JSON.string))] }
        if readOnly {
            policy["write"] = "none"
        } else if !write.isEmpty || !writeType.isEmpty {
            policy["write"] = ["ids": .array(write.map(JSON.string)), "types": .array(writeType.map(JSON.string))]
        }
        if noDelete || readOnly { policy["mayDelete"] = false }
        if !policy.isEmpty { entry["policy"] = .object(policy) }
        let result: JSON
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            result = try await node.call("POST", "/trust", body: .object(entry))
        } else {
            if !global.create { try global.requireDirectory() }
            let store = try TrustStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            let t = try NodeConfiguration.TrustEntry(parsing: .object(entry), source: "ferry trust add")
            let e = TrustStore.Entry(nodeID: t.nodeID, name: t.name, policy: t.policy, source: .api)
            try store.add(e)
            result = e.json
        }
        if global.json { Output.json(result) } else { Output.line("trusted \(result["id"]?.stringValue ?? id)") }
    }
}

/// `ferry trust set ID …`: changes what an existing entry says, and nothing it does not name.
struct TrustSet: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Change a trusted node's name or policy; what is not given stays as it is.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The node ID.") var id: String
    @Option(help: "A new name to show for it.") var name: String?
    @OptionGroup var rules: PolicyOptions

    func validate() throws {
        if let name { try TrustList.validateName(name) }
        try rules.check()
    }

    /// The change in the API's form: only the keys the flags name.
    var body: JSON {
        var o: [String: JSON] = [:]
        if let name { o["name"] = .string(name) }
        if !rules.policy.isEmpty { o["policy"] = .object(rules.policy) }
        return .object(o)
    }

    func run() async throws {
        let id = self.id.lowercased()
        guard body.objectValue?.isEmpty == false else {
            throw CLIError(message: "nothing to change: give --name, --read, --write, --read-only, --no-delete or the like")
        }
        let result: JSON
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            result = try await node.call("PUT", "/trust/\(id)", body: body)
        } else {
            let store = try TrustStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            let change = try TrustStore.Change(parsing: body, id: id, source: "ferry trust set")
            guard let e = try store.update(id, change) else {
                throw CLIError(message: "node \(id) is not in the trust store (add it with `ferry trust add`)", status: 3)
            }
            result = e.json
        }
        if global.json { Output.json(result) } else { Output.line(TrustList.line(result)) }
    }
}

struct TrustList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List trusted node IDs with their policies.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let entries: JSON
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            entries = try await node.call("GET", "/trust")["trusted"] ?? []
        } else {
            let store = try TrustStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            entries = .array(store.entries.map(\.json))
        }
        if global.json {
            Output.json(entries)
        } else if case .array(let list) = entries {
            if list.isEmpty {
                Output.line("no trusted nodes (add one with `ferry trust add ID`)")
                return
            }
            Output.line("ID\tNAME\tSOURCE\tPOLICY")
            for e in list { Output.line(Self.line(e)) }
        }
    }

    /// An entry as one tab-separated line: ID, name (escaped), source, policy.
    static func line(_ e: JSON) -> String {
        "\(e["id"]?.stringValue ?? "?")\t\(LogText.escape(e["name"]?.stringValue ?? "-"))\t\(e["source"]?.stringValue ?? "?")\t\(describe(e["policy"]))"
    }

    /// A policy as the config file takes it, minimally: `{"read":…,"write":…,"mayDelete":…}`
    /// with empty lists left out.
    static func describe(_ policy: JSON?) -> String {
        guard let policy else { return "" }
        func rule(_ r: JSON?) -> String {
            guard let o = r?.objectValue else { return r?.canonicalString ?? "null" }
            return JSON.object(o.filter { $0.value != .array([]) }).canonicalString
        }
        return #"{"read":\#(rule(policy["read"])),"write":\#(rule(policy["write"])),"mayDelete":\#(policy["mayDelete"]?.canonicalString ?? "null")}"#
    }

    /// Refuses a name with control or format characters as a usage error.
    static func validateName(_ name: String) throws {
        do { try NodeName.validate(name) } catch { throw ValidationError("--name: \(error.description)") }
    }
}

struct TrustRemove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rm", abstract: "Stop trusting a node ID.")

    @OptionGroup var global: GlobalOptions
    @Argument var id: String

    func run() async throws {
        let id = self.id.lowercased()
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            _ = try await node.call("DELETE", "/trust/\(id)")
        } else {
            let store = try TrustStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            guard try store.remove(id) else { throw CLIError(message: "node \(id) is not in the trust store", status: 3) }
        }
        if global.json { Output.json(["id": .string(id), "removed": true]) } else { Output.line("removed \(id)") }
    }
}
