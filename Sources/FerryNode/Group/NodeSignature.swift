import Crypto
import FerryCore
import FerryTransport

/// Signs and checks the group's signed documents (member entries, address records, access entries): P-256
/// ECDSA over the canonical JSON of the body without its `signature`, checked against the
/// certificate the body carries, whose SHA-256 must be the node said to have signed it.
enum NodeSignature {
    /// The DER signature of `unsigned` by `identity`.
    static func sign(_ unsigned: [String: JSON], by identity: NodeIdentity) throws(MembershipError) -> [UInt8] {
        do {
            return Array(try identity.privateKey.signature(for: JSON.object(unsigned).canonicalBytes).derRepresentation)
        } catch {
            throw .malformedEntry("cannot sign: \(error)")
        }
    }

    /// Checks that `certificate` is `signer`'s and that its key signed `unsigned`.
    static func verify(
        _ unsigned: [String: JSON], signature: [UInt8], certificate: [UInt8], signer: String, whose: String
    ) throws(MembershipError) {
        guard NodeIdentity.fingerprint(certificate) == signer else { throw .badSignature("\(whose) is not the certificate of signer \(signer.prefix(12))") }
        guard let key = CertificateKeys.p256PublicKey(certificateDER: certificate) else {
            throw .badSignature("\(whose) holds no P-256 public key")
        }
        guard let parsed = try? P256.Signing.ECDSASignature(derRepresentation: signature),
            key.isValidSignature(parsed, for: JSON.object(unsigned).canonicalBytes)
        else { throw .badSignature("the signature does not verify") }
    }

    /// The tie-break of two signed entries at equal version and state: the lexicographically
    /// greater signature bytes win, so every node picks the same one.
    static func greater(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a != b && !a.lexicographicallyPrecedes(b)
    }

    /// The document `prefix` + `node` (node IDs are 64 lowercase hex digits, always a valid
    /// ID under the reserved prefix).
    static func documentID(_ prefix: String, _ node: String) -> DocumentID {
        try! DocumentID(prefix + node, allowReserved: true)
    }

    /// The node a document under `prefix` names, or nil for any other ID.
    static func node(inDocument id: DocumentID, prefix: String) -> String? {
        guard id.rawValue.hasPrefix(prefix) else { return nil }
        return String(id.rawValue.dropFirst(prefix.count))
    }
}
