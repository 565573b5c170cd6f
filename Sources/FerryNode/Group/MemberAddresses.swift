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
public struct MemberAddresses: Sendable, Equatable {
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

    var unsignedBody: [String: JSON] {
        [
            "type": .string(Self.type), "group": .string(group), "node": .string(node),
            "addresses": .array(addresses.map(JSON.string)), "version": .int(version),
            "certificate": .string(Data(certificate).base64EncodedString()),
        ]
    }

    public var body: JSON {
        var o = unsignedBody
        o["signature"] = .string(Data(signature).base64EncodedString())
        return .object(o)
    }

    /// A record of `identity`'s own addresses.
    public static func signed(group: String, addresses: [String], version: Int64, by identity: NodeIdentity) throws(MembershipError)
        -> MemberAddresses
    {
        var record = MemberAddresses(
            group: group, node: identity.nodeID, addresses: addresses, version: version, certificate: identity.certificateDER, signature: [])
        record.signature = try NodeSignature.sign(record.unsignedBody, by: identity)
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
        guard let o = json.objectValue else { throw .malformedEntry("the body is not a JSON object") }
        let known: Set<String> = ["type", "group", "node", "addresses", "version", "certificate", "signature"]
        if let extra = o.keys.first(where: { !known.contains($0) }) { throw .malformedEntry("unknown member \"\(LogText.escape(extra))\"") }
        guard o["type"]?.stringValue == Self.type else { throw .malformedEntry("\"type\" is not \"\(Self.type)\"") }
        func nodeID(_ key: String) throws(MembershipError) -> String {
            guard let s = o[key]?.stringValue, s.utf8.count == 64, NodeIDFormat.normalized(s) == s else {
                throw .malformedEntry("\"\(key)\" is not a node ID (64 lowercase hex digits)")
            }
            return s
        }
        func base64(_ key: String) throws(MembershipError) -> [UInt8] {
            guard let s = o[key]?.stringValue, let d = Data(base64Encoded: s) else { throw .malformedEntry("\"\(key)\" is not base64") }
            return Array(d)
        }
        group = try nodeID("group")
        node = try nodeID("node")
        guard case .array(let list)? = o["addresses"], list.count <= 16 else {
            throw .malformedEntry("\"addresses\" is missing, not an array, or longer than 16")
        }
        addresses = []
        for a in list {
            guard let s = a.stringValue, s.utf8.count <= 300, InvitationCode.split(address: s) != nil else {
                throw .malformedEntry("\"addresses\" holds something that is not a host:port address")
            }
            addresses.append(s)
        }
        guard let v = o["version"]?.intValue, v > 0 else { throw .malformedEntry("\"version\" is not a positive integer") }
        version = v
        certificate = try base64("certificate")
        signature = try base64("signature")
    }

    /// Whether `self` supersedes `other` for the same node: the higher version, then the
    /// higher signature bytes (so every node picks the same).
    public func supersedes(_ other: MemberAddresses) -> Bool {
        if version != other.version { return version > other.version }
        return NodeSignature.greater(signature, other.signature)
    }

    /// Checks that the record is signed by the node it names.
    /// Only a node may say where it listens: the certificate must be the named node's own.
    public func verifySignature() throws(MembershipError) {
        try NodeSignature.verify(unsignedBody, signature: signature, certificate: certificate, signer: node, whose: "the record's certificate")
    }
}
