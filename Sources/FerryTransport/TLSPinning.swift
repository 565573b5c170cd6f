import Crypto
import FerryCore
import FerryPinning
import Logging
import NIOCore
import NIOSSL
import X509

/// Which peers a TLS endpoint accepts, decided inside the handshake by the SHA-256
/// fingerprint of the peer's leaf certificate.
public enum PeerTrust: Sendable, Equatable {
    /// Only these node IDs (lowercase hex SHA-256 of the certificate DER).
    case pinned(Set<String>)
    /// Any certificate: an explicit, logged development opt-in.
    case acceptAnyPeer
    /// The IDs in a set that may change while the endpoint runs (a node's trust store).
    case dynamic(TrustedIDs)

    /// Pins the certificate in a PEM file (its fingerprint), e.g. one copied from the peer's
    /// `DATA/identity/cert.pem`.
    public static func pinnedCertificate(pemFile path: String) throws(TransportError) -> PeerTrust {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw .identity("cannot read the pinned certificate \(path)")
        }
        guard let der = try? NIOSSLCertificate(bytes: Array(text.utf8), format: .pem).toDERBytes() else {
            throw .identity("\(path) is not a PEM certificate")
        }
        return .pinned([PinnedTLS.fingerprint(der: der)])
    }
}

extension PeerTrust {
    /// Whether a node ID passes (ignoring acceptAnyPeer's logging).
    public func admits(_ id: String) -> Bool {
        switch self {
        case .acceptAnyPeer: return true
        case .pinned(let ids): return ids.contains(id)
        case .dynamic(let set): return set.contains(id)
        }
    }
}

/// A set of trusted node IDs shared by the listener and the node's trust store; a change
/// applies to the next handshake.
public final class TrustedIDs: Sendable, Equatable {
    private let ids: Locked<Set<String>>
    private let revocationHandlers = Locked<[@Sendable (Set<String>) -> Void]>([])
    public init(_ ids: Set<String> = []) { self.ids = Locked(ids) }
    public func contains(_ id: String) -> Bool { ids.withLock { $0.contains(id) } }

    /// Replaces the set; the IDs that left it are handed to every revocation handler.
    public func replace(with new: Set<String>) {
        let revoked = ids.withLock { old -> Set<String> in
            defer { old = new }
            return old.subtracting(new)
        }
        guard !revoked.isEmpty else { return }
        for handler in revocationHandlers.withLock({ $0 }) { handler(revoked) }
    }

    /// Calls `handler` with the IDs removed by each later `replace(with:)`.
    public func onRevocation(_ handler: @escaping @Sendable (Set<String>) -> Void) {
        revocationHandlers.withLock { $0.append(handler) }
    }

    public var all: Set<String> { ids.withLock { $0 } }
    public static func == (a: TrustedIDs, b: TrustedIDs) -> Bool { a === b }
}

/// Records what the verification callback and the TLS handler saw, so errors can say which
/// peer was refused and why.
final class HandshakeRecord: Sendable {
    /// The client's IP address, for logs.
    let remote: String?
    init(remote: String? = nil) { self.remote = remote }
    private let state = Locked<(peer: String?, refused: String?, tlsError: String?)>((nil, nil, nil))
    private let enrolling = Locked(false)
    var peerID: String? { state.withLock { $0.peer } }
    /// Whether the peer is not trusted and was let through only to join (an open invitation).
    var isEnrollmentOnly: Bool { enrolling.withLock { $0 } }
    func admittedToEnroll(_ id: String) {
        enrolling.withLock { $0 = true }
        accepted(id)
    }
    var refusedID: String? { state.withLock { $0.refused } }
    /// The first error the TLS handler raised, as text.
    var tlsError: String? { state.withLock { $0.tlsError } }
    func accepted(_ id: String) { state.withLock { $0.peer = id } }
    func refused(_ id: String) { state.withLock { $0.refused = id } }
    func failed(_ error: any Error) { state.withLock { $0.tlsError = $0.tlsError ?? String(describing: error) } }
}

/// Keeps the first error the TLS handler raises in the handshake record: the upgrade that
/// fails after it only reports a closed channel.
final class TLSErrorRecorder: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    let record: HandshakeRecord
    init(record: HandshakeRecord) { self.record = record }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        record.failed(error)
        context.fireErrorCaught(error)
    }
}

/// Says whether a refused peer is news: its first refusal in `window` is, repeats are not.
/// A peer that is not trusted (yet) redials every second or two, and one warning a window
/// says as much as one per attempt.
public final class RepeatedRefusals: Sendable {
    let window: Duration
    private let lastWarned = Locked<[String: ContinuousClock.Instant]>([:])

    public init(window: Duration = .seconds(60)) { self.window = window }

    /// How many peers it remembers.
    public var trackedCount: Int { lastWarned.withLock { $0.count } }

    public func isNews(_ id: String, now: ContinuousClock.Instant = .now) -> Bool {
        lastWarned.withLock { seen in
            if let last = seen[id], now - last < window { return false }
            // Bounded however many IDs dial: forget those whose window has passed.
            if seen.count >= 1024 { seen = seen.filter { now - $0.value < window } }
            seen[id] = now
            return true
        }
    }
}

