import Crypto
import FerryCore
import NIOSSL

/// The one check of a TLS peer's certificate against pinned SHA-256 fingerprints, and the
/// contexts built to rely on it: every pinned connection (the WebSocket connector and
/// listener, the CouchDB client) is made from these.
///
/// Certificates are self-signed, so no chain is checked: the handshake passes exactly when
/// the verification callback says the leaf's fingerprint is trusted. Contexts use
/// `.noHostnameVerification` with that callback: with `.none`, BoringSSL ignores the
/// callback's verdict and a wrong certificate would connect (../shared/notes/platform.md).
public enum PinnedTLS {
    /// Which system CA bundle a context loads. The pin decides either way; `.none` lets a
    /// context start on a machine without `ca-certificates`.
    public enum SystemRoots: Sendable {
        /// NIOSSL's default trust roots.
        case defaults
        /// No CA certificates at all.
        case none
    }

    /// The SHA-256 of a certificate's DER, in lowercase hex: a node ID, a pin.
    public static func fingerprint(der: some Sequence<UInt8>) -> String {
        Hex.encode(SHA256.hash(data: Array(der)))
    }

    /// The fingerprint of a certificate; nil when it cannot be encoded.
    public static func fingerprint(_ certificate: NIOSSLCertificate) -> String? {
        (try? certificate.toDERBytes()).map { fingerprint(der: $0) }
    }

    /// A verification callback that passes the handshake exactly when `trusts` returns true
    /// for the fingerprint of the peer's leaf certificate. A peer that presents none fails
    /// without `trusts` being asked.
    public static func verifier(
        _ trusts: @escaping @Sendable (_ fingerprint: String, _ leaf: NIOSSLCertificate) -> Bool
    ) -> NIOSSLCustomVerificationCallback {
        { certificates, promise in
            guard let leaf = certificates.first, let print = fingerprint(leaf) else {
                promise.succeed(.failed)
                return
            }
            promise.succeed(trusts(print, leaf) ? .certificateVerified : .failed)
        }
    }

    /// A client context whose handshakes pass only by `verifier`'s verdict, presenting
    /// `identity` (certificate, key) for mutual TLS when given.
    public static func clientContext(
        identity: (certificate: NIOSSLCertificate, key: NIOSSLPrivateKey)? = nil, minimumVersion: TLSVersion? = nil,
        roots: SystemRoots
    ) throws -> NIOSSLContext {
        var config = TLSConfiguration.makeClientConfiguration()
        if let minimumVersion { config.minimumTLSVersion = minimumVersion }
        config.certificateVerification = .noHostnameVerification
        if case .none = roots { config.trustRoots = .certificates([]) }
        if let identity {
            config.certificateChain = [.certificate(identity.certificate)]
            config.privateKey = .privateKey(identity.key)
        }
        return try NIOSSLContext(configuration: config)
    }

    /// A server context presenting `identity`. With `requireClientCertificate`, a client
    /// must present a certificate, which only `verifier`'s verdict admits; without, none is asked for.
    public static func serverContext(
        identity: (certificate: NIOSSLCertificate, key: NIOSSLPrivateKey), requireClientCertificate: Bool,
        minimumVersion: TLSVersion? = nil, roots: SystemRoots
    ) throws -> NIOSSLContext {
        var config = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(identity.certificate)], privateKey: .privateKey(identity.key))
        if let minimumVersion { config.minimumTLSVersion = minimumVersion }
        config.certificateVerification = requireClientCertificate ? .noHostnameVerification : .none
        if case .none = roots { config.trustRoots = .certificates([]) }
        return try NIOSSLContext(configuration: config)
    }

    /// The host as SNI carries it: host names only, never addresses.
    public static func serverName(_ host: String) -> String? {
        host.contains(":") || host.allSatisfy({ $0.isNumber || $0 == "." }) ? nil : host
    }
}
