import Foundation
import Testing

/// docs/architecture.md says where each concept lives: every file it names must exist, so
/// the map cannot drift from the code.
@Suite struct ArchitectureDocTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    @Test func everyFileTheArchitectureNamesExists() throws {
        let text = try String(contentsOfFile: Self.root + "/docs/architecture.md", encoding: .utf8)
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
}
