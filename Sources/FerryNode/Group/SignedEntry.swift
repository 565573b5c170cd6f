import FerryCore
import FerryTransport
import Foundation

/// A signed document of the group (member entries, address records, access rules, role
/// assignments): its body without `signature` is what is signed, P-256 ECDSA over its
/// canonical JSON, checked against the certificate the body carries, whose SHA-256 must be
/// the node said to have signed it (`NodeSignature`).
///
/// Each type says what it signs (`unsignedBody`) and who signed it; the body with its
/// signature, signing and checking are written once here, so the four cannot drift apart.
public protocol SignedEntry: Sendable {
    /// The error the type's callers branch on (`MembershipError`, `AccessError`).
    associatedtype Failure: Error
    static var type: String { get }
    /// The body without `signature`: what is signed.
    var unsignedBody: [String: JSON] { get }
    var signature: [UInt8] { get set }
    /// The node said to have signed it, and the certificate that must be that node's.
    var signedBy: (node: String, certificate: [UInt8]) { get }
    /// How an error names the certificate ("signerCertificate", "the record's certificate").
    static var certificateName: String { get }
    static func malformed(_ why: String) -> Failure
    static func badSignature(_ why: String) -> Failure
}

extension SignedEntry {
    /// The document body, signature included.
    public var body: JSON {
        var o = unsignedBody
        o["signature"] = .string(Data(signature).base64EncodedString())
        return .object(o)
    }

    /// Signs the body with `identity`'s key.
    mutating func sign(by identity: NodeIdentity) throws(Failure) {
        do { signature = try NodeSignature.sign(unsignedBody, by: identity) } catch {
            switch error {
            case .malformedEntry(let why): throw Self.malformed(why)
            default: throw Self.malformed(error.description)
            }
        }
    }

    /// Checks the signature alone (not the signer's authority): the certificate is the
    /// signer's and its key signed this body.
    public func verifySignature() throws(Failure) {
        let (node, certificate) = signedBy
        do {
            try NodeSignature.verify(unsignedBody, signature: signature, certificate: certificate, signer: node, whose: Self.certificateName)
        } catch {
            switch error {
            case .badSignature(let why): throw Self.badSignature(why)
            default: throw Self.badSignature(error.description)
            }
        }
    }
}

/// Reads a signed body's members, each missing, mistyped or unknown one a clear error of
/// the entry's own type; the first unknown member named is the first in sorted order, and
/// escaped, since the body came from another node.
struct SignedBodyReader<Entry: SignedEntry> {
    let object: [String: JSON]

    /// Checks that `json` is an object of `Entry.type` with no member outside `known` (and
    /// `type` and `signature`, always allowed).
    init(_ json: JSON, known: Set<String>) throws(Entry.Failure) {
        guard let o = json.objectValue else { throw Entry.malformed("the body is not a JSON object") }
        guard o["type"]?.stringValue == Entry.type else { throw Entry.malformed("\"type\" is not \"\(Entry.type)\"") }
        let all = known.union(["type", "signature"])
        if let extra = o.keys.sorted().first(where: { !all.contains($0) }) {
            throw Entry.malformed("unknown member \"\(LogText.escape(extra))\"")
        }
        object = o
    }

    subscript(key: String) -> JSON? { object[key] }

    func string(_ key: String) throws(Entry.Failure) -> String {
        guard let s = object[key]?.stringValue else { throw Entry.malformed("\"\(key)\" is missing or not a string") }
        return s
    }

    func bool(_ key: String) throws(Entry.Failure) -> Bool {
        guard let b = object[key]?.boolValue else { throw Entry.malformed("\"\(key)\" is missing or not a boolean") }
        return b
    }

    func nodeID(_ key: String) throws(Entry.Failure) -> String {
        let s = try string(key)
        guard s.utf8.count == 64, NodeIDFormat.normalized(s) == s else {
            throw Entry.malformed("\"\(key)\" is not a node ID (64 lowercase hex digits)")
        }
        return s
    }

    func base64(_ key: String) throws(Entry.Failure) -> [UInt8] {
        guard let d = Data(base64Encoded: try string(key)) else { throw Entry.malformed("\"\(key)\" is not base64") }
        return Array(d)
    }

    /// A version: a positive integer.
    func version(_ key: String = "version") throws(Entry.Failure) -> Int64 {
        guard let v = object[key]?.intValue, v >= 1 else { throw Entry.malformed("\"\(key)\" is not a positive integer") }
        return v
    }
}
