import ArgumentParser
import FerryCore
import Foundation

/// `ferry access`: the group's access rules and roles (signed by an admin, they replicate to
/// every member and bind every node), explain, and what was purged here.
struct AccessCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "access",
        abstract: "Show or change the group's access rules and roles: who may read, write and delete which documents.",
        discussion: """
            Rules and role assignments are signed by a group admin and replicate to every member; \
            every node enforces them. No rule: every member reads and writes everything.
            """,
        subcommands: [AccessList.self, AccessRuleCommand.self, AccessRoles.self, AccessExplain.self, AccessRemoved.self],
        defaultSubcommand: AccessList.self)
}

struct AccessList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List the rules, the role assignments and the version in force.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let result = try await node.call("GET", "/access")
        if global.json {
            Output.json(result)
            return
        }
        let version = result["version"]?.stringValue ?? "?"
        Output.line(version == "none" ? "no access rules: every member reads and writes everything" : "access rules version \(version)")
        let rules = result["rules"]?.items ?? []
        if !rules.isEmpty {
            Output.line("RULE\tROLES\tREAD\tWRITE\tDELETE\tSTATE")
            for r in rules {
                var state = r["state"]?.stringValue ?? "?"
                if state == "active" && r["inForce"]?.boolValue != true { state = "ignored (signer is no admin now)" }
                Output.line(
                    "\(r["name"]?.stringValue ?? "?")\t\(Self.list(r["roles"]))\t\(Self.match(r["read"]))\t\(Self.match(r["write"]))\t\(r["delete"]?.boolValue == true ? "yes" : "no")\t\(state)")
            }
        }
        let roles = result["roles"]?.items ?? []
        if !roles.isEmpty {
            Output.line("PRINCIPAL\tNAME\tROLES")
            for a in roles {
                let p = a["principal"]?.stringValue ?? "?"
                Output.line("\(p.hasPrefix("user:") ? p : String(p.prefix(12)))\t\(LogText.escape(a["name"]?.stringValue ?? "-"))\t\(Self.list(a["roles"]))")
            }
        }
        if let me = result["self"], version != "none" {
            Output.line("this node's roles: \(Self.list(me["roles"]))")
        }
    }

    static func list(_ v: JSON?) -> String {
        let items = (v?.items ?? []).compactMap(\.stringValue)
        return items.isEmpty ? "-" : items.joined(separator: ",")
    }

    static func match(_ v: JSON?) -> String {
        guard let v, v != .null else { return "-" }
        var parts: [String] = []
        let ids = (v["ids"]?.items ?? []).compactMap(\.stringValue)
        if !ids.isEmpty { parts.append("ids " + ids.joined(separator: ",")) }
        if let s = v["selector"] { parts.append(String(decoding: s.canonicalBytes, as: UTF8.self)) }
        return parts.isEmpty ? "all" : parts.joined(separator: " and ")
    }
}

struct AccessRuleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rule", abstract: "Add, replace or remove a rule (admins only).", subcommands: [AccessRuleAdd.self, AccessRuleRemove.self])
}

