import FerryCore
import FerryQuery

/// Which documents a rule admits: by ID prefix, by ID glob pattern, or by `type`;
/// a document passes if any listed criterion admits it. No criteria admits everything.
/// A `grant` (the group's rules for the principal) narrows that further: a document must
/// then be admitted by both, so a node's own policy and the group's combine by intersection.
public struct AccessRule: Sendable, Equatable {
    public var idPrefixes: [String]
    /// Globs over the whole ID: `*` matches any run of characters, `?` one character.
    public var idPatterns: [String]
    /// Values of the body's `type` member.
    public var types: [String]
    /// What the group's rules admit for this principal; nil when the group has no rules.
    public var grant: AccessGrant?

    public init(idPrefixes: [String] = [], idPatterns: [String] = [], types: [String] = [], grant: AccessGrant? = nil) {
        self.idPrefixes = idPrefixes
        self.idPatterns = idPatterns
        self.types = types
        self.grant = grant
    }

    public static let all = AccessRule()
    public static let none = AccessRule(idPrefixes: ["\u{0}never"])

    /// True when the node's own criteria are empty (whatever the grant says).
    public var ownCriteriaEmpty: Bool { idPrefixes.isEmpty && idPatterns.isEmpty && types.isEmpty }

    public var admitsEverything: Bool { ownCriteriaEmpty && grant == nil }

    /// Whether a verdict can depend on bodies: the rule names types or the grant selectors.
    public var needsBodies: Bool {
        (!ownCriteriaEmpty && !types.isEmpty) || (grant?.needsBodies ?? false)
    }

    /// This rule narrowed by `grant` (intersected with any grant it already has); a grant
    /// that admits everything changes nothing.
    public func restricted(by grant: AccessGrant?) -> AccessRule {
        guard let grant, !grant.admitsEverything else { return self }
        var r = self
        r.grant = self.grant.map { $0.intersection(grant) } ?? grant
        return r
    }

    /// The documents both rules admit, or nil when that is not one rule (both name criteria of
    /// their own, which combine by union within a rule).
    public func intersection(_ other: AccessRule) -> AccessRule? {
        if other.ownCriteriaEmpty { return restricted(by: other.grant) }
        if ownCriteriaEmpty { return other.restricted(by: grant) }
        return nil
    }

    /// True for a rule that admits no application document: `AccessRule.none`, perhaps with
    /// Ferry's own `_ferry/` entries added (which never refer to blobs).
    public var admitsNoApplicationDocument: Bool {
        if let grant, grant.admitsNothing { return true }
        return idPatterns.isEmpty && types.isEmpty && !idPrefixes.isEmpty
            && idPrefixes.allSatisfy { $0 == Self.none.idPrefixes[0] || $0.hasPrefix("_ferry/") }
    }

    /// A stable text naming what the rule admits (order of criteria does not matter).
    public var fingerprint: String {
        var parts = [idPrefixes.sorted(), idPatterns.sorted(), types.sorted()].map { $0.joined(separator: "\u{1}") }
        if let grant { parts.append("grant:" + grant.fingerprint) }
        return parts.joined(separator: "\u{2}")
    }

    public func admits(id: DocumentID, body: JSON?) -> Bool {
        if let grant, !grant.admits(id: id, body: body) { return false }
        return admitsOwn(id: id, body: body)
    }

    /// The top-level body members a verdict of this rule reads (`type`, and what the grant's
    /// selectors name): a body cut down to them is judged as the whole body is. Nil when a
    /// selector reads the document itself.
    public var bodyMembers: Set<String>? {
        var names = Set<String>()
        if !ownCriteriaEmpty && !types.isEmpty { names.insert("type") }
        if let grant {
            guard let members = grant.bodyMembers else { return nil }
            names.formUnion(members)
        }
        return names
    }

    func admitsOwn(id: DocumentID, body: JSON?) -> Bool {
        if ownCriteriaEmpty { return true }
        if idPrefixes.contains(where: { id.rawValue.hasPrefix($0) }) { return true }
        if idPatterns.contains(where: { Glob.matches($0, id.rawValue) }) { return true }
        if let type = body?["type"]?.stringValue, types.contains(type) { return true }
        return false
    }
}

/// What the group's rules admit for one principal: a document passes when any clause admits
/// it (one clause per rule of the principal's roles). No clauses admits nothing.
public struct AccessGrant: Sendable, Equatable {
    /// The clauses, any of which admits; a clause is itself the conjunction of its parts.
    public var clauses: [AccessClause]
    /// Further grants every one of which must admit too (an intersection of group grants).
    public var also: [AccessGrant]

    public init(clauses: [AccessClause], also: [AccessGrant] = []) {
        self.clauses = clauses
        self.also = also
    }

    /// A grant that admits no document.
    public static let nothing = AccessGrant(clauses: [])

