import ArgumentParser
import FerryCore
import FerryCouch
import FerryNode
import Foundation

/// `ferry couch-user add|set|ls|rm|print`: the CouchDB API's users, changed while the node runs.
struct CouchUserCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "couch-user", abstract: "Manage the CouchDB API's users (name, password, policy) while the node runs.",
        discussion: """
            Changes go through the running node when there is one (they apply to the next \
            request; a removed user's or an old password's sessions end), else to \
            DATA/couch-users.json. Users in the config file's couch.users are read-only here. \
            A password is read from --password-file (its first line), else from stdin when it is \
            not a terminal, else asked for twice; it is hashed here (PBKDF2-SHA256) and never \
            printed, logged or sent anywhere.
            """,
        subcommands: [CouchUserAdd.self, CouchUserSet.self, CouchUserList.self, CouchUserRemove.self, CouchUserPrint.self],
        defaultSubcommand: CouchUserPrint.self)
}

/// The options every user command that takes a password shares, and how it reads one.
struct PasswordOptions: ParsableArguments {
    @Option(help: "Read the password from the first line of this file.") var passwordFile: String?
    @Option(help: "PBKDF2 iterations (10000 or more). Default 600000.") var iterations: Int = 600_000

    func readPassword(for name: String) throws -> String {
        if let passwordFile {
            guard let text = try? String(contentsOfFile: passwordFile, encoding: .utf8) else {
                throw CLIError(message: "cannot read the password file \(passwordFile)")
            }
            return String(text.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false).first ?? "")
        }
        if isatty(STDIN_FILENO) == 0 {
            return readLine(strippingNewline: true) ?? ""
        }
        guard let first = getpass("Password for \(name): ").map({ String(cString: $0) }),
            let second = getpass("Again: ").map({ String(cString: $0) })
        else { throw CLIError(message: "cannot read a password from the terminal") }
        guard first == second else { throw CLIError(message: "the passwords differ") }
        return first
    }

    /// The salted hash of the password read; an empty password is refused.
    func hash(for name: String) throws -> CouchPasswordHash {
        let password = try readPassword(for: name)
        guard !password.isEmpty else { throw CLIError(message: "the password is empty", status: 64) }
        do { return try CouchPasswordHash(password: password, iterations: iterations) } catch {
            throw CLIError(message: error.description, status: 64)
        }
    }
}

struct CouchUserAdd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add", abstract: "Add a CouchDB API user; by default it may read and write every document.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The user name (no ':'; 'admin' is the admin key's).") var name: String
    @OptionGroup var password: PasswordOptions
    @OptionGroup var rules: PolicyOptions

    func validate() throws {
        if let problem = CouchUser.nameProblem(name) { throw ValidationError("user name \(LogText.escape(name)) \(problem)") }
        try rules.check()
    }

    func run() async throws {
        let hash = try password.hash(for: name)
        var body: [String: JSON] = ["name": .string(name), "passwordHash": .string(hash.description)]
        if !rules.policy.isEmpty { body["policy"] = .object(rules.policy) }
        let result: JSON
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            result = try await node.call("POST", "/couch/users", body: .object(body))
        } else {
            try global.requireData()
            let store = try CouchUserStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            let user = try CouchUserStore.parseUser(.object(body), source: "ferry couch-user add")
            try store.add(user)
            result = CouchUserStore.Entry(name: user.name, policy: user.policy, source: .api).json
        }
        if global.json { Output.json(result) } else { Output.line("added CouchDB user \(LogText.escape(name))") }
    }
}

