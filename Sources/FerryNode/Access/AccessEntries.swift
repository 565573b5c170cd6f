import FerryCore
import FerryQuery
import FerrySync
import FerryTransport
import Foundation

/// Which documents one side of a rule (read or write) admits: those whose ID matches one of
/// `ids` (globs; none listed: any ID) and whose body matches `selector` (none: any body).
public struct AccessMatch: Sendable, Equatable {
    public var ids: [String]
    public var selector: JSON?

    public init(ids: [String] = [], selector: JSON? = nil) {
        self.ids = ids
        self.selector = selector
    }

    var json: JSON {
        var o: [String: JSON] = ["ids": .array(ids.map(JSON.string))]
        if let selector { o["selector"] = selector }
        return .object(o)
    }

    init(parsing v: JSON, _ key: String) throws(AccessError) {
        guard let o = v.objectValue else { throw .malformed("\"\(key)\" is not an object") }
        if let extra = o.keys.first(where: { $0 != "ids" && $0 != "selector" }) { throw .malformed("\"\(key)\" has unknown member \"\(extra)\"") }
        ids = []
        if let list = o["ids"] {
            guard case .array(let a) = list else { throw .malformed("\"\(key).ids\" is not an array") }
            for p in a {
                guard let s = p.stringValue, !s.isEmpty, s.utf8.count <= 256 else { throw .malformed("\"\(key).ids\" holds an empty or non-string pattern") }
                ids.append(s)
            }
        }
        selector = o["selector"]
        _ = try clause()
    }

    /// The rule's test as the access engine runs it; an invalid selector is a clear error.
    func clause() throws(AccessError) -> AccessClause {
        if let selector, selector.objectValue == nil { throw .invalidSelector("a selector must be a JSON object") }
        do { return try AccessClause(idPatterns: ids, selector: selector) } catch { throw .invalidSelector(error.description) }
    }
}

/// One group access rule, signed by a group admin: "members with one of `roles` may read
/// what `read` admits, write what `write` admits, and delete when `delete`"; the document
/// `_ferry/access/rules/<name>`. A removed rule stays as an entry with `state` removed.
///
/// Signed like member entries: P-256 ECDSA over the canonical JSON without `signature`.
public struct AccessRuleEntry: SignedEntry, Equatable {
    public enum State: String, Sendable { case active, removed }

    public static let documentPrefix = "_ferry/access/rules/"
    public static let type = "ferry.access.rule"

    public var group: String
    public var name: String
    public var roles: [String]
    /// What the roles may read; nil: nothing by this rule.
    public var read: AccessMatch?
    /// What the roles may write; nil: nothing by this rule.
    public var write: AccessMatch?
    /// Whether the roles may delete what they may write.
    public var delete: Bool
    public var state: State
    public var version: Int64
    public var signer: String
    public var signerCertificate: [UInt8]
    public var signature: [UInt8]

    public static func documentID(_ name: String) -> DocumentID { try! DocumentID(documentPrefix + name, allowReserved: true) }
    public static func name(inDocument id: DocumentID) -> String? { NodeSignature.node(inDocument: id, prefix: documentPrefix) }

    public static let certificateName = "the rule's certificate"
    public static func malformed(_ why: String) -> AccessError { .malformed(why) }
    public static func badSignature(_ why: String) -> AccessError { .badSignature(why) }
    public var signedBy: (node: String, certificate: [UInt8]) { (signer, signerCertificate) }

    public var unsignedBody: [String: JSON] {
        var o: [String: JSON] = [
            "type": .string(Self.type), "group": .string(group), "name": .string(name), "roles": .array(roles.map(JSON.string)),
            "delete": .bool(delete), "state": .string(state.rawValue), "version": .int(version),
            "signer": .string(signer), "signerCertificate": .string(Data(signerCertificate).base64EncodedString()),
        ]
        if let read { o["read"] = read.json }
        if let write { o["write"] = write.json }
        return o
    }

    public static func signed(
        group: String, name: String, roles: [String], read: AccessMatch?, write: AccessMatch?, delete: Bool, state: State,
        version: Int64, by identity: NodeIdentity
    ) throws(AccessError) -> AccessRuleEntry {
        try AccessNames.checkRule(name)
        for r in roles { try AccessNames.checkRole(r) }
        _ = try read?.clause()
        _ = try write?.clause()
        var e = AccessRuleEntry(
            group: group, name: name, roles: roles, read: read, write: write, delete: delete, state: state, version: version,
            signer: identity.nodeID, signerCertificate: identity.certificateDER, signature: [])
        try e.sign(by: identity)
        return e
    }

