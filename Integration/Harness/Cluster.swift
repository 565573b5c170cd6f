import FerryCore
import Foundation

/// A set of nodes under one temporary root: created, started, awaited to converge by
/// comparing digests, and torn down (every process killed, every log checked).
public final class Cluster: @unchecked Sendable {
    // @unchecked: driven by one test at a time.
    public let root: String
    public private(set) var nodes: [Node] = []

    public init(_ label: String) {
        root = NSTemporaryDirectory() + "ferry-it-\(label)-\(UUID().uuidString.prefix(8))"
        try? FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
    }

    /// Adds a node (not started).
    @discardableResult
    public func add(_ name: String, host: LabHost? = nil) -> Node {
        let node = Node(name: name, root: root, host: host)
        nodes.append(node)
        return node
    }

    /// The node IDs of `nodes`, in order.
    public func ids(_ nodes: [Node]) async throws -> [String] {
        var ids: [String] = []
        for n in nodes { ids.append(try await n.id) }
        return ids
    }

    /// Waits until every node (or `among`) reports the same digest. On timeout it throws
    /// with a diff: which documents differ, and their revision on each node.
    public func awaitConvergence(among: [Node]? = nil, timeout: Double = 60) async throws {
        let nodes = among ?? self.nodes
        let converged = try await eventually(timeout, every: .milliseconds(100)) {
            var digests = Set<String>()
            for n in nodes { digests.insert(try await n.admin.digest) }
            return digests.count == 1
        }
        if converged { return }
        throw HarnessError("nodes did not converge in \(timeout) s:\n" + (try await diff(nodes)))
    }

    /// The documents whose current revision differs between nodes (at most 20 listed).
    public func diff(_ nodes: [Node]) async throws -> String {
        var maps: [(String, [String: String])] = []
        for n in nodes { maps.append((n.name, try await n.admin.revisions())) }
        let ids = Set(maps.flatMap { $0.1.keys }).sorted()
        var lines: [String] = []
        for id in ids {
            let revs = maps.map { $0.1[id] ?? "-" }
            if Set(revs).count > 1 {
                lines.append("  \(id): " + zip(maps, revs).map { "\($0.0.0)=\($0.1.prefix(12))" }.joined(separator: " "))
            }
        }
        let counts = maps.map { "\($0.0): \($0.1.count) docs" }.joined(separator: ", ")
        return "\(counts)\n\(lines.count) documents differ\(lines.isEmpty ? " (conflict leaves differ)" : ""):\n" + lines.prefix(20).joined(separator: "\n")
    }

    /// Stops every node with SIGTERM and returns the non-zero exits and the log problems.
    public func shutDown(allowedLogLines: [String] = []) async -> [String] {
        var failures: [String] = []
        for n in nodes where n.isRunning {
            let status = await n.stop()
            if status != 0 { failures.append("\(n.name) exited \(status) on SIGTERM") }
        }
        for n in nodes {
            for p in n.problems(allowed: allowedLogLines) { failures.append("\(n.name): \(p)") }
        }
        return failures
    }

    /// Kills whatever still runs and removes the root (keeps it when KEEP_IT_ROOT is set).
    /// Synchronous, for `defer`: SIGKILL needs no grace period.
    public func cleanUp() {
        for n in nodes { n.killNow() }
        if ProcessInfo.processInfo.environment["KEEP_IT_ROOT"] == nil {
            try? FileManager.default.removeItem(atPath: root)
        }
    }
}
