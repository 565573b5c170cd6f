import Foundation
import Testing

/// docs/architecture.md says where each concept lives and what each module may import: every
/// file it names must exist, every module imports exactly what its row says, every room of
/// FerryNode and FerrySync is described, and the one-dialer rule is written once, so the map
/// cannot drift from the code.
@Suite struct ArchitectureDocTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    static func architecture() throws -> String {
        try String(contentsOfFile: root + "/docs/architecture.md", encoding: .utf8)
    }

    /// Every `.swift` file under `Sources/<module>/`, with its text.
    static func sources(of module: String) -> [(path: String, text: String)] {
        let base = root + "/Sources/" + module
        var found: [(String, String)] = []
        let walker = FileManager.default.enumerator(atPath: base)
        while let path = walker?.nextObject() as? String {
            guard path.hasSuffix(".swift"), let text = try? String(contentsOfFile: base + "/" + path, encoding: .utf8) else { continue }
            found.append((module + "/" + path, text))
        }
        return found
    }

    static func directories(in path: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).filter { name in
            var isDirectory: ObjCBool = false
            return FileManager.default.fileExists(atPath: path + "/" + name, isDirectory: &isDirectory) && isDirectory.boolValue
        }.sorted()
    }

    @Test func everyFileTheArchitectureNamesExists() throws {
        let text = try Self.architecture()
        let named = try Regex(#"`([A-Za-z0-9/+._-]+\.(?:swift|sh|py))`"#)
        var allNames = Set<String>()
        for top in ["Sources", "Tests", "Integration", "scripts"] {
            let walker = FileManager.default.enumerator(atPath: Self.root + "/" + top)
            while let path = walker?.nextObject() as? String { allNames.insert((path as NSString).lastPathComponent) }
        }
        var checked = 0
        for match in text.matches(of: named) {
            let path = String(match.output[1].substring ?? "")
            checked += 1
            if path.contains("/") {
                let found = [Self.root + "/Sources/" + path, Self.root + "/" + path].contains { FileManager.default.fileExists(atPath: $0) }
                #expect(found, "docs/architecture.md names \(path), which does not exist")
            } else {
                #expect(allNames.contains(path), "docs/architecture.md names \(path), which no directory holds")
            }
        }
        #expect(checked > 50, "the architecture names files in backquotes: found \(checked)")
    }

    @Test func eachModuleImportsExactlyTheFerryModulesItsRowNames() throws {
        let text = try Self.architecture()
        let table = try #require(text.firstRange(of: "<!-- module-imports -->").flatMap { start in
            text.firstRange(of: "<!-- /module-imports -->").map { String(text[start.upperBound..<$0.lowerBound]) }
        }, "docs/architecture.md has no module-imports table")
        var stated: [String: Set<String>] = [:]
        for line in table.split(separator: "\n") where line.hasPrefix("| ") && !line.hasPrefix("| Module") {
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count == 2 else { continue }
            stated[cells[0]] = cells[1] == "none" ? [] : Set(cells[1].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
        }
        let modules = Self.directories(in: Self.root + "/Sources").filter { $0.lowercased().hasPrefix("ferry") }
        #expect(Set(stated.keys) == Set(modules), "rows: \(stated.keys.sorted()); modules: \(modules)")
        let importLine = try Regex(#"(?m)^\s*(?:@[A-Za-z_]+\s+)*(?:public\s+|internal\s+|package\s+)?import\s+(Ferry[A-Za-z]*)\b"#)
        for module in modules {
            var imported = Set<String>()
            for (_, source) in Self.sources(of: module) {
                for match in source.matches(of: importLine) { imported.insert(String(match.output[1].substring ?? "")) }
            }
            imported.remove(module)
            #expect(imported == stated[module], "\(module) imports \(imported.sorted()); its row says \((stated[module] ?? []).sorted())")
        }
    }

    @Test func everyRoomOfTheTwoLargestModulesIsDescribed() throws {
        let text = try Self.architecture()
        for module in ["FerryNode", "FerrySync"] {
            let rooms = Self.directories(in: Self.root + "/Sources/" + module)
            #expect(!rooms.isEmpty)
            for room in rooms {
                #expect(text.contains("| `\(module)/\(room)/` |"), "docs/architecture.md does not describe \(module)/\(room)/")
            }
            let described = try Regex("\\| `\(module)/([A-Za-z]+)/` \\|")
            for match in text.matches(of: described) {
                let room = String(match.output[1].substring ?? "")
                #expect(rooms.contains(room), "docs/architecture.md describes \(module)/\(room)/, which does not exist")
            }
        }
    }

    /// Who dials whom is decided in one place (`PeerManager.dials`): any other comparison of
    /// node IDs in the node or the sync layer would be a second copy of the rule to drift.
    @Test func theOneDialerRuleIsWrittenOnce() throws {
        let comparison = try Regex(#"\b(?:nodeID|peerID|localID|remoteID)\s*[<>]=?\s*[A-Za-z(]|[A-Za-z)]\s*[<>]=?\s*(?:nodeID|peerID|localID|remoteID)\b"#)
        var found: [String] = []
        for module in ["FerryNode", "FerrySync", "FerryTransport"] {
            for (path, source) in Self.sources(of: module) {
                for line in source.split(separator: "\n") where line.contains(comparison) {
                    // Sorting by ID (`$0.nodeID < $1.nodeID`) orders a list; it decides nothing.
                    if line.contains("$0.") && line.contains("$1.") { continue }
                    if line.trimmingCharacters(in: .whitespaces).hasPrefix("//") { continue }
                    found.append("\(path): \(line.trimmingCharacters(in: .whitespaces))")
                }
            }
        }
        #expect(found.count == 1 && found.first?.contains("func dials(") == true, "\(found.joined(separator: "\n"))")
    }

    /// An unstructured `Task` is owned (kept by whoever started it, which cancels or awaits
    /// it) or marked `// Unowned: WHY` on its line or the two before, saying why nothing needs
    /// to cancel it (docs/architecture.md, "Tasks"). Owned means the task is assigned,
    /// returned or passed on where it starts.
    @Test func everyUnownedTaskSaysWhyNothingCancelsIt() throws {
        let start = try Regex(#"(?:^|[^A-Za-z0-9_.])(Task(?:\.detached)?\s*(?:\([^)]*\))?\s*\{)"#)
        var unmarked: [String] = []
        var marked = 0
        let modules = Self.directories(in: Self.root + "/Sources").filter { $0.lowercased().hasPrefix("ferry") }
        for module in modules {
            for (path, source) in Self.sources(of: module) {
                let lines = source.components(separatedBy: "\n")
                for (n, line) in lines.enumerated() {
                    guard let match = line.firstMatch(of: start) else { continue }
                    guard let task = match.output[1].range else { continue }
                    let before = line[..<task.lowerBound].trimmingCharacters(in: .whitespaces)
                    let previous = n > 0 ? lines[n - 1].trimmingCharacters(in: .whitespaces) : ""
                    let passedOn = !(before.isEmpty || before.hasSuffix("{")) || (before.isEmpty && (previous.hasSuffix("(") || previous.hasSuffix(",")))
                    if passedOn { continue }
                    if lines[max(0, n - 2)...n].contains(where: { $0.contains("// Unowned: ") }) { marked += 1; continue }
                    unmarked.append("\(path):\(n + 1): \(line.trimmingCharacters(in: .whitespaces))")
                }
            }
        }
        #expect(unmarked.isEmpty, "unowned tasks that do not say why:\n\(unmarked.joined(separator: "\n"))")
        #expect(marked > 0)
    }
}