    init(
        group: String, name: String, roles: [String], read: AccessMatch?, write: AccessMatch?, delete: Bool, state: State,
        version: Int64, signer: String, signerCertificate: [UInt8], signature: [UInt8]
    ) {
        (self.group, self.name, self.roles, self.read, self.write, self.delete) = (group, name, roles, read, write, delete)
        (self.state, self.version, self.signer, self.signerCertificate, self.signature) = (state, version, signer, signerCertificate, signature)
    }

    /// Reads a rule body; every missing, mistyped or unknown member is a clear error.
    public init(parsing json: JSON) throws(AccessError) {
        let r = try SignedAccessFields<Self>(json, known: ["name", "roles", "read", "write", "delete", "state"])
        let o = r.object
        guard let name = o["name"]?.stringValue else { throw .malformed("\"name\" is missing or not a string") }
        try AccessNames.checkRule(name)
        self.name = name
        roles = try AccessNames.roles(o["roles"])
        read = try o["read"].map { v throws(AccessError) in try AccessMatch(parsing: v, "read") }
        write = try o["write"].map { v throws(AccessError) in try AccessMatch(parsing: v, "write") }
        guard let delete = o["delete"]?.boolValue else { throw .malformed("\"delete\" is missing or not a boolean") }
        self.delete = delete
        guard let state = State(rawValue: o["state"]?.stringValue ?? "") else { throw .malformed("\"state\" is not active or removed") }
        self.state = state
        (group, version, signer, signerCertificate, signature) = (r.group, r.version, r.signer, r.signerCertificate, r.signature)
    }

    /// Whether `self` supersedes `other` for the same name: the higher version, and at equal
    /// versions `removed` over `active`, then the higher signature bytes (so every node picks
    /// the same), as member entries are selected.
    public func supersedes(_ other: AccessRuleEntry) -> Bool {
        if version != other.version { return version > other.version }
        if state != other.state { return state == .removed }
        return NodeSignature.greater(signature, other.signature)
    }
}

/// The roles of one principal (a member node, by its ID, or a CouchDB user, as `user:NAME`),
/// signed by a group admin: the document `_ferry/access/roles/<principal>`.
public struct RoleAssignment: SignedEntry, Equatable {
    public static let documentPrefix = "_ferry/access/roles/"
    public static let type = "ferry.access.roles"

    public var group: String
    public var principal: String
    public var roles: [String]
    public var version: Int64
    public var signer: String
    public var signerCertificate: [UInt8]
    public var signature: [UInt8]

    public static func documentID(_ principal: String) -> DocumentID { try! DocumentID(documentPrefix + principal, allowReserved: true) }
    public static func principal(inDocument id: DocumentID) -> String? { NodeSignature.node(inDocument: id, prefix: documentPrefix) }

    public static let certificateName = "the assignment's certificate"
    public static func malformed(_ why: String) -> AccessError { .malformed(why) }
    public static func badSignature(_ why: String) -> AccessError { .badSignature(why) }
    public var signedBy: (node: String, certificate: [UInt8]) { (signer, signerCertificate) }

    public var unsignedBody: [String: JSON] {
        [
            "type": .string(Self.type), "group": .string(group), "principal": .string(principal), "roles": .array(roles.map(JSON.string)),
            "version": .int(version), "signer": .string(signer),
            "signerCertificate": .string(Data(signerCertificate).base64EncodedString()),
        ]
    }

    public static func signed(group: String, principal: String, roles: [String], version: Int64, by identity: NodeIdentity) throws(AccessError)
        -> RoleAssignment
    {
        try AccessNames.checkPrincipal(principal)
        for r in roles { try AccessNames.checkRole(r) }
        var a = RoleAssignment(
            group: group, principal: principal, roles: roles, version: version, signer: identity.nodeID,
            signerCertificate: identity.certificateDER, signature: [])
        try a.sign(by: identity)
        return a
    }

    init(group: String, principal: String, roles: [String], version: Int64, signer: String, signerCertificate: [UInt8], signature: [UInt8]) {
        (self.group, self.principal, self.roles, self.version) = (group, principal, roles, version)
        (self.signer, self.signerCertificate, self.signature) = (signer, signerCertificate, signature)
    }

    public init(parsing json: JSON) throws(AccessError) {
        let r = try SignedAccessFields<Self>(json, known: ["principal", "roles"])
        guard let principal = r.object["principal"]?.stringValue else { throw .malformed("\"principal\" is missing or not a string") }
        try AccessNames.checkPrincipal(principal)
        self.principal = principal
        roles = try AccessNames.roles(r.object["roles"])
        (group, version, signer, signerCertificate, signature) = (r.group, r.version, r.signer, r.signerCertificate, r.signature)
    }

