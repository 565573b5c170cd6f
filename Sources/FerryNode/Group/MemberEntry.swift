import Crypto
import FerryCore
import FerryTransport
import Foundation

/// One signed statement of group membership: "node N is a member (or removed), admin or
/// not, at version V", signed by an admin; stored as the document `_ferry/members/<N>`.
///
/// The signature is P-256 ECDSA (SHA-256, DER-encoded) over the canonical JSON of the body
/// without its `signature` member. Anyone can check it: the SHA-256 of `signerCertificate`
/// must be `signer`, and that certificate's public key must verify the signature.
public struct MemberEntry: SignedEntry, Equatable {
    /// Whether the node belongs to the group.
    public enum State: String, Sendable {
        case member, removed
    }

    public static let documentPrefix = "_ferry/members/"
    public static let type = "ferry.member"

    /// The founder's node ID.
    public var group: String
    public var node: String
    public var name: String?
    public var state: State
    public var admin: Bool
    public var version: Int64
    /// Where the node listens, as `host:port` (IPv6 in brackets); a dial hint, not trust.
    public var addresses: [String]
    public var signer: String
    public var signerCertificate: [UInt8]
    public var signature: [UInt8]

    /// The document that holds the entry of `node`.
    public static func documentID(_ node: String) -> DocumentID { NodeSignature.documentID(documentPrefix, node) }

    /// The node an entry document names, or nil when the ID is not an entry's.
    public static func node(inDocument id: DocumentID) -> String? { NodeSignature.node(inDocument: id, prefix: documentPrefix) }

    public static let certificateName = "signerCertificate"
    public static func malformed(_ why: String) -> MembershipError { .malformedEntry(why) }
    public static func badSignature(_ why: String) -> MembershipError { .badSignature(why) }
    public var signedBy: (node: String, certificate: [UInt8]) { (signer, signerCertificate) }

    /// The body without the signature: what is signed.
    public var unsignedBody: [String: JSON] {
        var o: [String: JSON] = [
            "type": .string(Self.type), "group": .string(group), "node": .string(node), "state": .string(state.rawValue),
            "admin": .bool(admin), "version": .int(version), "addresses": .array(addresses.map(JSON.string)),
            "signer": .string(signer), "signerCertificate": .string(Data(signerCertificate).base64EncodedString()),
        ]
        if let name { o["name"] = .string(name) }
        return o
    }

    /// A new entry signed by `identity`.
    public static func signed(
        group: String, node: String, name: String?, state: State, admin: Bool, version: Int64, addresses: [String],
        by identity: NodeIdentity
    ) throws(MembershipError) -> MemberEntry {
        var entry = MemberEntry(
            group: group, node: node, name: name, state: state, admin: admin, version: version, addresses: addresses,
            signer: identity.nodeID, signerCertificate: identity.certificateDER, signature: [])
        try entry.sign(by: identity)
        return entry
    }

    /// Reads an entry body; every missing, mistyped or unknown member is a clear error.
    public init(parsing json: JSON) throws(MembershipError) {
        let r = try SignedBodyReader<Self>(
            json, known: ["group", "node", "name", "state", "admin", "version", "addresses", "signer", "signerCertificate"])
        group = try r.nodeID("group")
        node = try r.nodeID("node")
        if let n = r["name"] {
            guard let s = n.stringValue else { throw .malformedEntry("\"name\" is not a string") }
            name = s
        }
        guard let state = State(rawValue: try r.string("state")) else { throw .malformedEntry("\"state\" is not member or removed") }
        self.state = state
        admin = try r.bool("admin")
        version = try r.version()
        guard case .array(let list)? = r["addresses"] else { throw .malformedEntry("\"addresses\" is missing or not an array") }
        addresses = []
        for a in list {
            guard let s = a.stringValue, s.utf8.count <= 300 else { throw .malformedEntry("\"addresses\" holds a non-string") }
            addresses.append(s)
        }
        signer = try r.nodeID("signer")
        signerCertificate = try r.base64("signerCertificate")
        signature = try r.base64("signature")
    }

