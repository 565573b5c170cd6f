import ArgumentParser
import FerryCore
import Foundation

/// `ferry invite`: a single-use code that lets one new node join this node's group.
struct Invite: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a single-use invitation code for one new node (through the running node; admins only).",
        discussion: """
            On a node in no group, this founds one with the node as founder and first admin. \
            The code carries this node's ID, its addresses and a random secret; give it to \
            the new node's operator, who runs `ferry join CODE` there.
            """)

    @OptionGroup var global: GlobalOptions
    @Flag(help: "The new node becomes an admin too (it may invite and remove).") var admin = false
    @Option(help: "How long the code is valid: 90s, 10m, 2h or 1d (default 10m, at most 7d).") var expires = "10m"
    @Option(help: "HOST:PORT the new node dials (repeatable; default this node's listener addresses).") var address: [String] = []

    func validate() throws {
        guard let seconds = Self.seconds(expires) else { throw ValidationError("--expires: give a duration such as 90s, 10m, 2h or 1d") }
        // Checked here too, so the limit is named as the user types durations (the admin
        // API, which takes seconds, says 604800).
        guard seconds <= Self.maxSeconds else { throw ValidationError("--expires \(expires): an invitation is valid for at most 7d") }
    }

    /// The longest an invitation may be valid (the admin API's limit).
    static let maxSeconds = 7 * 86_400.0

    /// Seconds in `90s`, `10m`, `2h`, `1d` or a plain number of seconds (fractions allowed).
    static func seconds(_ text: String) -> Double? {
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        var number = Substring(text)
        var factor = 1.0
        if let last = text.last, let unit = units[last] {
            factor = unit
            number = text.dropLast()
        }
        guard let n = Double(number), n > 0, n.isFinite else { return nil }
        return n * factor
    }

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        var body: [String: JSON] = ["admin": .bool(admin), "expiresSeconds": .number(Self.seconds(expires) ?? 600)]
        if !address.isEmpty { body["addresses"] = .array(address.map(JSON.string)) }
        let result = try await node.call("POST", "/group/invitations", body: .object(body))
        if global.json {
            Output.json(result)
        } else {
            Output.line(result["code"]?.stringValue ?? "?")
            FileHandle.standardError.write(Data("single use, \(admin ? "admin, " : "")valid until \(result["expires"]?.stringValue ?? "?"); on the new node run: ferry join CODE\n".utf8))
        }
    }
}

/// `ferry join CODE`: joins the group of the code's inviter.
struct Join: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Join a group with an invitation code from `ferry invite` (through the running node).",
        discussion: "The node dials the inviter (pinned to the ID in the code), proves the code's secret, and from then on trusts and replicates with every member.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The code, ferry1-….") var code: String

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let result = try await node.call("POST", "/group/join", body: ["code": .string(code)])
        if global.json {
            Output.json(result)
        } else {
            Output.line("joined group \(result["group"]?.stringValue ?? "?") (\(result["members"]?.intValue ?? 0) members) through \(result["inviter"]?.stringValue ?? "?")")
        }
    }
}

/// `ferry group`: the running node's group and its members.
struct GroupCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "group", abstract: "Show or change the node's group (signed membership that replicates to every member).",
        subcommands: [GroupList.self, GroupRemove.self], defaultSubcommand: GroupList.self)
}

struct GroupList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List the group's members: name, ID prefix, admin, state.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let result = try await node.call("GET", "/group")
        if global.json {
            Output.json(result)
            return
        }
        guard let group = result["group"]?.stringValue else {
            Output.line("this node belongs to no group (found one with `ferry invite`, or join one with `ferry join CODE`)")
            return
        }
        let me = result["self"]?.stringValue
        Output.line("group \(group)")
        Output.line("NAME\tID\tADMIN\tSTATE")
        for m in result["members"]?.items ?? [] {
            let id = m["id"]?.stringValue ?? "?"
            var state = m["state"]?.stringValue ?? "?"
            if m["founder"]?.boolValue == true { state += " (founder)" }
            if id == me { state += " (this node)" }
            Output.line("\(LogText.escape(m["name"]?.stringValue ?? "-"))\t\(id.prefix(12))\t\(m["admin"]?.boolValue == true ? "yes" : "no")\t\(state)")
        }
    }
}

struct GroupRemove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove", abstract: "Remove a member (admins only): every member stops trusting it as the removal replicates.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The member's ID, a unique ID prefix (8+ digits), or its unique name.") var member: String

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let result = try await node.call("DELETE", "/group/members/\(NodeClient.path(member).replacingOccurrences(of: "/", with: "%2F"))")
        if global.json { Output.json(result) } else { Output.line("removed \(result["id"]?.stringValue ?? member)") }
    }
}

extension JSON {
    var items: [JSON] {
        if case .array(let a) = self { return a }
        return []
    }
}
