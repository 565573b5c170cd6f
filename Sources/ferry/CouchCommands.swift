import ArgumentParser
import FerryCore
import FerryNode
import Foundation

/// `ferry couch-user NAME`: prints a `couch.users` entry with a salted password hash.
struct CouchUserCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "couch-user", abstract: "Print a CouchDB API user entry (name, PBKDF2-SHA256 password hash, policy) for the config file.",
        discussion: """
            Add the printed object to "couch": {"users": [...]} in the node's config and restart \
            it. The password is read from --password-file (its first line), else from stdin when \
            it is not a terminal, else asked for twice. It is never printed; only its salted hash is.
            """)

    @Argument(help: "The user name (no ':'; 'admin' is the admin key's).") var name: String
    @Option(help: "Read the password from the first line of this file.") var passwordFile: String?
    @Option(help: "PBKDF2 iterations (10000 or more). Default 600000.") var iterations: Int = 600_000
    @Flag(help: "The user may read everything and write nothing (edit \"policy\" for finer rules).") var readOnly = false

    func run() async throws {
        let password = try readPassword()
        let entry: JSON
        do {
            entry = try NodeConfiguration.Couch.userEntry(name: name, password: password, iterations: iterations, readOnly: readOnly)
        } catch let error as any FerryError {
            throw CLIError(message: error.description, status: 64)
        }
        Output.line(entry.canonicalString)
    }

    func readPassword() throws -> String {
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
}