    /// Whether `self` supersedes `other` for the same principal: the higher version, and at
    /// equal versions a withdrawal (no roles) over an assignment that grants some, then the
    /// higher signature bytes (so every node picks the same).
    public func supersedes(_ other: RoleAssignment) -> Bool {
        if version != other.version { return version > other.version }
        if roles.isEmpty != other.roles.isEmpty { return roles.isEmpty }
        return NodeSignature.greater(signature, other.signature)
    }
}

/// The members both signed access documents share, read and checked once.
struct SignedAccessFields<Entry: SignedEntry> where Entry.Failure == AccessError {
    let object: [String: JSON]
    let group: String
    let version: Int64
    let signer: String
    let signerCertificate: [UInt8]
    let signature: [UInt8]

    init(_ json: JSON, known: Set<String>) throws(AccessError) {
        let r = try SignedBodyReader<Entry>(json, known: known.union(["group", "version", "signer", "signerCertificate"]))
        object = r.object
        group = try r.nodeID("group")
        version = try r.version()
        signer = try r.nodeID("signer")
        signerCertificate = try r.base64("signerCertificate")
        signature = try r.base64("signature")
    }
}

/// What rule names, role names and principals may be.
public enum AccessNames {
    static func isName(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.count <= 64
            && s.unicodeScalars.allSatisfy { ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) || "-_.".unicodeScalars.contains($0) }
    }

    public static func checkRule(_ s: String) throws(AccessError) {
        guard isName(s) else { throw .malformed("rule name \"\(LogText.escape(s))\" must be 1-64 letters, digits, '-', '_' or '.'") }
    }

    public static func checkRole(_ s: String) throws(AccessError) {
        guard isName(s) else { throw .malformed("role \"\(LogText.escape(s))\" must be 1-64 letters, digits, '-', '_' or '.'") }
    }

    /// A member's node ID (64 lowercase hex digits) or `user:` and a CouchDB user's name.
    public static func checkPrincipal(_ s: String) throws(AccessError) {
        if s.hasPrefix("user:") {
            let name = s.dropFirst(5)
            guard !name.isEmpty, name.utf8.count <= 128, !name.contains("/"), !name.unicodeScalars.contains(where: { $0.value < 0x20 }) else {
                throw .malformed("\"\(LogText.escape(s))\" names no valid CouchDB user")
            }
            return
        }
        guard s.utf8.count == 64, NodeIDFormat.normalized(s) == s else {
            throw .malformed("principal \"\(LogText.escape(s))\" is neither a node ID (64 lowercase hex digits) nor user:NAME")
        }
    }

    static func roles(_ v: JSON?) throws(AccessError) -> [String] {
        guard case .array(let a)? = v else { throw .malformed("\"roles\" is missing or not an array") }
        var out: [String] = []
        for r in a {
            guard let s = r.stringValue else { throw .malformed("\"roles\" holds a non-string") }
            try checkRole(s)
            if !out.contains(s) { out.append(s) }
        }
        return out
    }
}

/// Why an access rule or role assignment was refused.
public enum AccessError: FerryError, Equatable {
    case malformed(String)
    case invalidSelector(String)
    case badSignature(String)
    case notAdmin(String)
    case noGroup
    case unknownRule(String)
    case unknownRole(String)
    /// The change would leave no active admin able to read every document.
    case locksOutAdmins(String)

    public var domain: String { "access" }
    public var isTransient: Bool { false }
    public var failure: FailureKind {
        switch self {
        case .malformed, .invalidSelector, .badSignature, .unknownRole, .locksOutAdmins: .invalidRequest
        case .notAdmin: .forbidden
        case .noGroup, .unknownRule: .notFound
        }
    }

    public var code: String {
        switch self {
        case .malformed: "malformed_access_entry"
        case .invalidSelector: "invalid_selector"
        case .badSignature: "bad_signature"
        case .notAdmin: "not_admin"
        case .noGroup: "no_group"
        case .unknownRule: "unknown_rule"
        case .unknownRole: "unknown_role"
        case .locksOutAdmins: "locks_out_admins"
        }
    }

    public var description: String {
        switch self {
        case .malformed(let m): "malformed access entry: \(m)"
        case .invalidSelector(let m): "invalid selector: \(m)"
        case .badSignature(let m): "bad signature: \(m)"
        case .notAdmin(let m): m
        case .noGroup: "this node belongs to no group: create or join one first (ferry group create | ferry group join CODE)"
        case .unknownRule(let n): "no rule named \"\(LogText.escape(n))\""
        case .unknownRole(let r): "no rule grants the role \"\(LogText.escape(r))\": add a rule for it first (ferry access rule add NAME --role \(LogText.escape(r)) ...)"
        case .locksOutAdmins(let m): m
        }
    }
}