    init(
        group: String, node: String, name: String?, state: State, admin: Bool, version: Int64, addresses: [String], signer: String,
        signerCertificate: [UInt8], signature: [UInt8]
    ) {
        self.group = group
        self.node = node
        self.name = name
        self.state = state
        self.admin = admin
        self.version = version
        self.addresses = addresses
        self.signer = signer
        self.signerCertificate = signerCertificate
        self.signature = signature
    }

    /// Whether `self` supersedes `other` for the same node: the higher version, and at equal
    /// versions `removed` over `member`, then the higher signature bytes (so every node picks the same).
    func supersedes(_ other: MemberEntry) -> Bool {
        if version != other.version { return version > other.version }
        if state != other.state { return state == .removed }
        return NodeSignature.greater(signature, other.signature)
    }
}

/// The valid members of one group, computed from any set of signature-checked entries.
///
/// An entry counts when its group matches, its signature checks, and its signer is the
/// founder or an active admin (a node whose own selected entry is a member with
/// `admin: true`). Authority grows from the founder outwards, so a cycle of entries that
/// sign each other without a chain to the founder never counts. For each node, the
/// counting entry with the highest version is selected (removed beats member at equal version).
public struct MembershipView: Sendable, Equatable {
    public let group: String
    /// The selected entry of each node with at least one counting entry.
    public let selected: [String: MemberEntry]

    /// Computes the view. `entries` may hold anything: forged, foreign or stale entries
    /// are simply not counted. `signaturesChecked` skips checking signatures again for
    /// entries the caller already checked (a ledger of verified entries).
    public init(group: String, entries: some Sequence<MemberEntry>, signaturesChecked: Bool = false) {
        self.group = group
        var byNode: [String: [MemberEntry]] = [:]
        for e in entries where e.group == group && (signaturesChecked || (try? e.verifySignature()) != nil) {
            // The founder cannot be removed: the group is its ID.
            if e.node == group && e.state == .removed { continue }
            byNode[e.node, default: []].append(e)
        }
        var admins: Set<String> = [group]
        var selected: [String: MemberEntry] = [:]
        // Each round only trusts signers found admin by the previous one; it ends when the
        // admin set is stable, at most one round per node (plus one).
        for _ in 0...(byNode.count + 1) {
            selected = [:]
            for (node, list) in byNode {
                for e in list where admins.contains(e.signer) {
                    if let best = selected[node], !e.supersedes(best) { continue }
                    selected[node] = e
                }
            }
            var next: Set<String> = [group]
            for (node, e) in selected where e.state == .member && e.admin { next.insert(node) }
            if next == admins { break }
            admins = next
        }
        self.selected = selected
    }

    /// Whether `entry` counts in this view (its signer is an active admin and it matches).
    public func counts(_ entry: MemberEntry) -> Bool {
        guard entry.group == group, (try? entry.verifySignature()) != nil else { return false }
        if entry.node == group && entry.state == .removed { return false }
        return activeAdmins.contains(entry.signer)
    }

    /// The founder and every member whose selected entry says admin.
    public var activeAdmins: Set<String> {
        var s: Set<String> = [group]
        for (node, e) in selected where e.state == .member && e.admin { s.insert(node) }
        return s
    }

    /// Members whose selected entry says `member` (the founder included once it signed its own).
    public var activeMembers: [MemberEntry] {
        selected.values.filter { $0.state == .member }.sorted { $0.node < $1.node }
    }

    public func isActiveMember(_ node: String) -> Bool { selected[node]?.state == .member }
    public func isAdmin(_ node: String) -> Bool { activeAdmins.contains(node) }
}