/// TLS failures in user terms instead of BoringSSL's error strings.
public enum TLSFailure {
    /// Why a handshake failed, from the error text (NIOSSL/BoringSSL), or nil when it names
    /// no TLS cause. `ownID` names this node's certificate when the peer refused it.
    public static func reason(_ text: String, ownID: String? = nil) -> String? {
        let t = text.uppercased()
        if t.contains("PEER_DID_NOT_RETURN_A_CERTIFICATE") {
            return "the peer presented no certificate"
        }
        if t.contains("ALERT_CERTIFICATE_REQUIRED") {
            return "the peer requires a client certificate, and this side presented none"
        }
        if t.contains("ALERT_BAD_CERTIFICATE") || t.contains("ALERT_CERTIFICATE_UNKNOWN") || t.contains("ALERT_UNKNOWN_CA")
            || t.contains("ALERT_ACCESS_DENIED") || t.contains("ALERT_HANDSHAKE_FAILURE")
        {
            return "the peer does not trust this node's certificate" + (ownID.map { " (fingerprint \($0)): trust it there" } ?? "")
        }
        if t.contains("WRONG_VERSION_NUMBER") || t.contains("HTTP_REQUEST") || t.contains("HTTPS_PROXY_REQUEST")
            || t.contains("NOT_SSL") || t.contains("PACKET_LENGTH_TOO_LONG")
        {
            return "the peer does not speak TLS (a plaintext ws:// node, or not a Ferry node?)"
        }
        if t.contains("UNSUPPORTED_PROTOCOL") || t.contains("PROTOCOL_VERSION") {
            return "the peer does not offer TLS 1.3"
        }
        if t.contains("CERTIFICATE_VERIFY_FAILED") { return "the peer's certificate is not trusted" }
        if let range = text.range(of: "OPENSSL_internal:") {
            let code = text[range.upperBound...].prefix { $0.isLetter || $0.isNumber || $0 == "_" }
            if !code.isEmpty { return "the TLS handshake failed (\(code.lowercased().replacingOccurrences(of: "_", with: " ")))" }
        }
        return nil
    }
}

/// The node's pinned TLS contexts and verdicts, made with `PinnedTLS` (the one pinning
/// implementation): TLS 1.3, the node's identity, NIOSSL's default roots (an empty set broke
/// a redial after a refused handshake; the package depends on ca-certificates instead).
enum TLSContexts {
    static func sslIdentity(_ identity: NodeIdentity) throws -> (certificate: NIOSSLCertificate, key: NIOSSLPrivateKey) {
        let cert = try NIOSSLCertificate(bytes: identity.certificateDER, format: .der)
        let key = try NIOSSLPrivateKey(bytes: Array(identity.privateKey.derRepresentation), format: .der)
        return (cert, key)
    }

    /// Server side: TLS 1.3, client certificates required unless `requireClientCertificate` is false.
    static func server(identity: NodeIdentity, requireClientCertificate: Bool) throws -> NIOSSLContext {
        try PinnedTLS.serverContext(
            identity: try sslIdentity(identity), requireClientCertificate: requireClientCertificate, minimumVersion: .tlsv13,
            roots: .defaults)
    }

    /// Client side: TLS 1.3, presenting the node's certificate for mutual TLS.
    static func client(identity: NodeIdentity?) throws -> NIOSSLContext {
        try PinnedTLS.clientContext(identity: try identity.map(sslIdentity), minimumVersion: .tlsv13, roots: .defaults)
    }

    /// A callback that accepts exactly the trusted fingerprints, recording the outcome.
    /// With `refusals`, only the first refusal of a peer in its window is a warning.
    /// With `enrollmentOpen`, an unknown certificate passes while it returns true, marked
    /// in the record as enrollment-only (the listener then allows it the join path alone).
    static func verifier(
        trust: PeerTrust, record: HandshakeRecord, logger: Logger, refusals: RepeatedRefusals? = nil,
        enrollmentOpen: (@Sendable () -> Bool)? = nil
    ) -> NIOSSLCustomVerificationCallback {
        PinnedTLS.verifier { id, _ in
            switch trust {
            case .acceptAnyPeer:
                logger.warning("accepting an unpinned peer certificate (acceptAnyPeer)", metadata: ["peer": "\(id)"])
                record.accepted(id)
                return true
            case .pinned, .dynamic:
                if trust.admits(id) {
                    record.accepted(id)
                    return true
                } else if let enrollmentOpen, enrollmentOpen() {
                    let level: Logger.Level = refusals?.isNews("enroll \(id)") ?? true ? .info : .debug
                    logger.log(
                        level: level, "admitted an unknown certificate to the join exchange only",
                        metadata: ["peer": "\(id)", "remote": "\(record.remote ?? "?")"])
                    record.admittedToEnroll(id)
                    return true
                } else {
                    record.refused(id)
                    let level: Logger.Level = refusals?.isNews(id) ?? true ? .warning : .debug
                    logger.log(
                        level: level, "refused a peer certificate that is not pinned",
                        metadata: ["peer": "\(id)", "remote": "\(record.remote ?? "?")"])
                    return false
                }
            }
        }
    }
}

/// Reads public keys out of node certificates, for checking signatures made with node identities.
public enum CertificateKeys {
    /// The P-256 signing key of a DER certificate, or nil when it is not one or holds another key type.
    public static func p256PublicKey(certificateDER der: [UInt8]) -> P256.Signing.PublicKey? {
        guard let certificate = try? Certificate(derEncoded: der) else { return nil }
        return P256.Signing.PublicKey(certificate.publicKey)
    }
}
