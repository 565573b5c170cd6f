import FerryCore
import FerryStore
import Foundation

/// Writes command results to stdout and errors to stderr.
enum Output {
    static func json(_ value: JSON) {
        print(value.canonicalString)
    }

    static func line(_ text: String) {
        print(text)
    }

    static func error(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }

    static func fail(_ message: String, status: Int32) -> Never {
        // One line, naming the problem.
        error("ferry: " + message.replacingOccurrences(of: "\n", with: " "))
        exit(status)
    }

    /// `SEQ<TAB>ID<TAB>REV[<TAB>deleted]`, as `changes` and `watch` print it.
    static func changeLine(_ c: Change) -> String {
        "\(c.sequence)\t\(c.id)\t\(c.revision)\(c.deleted ? "\tdeleted" : "")"
    }

    static func change(_ c: Change) -> JSON {
        ["seq": .int(Int64(c.sequence)), "id": .string(c.id.rawValue), "rev": .string(c.revision.description),
         "deleted": .bool(c.deleted)]
    }
}

/// Reads JSON input from an argument, a file path with `@`, or stdin (`-`).
enum Input {
    static func readAll(_ argument: String?) throws -> [UInt8] {
        if let argument, argument != "-" {
            if argument.hasPrefix("@") {
                let path = String(argument.dropFirst())
                guard let data = FileManager.default.contents(atPath: path) else {
                    throw CLIError(message: "cannot read file \(path)")
                }
                return Array(data)
            }
            return Array(argument.utf8)
        }
        if argument == nil && isatty(STDIN_FILENO) == 1 {
            throw CLIError(message: "no JSON body given: pass it as an argument, or '-' to read stdin", status: 64)
        }
        return Array(FileHandle.standardInput.readDataToEndOfFile())
    }

    static func parseJSON(_ bytes: [UInt8]) throws -> JSON {
        do { return try JSON.parse(bytes) } catch { throw CLIError(message: error.description) }
    }

    static func documentID(_ text: String) throws -> DocumentID {
        do { return try DocumentID(text) } catch { throw CLIError(message: error.description) }
    }

    static func revision(_ text: String) throws -> RevisionID {
        do { return try RevisionID(text) } catch { throw CLIError(message: error.description) }
    }

    /// Splits `_id`, `_rev` and `_deleted` off a body given on the command line or in an import.
    static func splitMeta(_ value: JSON) throws -> (body: JSON, id: String?, rev: String?, deleted: Bool) {
        let input = try DocumentInput(parsing: value)
        return (input.body, input.id, input.rev, input.deleted)
    }
}