/// Errors of group membership and enrollment; each says whether trying again may help.
public enum MembershipError: FerryError, Equatable {
    case malformedEntry(String)
    case badSignature(String)
    /// The entry's signer has no authority in this group (not the founder, not an active admin).
    case notAuthorized(String)
    case wrongGroup(String)
    /// This node belongs to no group yet.
    case noGroup
    /// This node already belongs to another group.
    case alreadyInGroup(String)
    /// Only admins may invite or remove.
    case notAdmin
    case badInvitationCode(String)
    case invitationExpired
    case invitationUsed
    /// No open invitation matches the secret (wrong secret, or never issued).
    case invitationUnknown
    /// The inviter's listener refused this node: it has no open invitation at all.
    case noOpenInvitation
    /// Too many failed joins from one address or node recently.
    case rateLimited
    case inviterUnreachable(String)
    case unknownMember(String)
    case cannotRemoveFounder
    /// The inviter's reply did not hold what a join needs.
    case badReply(String)
    case storage(String)

    public var domain: String { "membership" }
    public var code: String {
        switch self {
        case .malformedEntry: "malformed_entry"
        case .badSignature: "bad_signature"
        case .notAuthorized: "not_authorized"
        case .wrongGroup: "wrong_group"
        case .noGroup: "no_group"
        case .alreadyInGroup: "already_in_group"
        case .notAdmin: "not_admin"
        case .badInvitationCode: "bad_invitation_code"
        case .invitationExpired: "invitation_expired"
        case .invitationUsed: "invitation_used"
        case .invitationUnknown: "invitation_unknown"
        case .noOpenInvitation: "no_open_invitation"
        case .rateLimited: "rate_limited"
        case .inviterUnreachable: "inviter_unreachable"
        case .unknownMember: "unknown_member"
        case .cannotRemoveFounder: "cannot_remove_founder"
        case .badReply: "bad_reply"
        case .storage: "storage"
        }
    }
    public var failure: FailureKind {
        switch self {
        case .notAuthorized, .notAdmin, .cannotRemoveFounder, .invitationExpired, .invitationUsed, .invitationUnknown, .noOpenInvitation:
            .forbidden
        case .alreadyInGroup, .wrongGroup: .conflict
        case .unknownMember, .noGroup: .notFound
        case .rateLimited: .rateLimited
        case .inviterUnreachable, .badReply: .peerFailed
        case .storage: .internalFailure
        case .malformedEntry, .badSignature, .badInvitationCode: .invalidRequest
        }
    }
    public var isTransient: Bool {
        switch self {
        case .rateLimited, .inviterUnreachable, .storage: true
        default: false
        }
    }
    public var description: String {
        switch self {
        case .malformedEntry(let why): "malformed member entry: \(why)"
        case .badSignature(let why): "bad member entry signature: \(why)"
        case .notAuthorized(let why): why
        case .wrongGroup(let why): why
        case .noGroup: "this node belongs to no group (create one with `ferry invite`, or join one with `ferry join CODE`)"
        case .alreadyInGroup(let g): "this node already belongs to group \(g)"
        case .notAdmin: "this node is not an admin of its group: only admins may invite or remove members"
        case .badInvitationCode(let why): "not a valid invitation code: \(why)"
        case .invitationExpired: "the invitation has expired: ask for a new one with `ferry invite`"
        case .invitationUsed: "the invitation was already used: each code admits one node"
        case .invitationUnknown: "the inviter knows no such invitation (wrong or forged code)"
        case .noOpenInvitation: "the inviter has no open invitation: the code expired or was already used; ask for a new one with `ferry invite`"
        case .rateLimited: "too many failed joins from this node or address: wait a minute"
        case .inviterUnreachable(let why): "the inviter is unreachable: \(why)"
        case .unknownMember(let who): "no member \(who) in this group"
        case .cannotRemoveFounder: "the founder cannot be removed: the group is named by its ID"
        case .badReply(let why): "the inviter's reply is not acceptable: \(why)"
        case .storage(let why): why
        }
    }
}
