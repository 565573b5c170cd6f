import Crypto
import FerryCore
import FerryPinning
import Foundation
import SwiftASN1
import X509

/// A node's TLS identity: a self-signed P-256 certificate and its key, kept in the data
/// directory. The node ID is the lowercase hex SHA-256 of the certificate's DER.
public struct NodeIdentity: Sendable {
    public let certificate: Certificate
    public let privateKey: P256.Signing.PrivateKey
    public let certificateDER: [UInt8]
    /// The fingerprint people compare, pin and paste.
    public let nodeID: String
    public let certificatePath: String
    public let keyPath: String

    public var name: String {
        certificate.subject.description
    }
    public var expires: Date { certificate.notValidAfter }

    /// The lowercase hex SHA-256 of DER bytes: how node IDs are computed.
    public static func fingerprint(_ der: some Sequence<UInt8>) -> String {
        PinnedTLS.fingerprint(der: der)
    }

    static func paths(in directory: String) -> (cert: String, key: String) {
        ("\(directory)/identity/cert.pem", "\(directory)/identity/key.pem")
    }

    /// Loads the identity in `directory`, creating one on first use. Refuses, with a
    /// clear message, a key readable by others, corrupt files, or an expired certificate.
    public static func loadOrCreate(
        directory: String, name: String = ProcessInfo.processInfo.hostName, now: Date = Date(),
        validity: TimeInterval = 10 * 365 * 86400
    ) throws(TransportError) -> NodeIdentity {
        let (certPath, keyPath) = paths(in: directory)
        let fm = FileManager.default
        if !fm.fileExists(atPath: certPath) && !fm.fileExists(atPath: keyPath) {
            try create(directory: directory, name: name, now: now, validity: validity)
        }
        return try load(certificatePath: certPath, keyPath: keyPath, now: now)
    }

    static func create(directory: String, name: String, now: Date, validity: TimeInterval) throws(TransportError) {
        let (certPath, keyPath) = paths(in: directory)
        let key = P256.Signing.PrivateKey()
        let certificate: Certificate
        do {
            let subject = try DistinguishedName {
                CommonName(name.isEmpty ? "ferry-node" : String(name.prefix(64)))
                OrganizationName("Ferry")
            }
            var serial = [UInt8](repeating: 0, count: 16)
            for i in serial.indices { serial[i] = UInt8.random(in: 0...255) }
            serial[0] &= 0x7F
            certificate = try Certificate(
                version: .v3, serialNumber: Certificate.SerialNumber(bytes: serial),
                publicKey: Certificate.PublicKey(key.publicKey), notValidBefore: now.addingTimeInterval(-300),
                notValidAfter: now.addingTimeInterval(validity), issuer: subject, subject: subject,
                signatureAlgorithm: .ecdsaWithSHA256,
                extensions: try Certificate.Extensions {
                    Critical(BasicConstraints.notCertificateAuthority)
                    Critical(KeyUsage(digitalSignature: true))
                    try ExtendedKeyUsage([.serverAuth, .clientAuth])
                    SubjectAlternativeNames([
                        .dnsName(name.isEmpty ? "ferry-node" : name), .dnsName("localhost"),
                        .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1])),
                    ])
                }, issuerPrivateKey: Certificate.PrivateKey(key))
        } catch {
            throw .identity("cannot generate a certificate: \(error)")
        }
        do {
            try FileManager.default.createDirectory(
                atPath: (certPath as NSString).deletingLastPathComponent, withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
            let pem = try certificate.serializeAsPEM().pemString + "\n"
            try writeFile(keyPath, key.pemRepresentation + "\n", mode: 0o600)
            try writeFile(certPath, pem, mode: 0o644)
        } catch let e as TransportError {
            throw e
        } catch {
            throw .identity("cannot write the identity into \(directory)/identity: \(error.localizedDescription)")
        }
    }

    static func writeFile(_ path: String, _ text: String, mode: mode_t) throws(TransportError) {
        let temp = path + ".tmp"
        let fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC, mode)
        guard fd >= 0 else { throw .identity("cannot create \(temp): errno \(errno)") }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        fchmod(fd, mode)
        fsync(fd)
        close(fd)
        guard written == bytes.count, rename(temp, path) == 0 else { throw .identity("cannot write \(path)") }
    }

    /// Loads an identity from PEM files, checking permissions, integrity and validity.
    public static func load(certificatePath: String, keyPath: String, now: Date = Date()) throws(TransportError)
        -> NodeIdentity
    {
        guard let attrs = try? FileManager.default.attributesOfItem(atPath: keyPath) else {
            throw .identity("the identity key \(keyPath) is missing")
        }
        if let mode = (attrs[.posixPermissions] as? NSNumber)?.uint16Value, mode & 0o077 != 0 {
            throw .identity(
                "the identity key \(keyPath) is readable by others (mode \(String(mode, radix: 8))); run: chmod 600 \(keyPath)")
        }
        guard let keyText = try? String(contentsOfFile: keyPath, encoding: .utf8) else {
            throw .identity("cannot read the identity key \(keyPath)")
        }
        guard let certText = try? String(contentsOfFile: certificatePath, encoding: .utf8) else {
            throw .identity("the identity certificate \(certificatePath) is missing or unreadable")
        }
        let key: P256.Signing.PrivateKey
        do { key = try P256.Signing.PrivateKey(pemRepresentation: keyText) } catch {
            throw .identity("the identity key \(keyPath) is corrupt or not a P-256 key")
        }
        let certificate: Certificate
        do { certificate = try Certificate(pemEncoded: certText) } catch {
            throw .identity("the identity certificate \(certificatePath) is corrupt")
        }
        guard certificate.publicKey == Certificate.PublicKey(key.publicKey) else {
            throw .identity("the identity certificate \(certificatePath) does not belong to the key \(keyPath)")
        }
        if certificate.notValidAfter < now {
            throw .identity("the identity certificate \(certificatePath) expired on \(certificate.notValidAfter)")
        }
        var serializer = DER.Serializer()
        do { try serializer.serialize(certificate) } catch { throw .identity("cannot encode the certificate: \(error)") }
        let der = serializer.serializedBytes
        return NodeIdentity(
            certificate: certificate, privateKey: key, certificateDER: der, nodeID: fingerprint(der),
            certificatePath: certificatePath, keyPath: keyPath)
    }

    /// Installs an existing PEM identity into `directory`, replacing none: fails if one exists.
    public static func importPEM(certificatePath: String, keyPath: String, into directory: String) throws(TransportError)
        -> NodeIdentity
    {
        let (destCert, destKey) = paths(in: directory)
        if FileManager.default.fileExists(atPath: destCert) || FileManager.default.fileExists(atPath: destKey) {
            throw .identity("\(directory) already has an identity; remove \(directory)/identity first")
        }
        guard let certText = try? String(contentsOfFile: certificatePath, encoding: .utf8),
            let keyText = try? String(contentsOfFile: keyPath, encoding: .utf8)
        else { throw .identity("cannot read \(certificatePath) or \(keyPath)") }
        do {
            try FileManager.default.createDirectory(
                atPath: (destCert as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        } catch { throw .identity("cannot create \(directory)/identity") }
        try writeFile(destKey, keyText, mode: 0o600)
        try writeFile(destCert, certText, mode: 0o644)
        do {
            return try load(certificatePath: destCert, keyPath: destKey)
        } catch {
            try? FileManager.default.removeItem(atPath: destKey)
            try? FileManager.default.removeItem(atPath: destCert)
            throw error
        }
    }
}
