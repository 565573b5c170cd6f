import FerryCore

/// Which documents a rule admits: by ID prefix, by ID glob pattern, or by `type`;
/// a document passes if any listed criterion admits it. No criteria admits everything.
public struct AccessRule: Sendable, Equatable {
    public var idPrefixes: [String]
    /// Globs over the whole ID: `*` matches any run of characters, `?` one character.
    public var idPatterns: [String]
    /// Values of the body's `type` member.
    public var types: [String]

    public init(idPrefixes: [String] = [], idPatterns: [String] = [], types: [String] = []) {
        self.idPrefixes = idPrefixes
        self.idPatterns = idPatterns
        self.types = types
    }

    public static let all = AccessRule()
    public static let none = AccessRule(idPrefixes: ["\u{0}never"])

    public var admitsEverything: Bool { idPrefixes.isEmpty && idPatterns.isEmpty && types.isEmpty }

    /// True for a rule that admits no application document: `AccessRule.none`, perhaps with
    /// Ferry's own `_ferry/` entries added (which never refer to blobs).
    public var admitsNoApplicationDocument: Bool {
        idPatterns.isEmpty && types.isEmpty && !idPrefixes.isEmpty
            && idPrefixes.allSatisfy { $0 == Self.none.idPrefixes[0] || $0.hasPrefix("_ferry/") }
    }

    /// A stable text naming what the rule admits (order of criteria does not matter).
    public var fingerprint: String {
        [idPrefixes.sorted(), idPatterns.sorted(), types.sorted()].map { $0.joined(separator: "\u{1}") }.joined(separator: "\u{2}")
    }

    public func admits(id: DocumentID, body: JSON?) -> Bool {
        if admitsEverything { return true }
        if idPrefixes.contains(where: { id.rawValue.hasPrefix($0) }) { return true }
        if idPatterns.contains(where: { Glob.matches($0, id.rawValue) }) { return true }
        if let type = body?["type"]?.stringValue, types.contains(type) { return true }
        return false
    }
}

/// What one peer may read from and write to this database.
public struct PeerPolicy: Sendable, Equatable {
    public var read: AccessRule
    public var write: AccessRule
    /// Whether the peer may send tombstones.
    public var mayDelete: Bool

    public init(read: AccessRule = .all, write: AccessRule = .all, mayDelete: Bool = true) {
        self.read = read
        self.write = write
        self.mayDelete = mayDelete
    }

    public static let trusted = PeerPolicy()
}

/// Glob matching over Unicode scalars (`*` any run, `?` any one).
public enum Glob {
    public static func matches(_ pattern: String, _ text: String) -> Bool {
        let p = Array(pattern.unicodeScalars)
        let t = Array(text.unicodeScalars)
        var pi = 0
        var ti = 0
        var star = -1
        var mark = 0
        while ti < t.count {
            if pi < p.count && (p[pi] == "?" || p[pi] == t[ti]) {
                pi += 1
                ti += 1
            } else if pi < p.count && p[pi] == "*" {
                star = pi
                mark = ti
                pi += 1
            } else if star >= 0 {
                pi = star + 1
                mark += 1
                ti = mark
            } else {
                return false
            }
        }
        while pi < p.count && p[pi] == "*" { pi += 1 }
        return pi == p.count
    }
}

/// A named predicate over revisions. The name is part of the checkpoint key, so changing
/// the filter restarts replication from the beginning rather than skipping documents.
public struct RevisionFilter: Sendable {
    public let name: String
    public let admits: @Sendable (FilterInput) -> Bool
    public init(name: String, _ admits: @escaping @Sendable (FilterInput) -> Bool) {
        self.name = name
        self.admits = admits
    }
}

/// What a filter sees of a revision.
public struct FilterInput: Sendable {
    public let id: DocumentID
    public let revision: RevisionID
    public let deleted: Bool
    public let body: JSON

    public init(id: DocumentID, revision: RevisionID, deleted: Bool, body: JSON) {
        self.id = id
        self.revision = revision
        self.deleted = deleted
        self.body = body
    }
}