struct AccessRuleAdd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add",
        abstract: "Add a rule, or replace the rule of that name.",
        discussion: """
            A side (read or write) admits a document when its ID matches one of the --*-ids globs \
            (none given: any ID) and its body matches the --*-selector Mango selector (none given: \
            any body). --read-all / --write-all admit every document. Example:
              ferry access rule add ward-a --role ward-a --read-selector '{"ward":"a"}' --write-selector '{"ward":"a"}' --delete
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The rule's name (letters, digits, '-', '_', '.').") var name: String
    @Option(name: .customLong("role"), help: "A role the rule applies to (repeatable).") var roles: [String] = []
    @Flag(help: "The roles may read every document.") var readAll = false
    @Option(name: .customLong("read-ids"), help: "An ID glob the roles may read (repeatable).") var readIDs: [String] = []
    @Option(help: "A Mango selector (JSON) the roles may read.") var readSelector: String?
    @Flag(help: "The roles may write every document.") var writeAll = false
    @Option(name: .customLong("write-ids"), help: "An ID glob the roles may write (repeatable).") var writeIDs: [String] = []
    @Option(help: "A Mango selector (JSON) the roles may write.") var writeSelector: String?
    @Flag(help: "The roles may delete what they may write.") var delete = false

    func run() async throws {
        func side(all: Bool, ids: [String], selector: String?, _ name: String) throws -> JSON {
            if all && (!ids.isEmpty || selector != nil) {
                throw CLIError(message: "--\(name)-all admits everything: give it alone, without --\(name)-ids or --\(name)-selector", status: 64)
            }
            if !all && ids.isEmpty && selector == nil { return .null }
            var o: [String: JSON] = ["ids": .array(ids.map(JSON.string))]
            if let selector {
                do { o["selector"] = try JSON.parse(Array(selector.utf8)) } catch {
                    throw CLIError(message: "--\(name)-selector is not JSON: \(error)", status: 64)
                }
            }
            return .object(o)
        }
        let body: JSON = [
            "roles": .array(roles.map(JSON.string)),
            "read": try side(all: readAll, ids: readIDs, selector: readSelector, "read"),
            "write": try side(all: writeAll, ids: writeIDs, selector: writeSelector, "write"),
            "delete": .bool(delete),
        ]
        let node = try NodeClient.required(on: global.dataDirectory)
        let result = try await node.call("PUT", "/access/rules/\(NodeClient.path(name).replacingOccurrences(of: "/", with: "%2F"))", body: body)
        if global.json { Output.json(result) } else { Output.line("rule \(name) set (version \(result["version"]?.intValue ?? 0))") }
    }
}

struct AccessRuleRemove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rm", abstract: "Remove a rule.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The rule's name.") var name: String

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let result = try await node.call("DELETE", "/access/rules/\(NodeClient.path(name).replacingOccurrences(of: "/", with: "%2F"))")
        if global.json { Output.json(result) } else { Output.line("rule \(name) removed") }
    }
}

struct AccessRoles: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "roles",
        abstract: "Set the roles of a member (ID, unique ID prefix or name) or a CouchDB user (user:NAME); none withdraws them all.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The member, or user:NAME.") var principal: String
    @Argument(help: "The roles (each named by some rule).") var roles: [String] = []

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let result = try await node.call(
            "PUT", "/access/roles/\(NodeClient.path(principal).replacingOccurrences(of: "/", with: "%2F"))",
            body: ["roles": .array(roles.map(JSON.string))])
        if global.json {
            Output.json(result)
        } else {
            Output.line("\(result["principal"]?.stringValue ?? principal): \(roles.isEmpty ? "no roles" : roles.joined(separator: ", "))")
        }
    }
}

struct AccessExplain: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "explain", abstract: "Say which rule lets a member or user read, write or delete a document, or why none does.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The document's ID.") var id: String
    @Option(name: .customLong("for"), help: "The member (ID, prefix or name) or user:NAME.") var principal: String
    @Option(help: "Judge this body (JSON) instead of the document as stored here.") var body: String?

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        var query = "doc=\(Self.encode(id))&principal=\(Self.encode(principal))"
        if let body { query += "&body=\(Self.encode(body))" }
        let r = try await node.call("GET", "/access/explain?\(query)")
        if global.json {
            Output.json(r)
            return
        }
        func verdict(_ v: JSON?) -> String {
            (v?["allowed"]?.boolValue == true ? "yes" : "no") + ": " + (v?["reason"]?.stringValue ?? "?")
        }
        Output.line("""
            \(id) for \(r["principal"]?.stringValue ?? principal) (roles: \(AccessList.list(r["roles"])); rules version \(r["version"]?.stringValue ?? "?"))
            read    \(verdict(r["read"]))
            write   \(verdict(r["write"]))
            delete  \(r["delete"]?.boolValue == true ? "yes" : "no")
            """)
    }

    static func encode(_ s: String) -> String {
        var allowed = CharacterSet.urlQueryAllowed
        allowed.remove(charactersIn: "&=+?#%")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? s
    }
}

struct AccessRemoved: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "removed", abstract: "List the documents purged here because this node lost access to them (newest last).")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let r = try await node.call("GET", "/access/removed")
        if global.json {
            Output.json(r)
            return
        }
        Output.line("\(r["total"]?.intValue ?? 0) documents removed for access")
        for e in r["removed"]?.items ?? [] {
            Output.line("accessRemoved \(LogText.escape(e["id"]?.stringValue ?? "?")): \(e["reason"]?.stringValue ?? "")")
        }
    }
}

/// `ferry ui`: a one-time login link to the running node's web dashboard.
struct UICommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ui",
        abstract: "Print a one-time login link to the running node's web dashboard (valid two minutes, single use).",
        discussion: "Open it in a browser on this machine (the dashboard is on the loopback admin listener; from elsewhere, through an SSH tunnel: docs/operations.md).")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let node = try NodeClient.required(on: global.dataDirectory)
        let r = try await node.call("POST", "/ui/tokens", body: [:])
        let base = node.adminURL.hasSuffix("/") ? String(node.adminURL.dropLast()) : node.adminURL
        let url = base + (r["path"]?.stringValue ?? "/ui/")
        if global.json {
            Output.json(["url": .string(url), "expiresSeconds": r["expiresSeconds"] ?? .null])
        } else {
            Output.line(url)
        }
    }
}