struct CouchUserSet: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Change a CouchDB API user's password (--password) or policy; what is not given stays as it is.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The user name.") var name: String
    @Flag(help: "Set a new password (read as for `add`).") var password = false
    @OptionGroup var passwordOptions: PasswordOptions
    @OptionGroup var rules: PolicyOptions

    func validate() throws { try rules.check() }

    func run() async throws {
        var body: [String: JSON] = [:]
        if password || passwordOptions.passwordFile != nil { body["passwordHash"] = .string(try passwordOptions.hash(for: name).description) }
        if !rules.policy.isEmpty { body["policy"] = .object(rules.policy) }
        guard !body.isEmpty else {
            throw CLIError(message: "nothing to change: give --password, --read, --write, --read-only, --no-delete or the like", status: 64)
        }
        let result: JSON
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            result = try await node.call("PUT", "/couch/users/\(Self.pathComponent(name))", body: .object(body))
        } else {
            try global.requireData()
            let store = try CouchUserStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            let change = try CouchUserStore.parseChange(.object(body), source: "ferry couch-user set")
            guard let entry = try store.update(name, change) else {
                throw CLIError(message: "no CouchDB user \(LogText.escape(name)) (add one with `ferry couch-user add`)", status: 3)
            }
            result = entry.json
        }
        if global.json { Output.json(result) } else { Output.line(CouchUserList.line(result)) }
    }

    /// A user name as one URL path segment.
    static func pathComponent(_ name: String) -> String {
        name.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "/?#"))) ?? name
    }
}

struct CouchUserList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List the CouchDB API's users and their policies.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let users: JSON
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            users = try await node.call("GET", "/couch/users")["users"] ?? []
        } else {
            try global.requireData()
            let store = try CouchUserStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            users = .array(store.entries.map(\.json))
        }
        if global.json {
            Output.json(users)
        } else if case .array(let list) = users {
            if list.isEmpty {
                Output.line("no CouchDB users (add one with `ferry couch-user add NAME`)")
                return
            }
            Output.line("NAME\tSOURCE\tPOLICY")
            for u in list { Output.line(Self.line(u)) }
        }
    }

    static func line(_ u: JSON) -> String {
        "\(LogText.escape(u["name"]?.stringValue ?? "?"))\t\(u["source"]?.stringValue ?? "?")\t\(TrustList.describe(u["policy"]))"
    }
}

struct CouchUserRemove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rm", abstract: "Remove a CouchDB API user; its sessions end.")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The user name.") var name: String

    func run() async throws {
        if let node = try await NodeClient.settled(on: global.dataDirectory) {
            _ = try await node.call("DELETE", "/couch/users/\(CouchUserSet.pathComponent(name))")
        } else {
            try global.requireData()
            let store = try CouchUserStore(dataDirectory: global.dataDirectory, configuration: NodeConfiguration())
            guard try store.remove(name) else { throw CLIError(message: "no CouchDB user \(LogText.escape(name))", status: 3) }
        }
        if global.json { Output.json(["name": .string(name), "removed": true]) } else { Output.line("removed CouchDB user \(LogText.escape(name))") }
    }
}

/// `ferry couch-user print NAME` (or `ferry couch-user NAME`): prints a `couch.users` entry
/// for the config file, with a salted password hash.
struct CouchUserPrint: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "print", abstract: "Print a CouchDB API user entry (name, PBKDF2-SHA256 password hash, policy) for the config file.",
        discussion: """
            Add the printed object to "couch": {"users": [...]} in the node's config and restart \
            it (or use `ferry couch-user add`, which needs no restart). The password is read as \
            for `add`. It is never printed; only its salted hash is.
            """)

    @Argument(help: "The user name (no ':'; 'admin' is the admin key's).") var name: String
    @OptionGroup var password: PasswordOptions
    @Flag(help: "The user may read everything and write nothing (edit \"policy\" for finer rules).") var readOnly = false

    func run() async throws {
        let password = try self.password.readPassword(for: name)
        let entry: JSON
        do {
            entry = try NodeConfiguration.Couch.userEntry(name: name, password: password, iterations: self.password.iterations, readOnly: readOnly)
        } catch let error as any FerryError {
            throw CLIError(message: error.description, status: 64)
        }
        Output.line(entry.canonicalString)
    }
}