    public var admitsNothing: Bool { clauses.isEmpty || also.contains(where: \.admitsNothing) }
    /// True when some clause admits every document (no ID patterns, no selector) and so does every `also`.
    public var admitsEverything: Bool {
        clauses.contains(where: \.admitsEverything) && also.allSatisfy(\.admitsEverything)
    }
    public var needsBodies: Bool {
        !admitsEverything && (clauses.contains(where: { $0.selector != nil }) || also.contains(where: \.needsBodies))
    }

    /// This grant also admitting the documents under `prefixes` (whatever its `also` says).
    public func admitting(prefixes: [String]) -> AccessGrant {
        var g = self
        let clause = try! AccessClause(idPatterns: prefixes.map { $0 + "*" })
        g.clauses.append(clause)
        g.also = g.also.map { $0.admitting(prefixes: prefixes) }
        return g
    }

    public func intersection(_ other: AccessGrant) -> AccessGrant {
        var g = self
        g.also.append(other)
        return g
    }

    public func admits(id: DocumentID, body: JSON?) -> Bool {
        clauses.contains(where: { $0.admits(id: id, body: body) }) && also.allSatisfy { $0.admits(id: id, body: body) }
    }

    /// The top-level body members the clauses' selectors read (nil: the document itself).
    public var bodyMembers: Set<String>? {
        var names = Set<String>()
        for clause in clauses {
            guard let selector = clause.selector else { continue }
            guard let members = selector.topLevelMembers else { return nil }
            names.formUnion(members)
        }
        for grant in also {
            guard let members = grant.bodyMembers else { return nil }
            names.formUnion(members)
        }
        return names
    }

    /// Stable across the clauses' order.
    public var fingerprint: String {
        let own = clauses.map(\.fingerprint).sorted().joined(separator: "|")
        return ([own] + also.map { "&(" + $0.fingerprint + ")" }).joined()
    }
}

/// One rule's test: the document's ID matches one of `idPatterns` (none listed: any ID) and
/// its body matches `selector` (none: any body).
public struct AccessClause: Sendable, Equatable {
    /// Globs over the whole ID (`*`, `?`).
    public var idPatterns: [String]
    public var selector: MangoSelector?
    /// The selector as written (for fingerprints and display).
    public var selectorJSON: JSON?

    public init(idPatterns: [String] = [], selector: JSON? = nil) throws(MangoError) {
        self.idPatterns = idPatterns
        self.selectorJSON = selector
        self.selector = try selector.map { v throws(MangoError) in try MangoSelector(parsing: v) }
    }

    public var admitsEverything: Bool { idPatterns.isEmpty && (selector == nil || selector == .matchAll) }

    /// A body unknown (nil) never matches a selector: a document is admitted by what it holds.
    public func admits(id: DocumentID, body: JSON?) -> Bool {
        if !idPatterns.isEmpty && !idPatterns.contains(where: { Glob.matches($0, id.rawValue) }) { return false }
        guard let selector, selector != .matchAll else { return true }
        guard let body else { return false }
        return selector.matches(body)
    }

    public var fingerprint: String {
        idPatterns.sorted().joined(separator: "\u{1}") + "\u{3}" + (selectorJSON.map { String(decoding: $0.canonicalBytes, as: UTF8.self) } ?? "")
    }

    public static func == (a: AccessClause, b: AccessClause) -> Bool { a.fingerprint == b.fingerprint }
}

/// What one peer may read from and write to this database.
public struct PeerPolicy: Sendable, Equatable {
    public var read: AccessRule
    public var write: AccessRule
    /// Whether the peer may send tombstones.
    public var mayDelete: Bool
    /// Set when the group's access rules narrowed this policy; nil when the group has none.
    public var groupRules: GroupRulesApplied?

    public init(read: AccessRule = .all, write: AccessRule = .all, mayDelete: Bool = true, groupRules: GroupRulesApplied? = nil) {
        self.read = read
        self.write = write
        self.mayDelete = mayDelete
        self.groupRules = groupRules
    }

    public static let trusted = PeerPolicy()

    /// Whether the peer reads and writes every document and may delete.
    public var admitsEverything: Bool { read.admitsEverything && write.admitsEverything && mayDelete }

    /// The version of the group's rules this policy is exactly the grant of (nothing narrowed
    /// by hand), so that every node holding that version judges the peer alike; nil otherwise.
    public var followsGroupRules: String? { groupRules.flatMap { $0.unnarrowed ? $0.version : nil } }
}

/// Which version of the group's access rules made a peer's policy, and whether the node's own
/// entry for the peer narrowed it further.
public struct GroupRulesApplied: Sendable, Equatable {
    /// The rules' version (a digest of the rules and roles in force).
    public var version: String
    /// The node's own entry for the peer admitted everything (reads, writes and deletes), so
    /// the policy is what the group's rules grant and no more.
    public var unnarrowed: Bool

    public init(version: String, unnarrowed: Bool) {
        self.version = version
        self.unnarrowed = unnarrowed
    }
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
