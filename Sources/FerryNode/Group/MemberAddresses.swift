import FerryCore
import FerryTransport
import Foundation

/// Where a member listens now, signed by that member itself: the document
/// `_ferry/addresses/<N>`. A member restarted on another port (or address) writes a new one,
/// and its peers dial it there; an admin-signed member entry says who belongs, this only
/// where to reach them, so it grants nothing.
///
/// Signed like a member entry (P-256 ECDSA over the canonical JSON without `signature`),
/// but the signer must be the node it names: the SHA-256 of `certificate` is `node`.
public struct MemberAddresses: SignedEntry, Equatable {
    public static let documentPrefix = "_ferry/addresses/"
    public static let type = "ferry.addresses"

    /// The founder's node ID.
    public var group: String
    public var node: String
    /// `host:port` (IPv6 in brackets), as in member entries.
    public var addresses: [String]
    /// Rises with each record the node writes (milliseconds since 1970 when written, kept
    /// above the previous one): the highest wins.
    public var version: Int64
    public var certificate: [UInt8]
    public var signature: [UInt8]

    public static func documentID(_ node: String) -> DocumentID { NodeSignature.documentID(documentPrefix, node) }

    /// The node a record's document names, or nil when the ID is not a record's.
    public static func node(inDocument id: DocumentID) -> String? { NodeSignature.node(inDocument: id, prefix: documentPrefix) }

    public static let certificateName = "the record's certificate"
    public static func malformed(_ why: String) -> MembershipError { .malformedEntry(why) }
    public static func badSignature(_ why: String) -> MembershipError { .badSignature(why) }
    /// Only a node may say where it listens: the certificate must be the named node's own.
    public var signedBy: (node: String, certificate: [UInt8]) { (node, certificate) }

    public var unsignedBody: [String: JSON] {
        [
            "type": .string(Self.type), "group": .string(group), "node": .string(node),
            "addresses": .array(addresses.map(JSON.string)), "version": .int(version),
            "certificate": .string(Data(certificate).base64EncodedString()),
        ]
    }

    /// A record of `identity`'s own addresses.
    public static func signed(group: String, addresses: [String], version: Int64, by identity: NodeIdentity) throws(MembershipError)
        -> MemberAddresses
    {
        var record = MemberAddresses(
            group: group, node: identity.nodeID, addresses: addresses, version: version, certificate: identity.certificateDER, signature: [])
        try record.sign(by: identity)
        return record
    }

    init(group: String, node: String, addresses: [String], version: Int64, certificate: [UInt8], signature: [UInt8]) {
        self.group = group
        self.node = node
        self.addresses = addresses
        self.version = version
        self.certificate = certificate
        self.signature = signature
    }

    /// Reads a record body; every missing, unknown or mistyped member is a clear error.
    public init(parsing json: JSON) throws(MembershipError) {
        let r = try SignedBodyReader<Self>(json, known: ["group", "node", "addresses", "version", "certificate"])
        group = try r.nodeID("group")
        node = try r.nodeID("node")
        guard case .array(let list)? = r["addresses"], list.count <= 16 else {
            throw .malformedEntry("\"addresses\" is missing, not an array, or longer than 16")
        }
        addresses = []
        for a in list {
            guard let s = a.stringValue, s.utf8.count <= 300, InvitationCode.split(address: s) != nil else {
                throw .malformedEntry("\"addresses\" holds something that is not a host:port address")
            }
            addresses.append(s)
        }
        version = try r.version()
        certificate = try r.base64("certificate")
        signature = try r.base64("signature")
    }

    /// Whether `self` supersedes `other` for the same node: the higher version, then the
    /// higher signature bytes (so every node picks the same).
    public func supersedes(_ other: MemberAddresses) -> Bool {
        if version != other.version { return version > other.version }
        return NodeSignature.greater(signature, other.signature)
    }
}
