import ArgumentParser
import FerryCore

/// The policy flags of `trust set` and `couch-user add`/`set`, as the admin API's policy object.
struct PolicyOptions: ParsableArguments {
    @Option(help: "Document-ID globs it may read (repeatable; replaces the read rule).") var read: [String] = []
    @Flag(help: "It may read every document.") var readAll = false
    @Option(help: "Document-ID globs it may write (repeatable; replaces the write rule).") var write: [String] = []
    @Option(help: "Document types it may write (repeatable; replaces the write rule).") var writeType: [String] = []
    @Flag(help: "It may write every document.") var writeAll = false
    @Flag(help: "Read only: none of its writes are accepted, nor its deletions.") var readOnly = false
    @Flag(help: "Refuse its deletions.") var noDelete = false
    @Flag(help: "Accept its deletions.") var allowDelete = false

    func check() throws {
        if readAll && !read.isEmpty { throw ValidationError("--read-all and --read contradict each other") }
        let writes = [writeAll, readOnly, !write.isEmpty || !writeType.isEmpty].filter { $0 }.count
        if writes > 1 { throw ValidationError("give one of --write/--write-type, --write-all or --read-only") }
        if noDelete && allowDelete { throw ValidationError("--no-delete and --allow-delete contradict each other") }
        if readOnly && allowDelete { throw ValidationError("--read-only and --allow-delete contradict each other") }
    }

    /// Only the keys the flags name; empty when none is given.
    var policy: [String: JSON] {
        var policy: [String: JSON] = [:]
        if readAll { policy["read"] = "all" } else if !read.isEmpty { policy["read"] = ["ids": .array(read.map(JSON.string))] }
        if writeAll {
            policy["write"] = "all"
        } else if readOnly {
            policy["write"] = "none"
        } else if !write.isEmpty || !writeType.isEmpty {
            policy["write"] = ["ids": .array(write.map(JSON.string)), "types": .array(writeType.map(JSON.string))]
        }
        if readOnly || noDelete { policy["mayDelete"] = false } else if allowDelete { policy["mayDelete"] = true }
        return policy
    }
}
