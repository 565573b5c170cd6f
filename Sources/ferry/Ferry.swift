import ArgumentParser
import FerryCore
import FerryStore
import Foundation

/// The `ferry` command: a thin CLI over FerryStore (parse, call, print).
@main
struct Ferry: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ferry",
        abstract: "Ferry: a peer-to-peer JSON document store for LANs.",
        discussion: """
            Data lives in --data DIR (default ./ferry-data, or $FERRY_DATA). \
            Every command accepts --json to print exactly one JSON value.
            Exit status: 0 ok, 1 error, 3 not found, 4 conflict, 64 usage.
            """,
        subcommands: [
            Put.self, Get.self, Remove.self, List.self, Changes.self, Conflicts.self, Purge.self, Info.self,
            Import.self, BlobCommand.self, Compact.self, Check.self, Watch.self,
        ]
    )

    static func main() async {
        do {
            var command = try parseAsRoot()
            if var async = command as? AsyncParsableCommand {
                try await async.run()
            } else {
                try command.run()
            }
        } catch let error as any FerryError {
            Output.fail(error.description, status: exitStatus(for: error))
        } catch let error as CLIError {
            Output.fail(error.message, status: error.status)
        } catch {
            exit(withError: error)
        }
    }

    static func exitStatus(for error: any FerryError) -> Int32 {
        switch error.code {
        case "not_found", "revision_not_found": return 3
        case "conflict": return 4
        default: return 1
        }
    }
}

/// Options every subcommand takes.
struct GlobalOptions: ParsableArguments {
    @Option(name: .long, help: "Data directory (default ./ferry-data, or $FERRY_DATA).")
    var data: String?

    @Flag(name: .long, help: "Print exactly one JSON value on stdout.")
    var json = false

    var dataDirectory: String {
        if let data { return data }
        if let env = ProcessInfo.processInfo.environment["FERRY_DATA"], !env.isEmpty { return env }
        return "ferry-data"
    }

    func openStore() throws -> DocumentStore {
        try DocumentStore.open(directory: dataDirectory)
    }
}

/// A CLI-level error with its exit status.
struct CLIError: Error {
    let message: String
    var status: Int32 = 1
}
