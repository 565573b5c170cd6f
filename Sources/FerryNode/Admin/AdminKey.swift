import Crypto
import FerryCore
import Foundation

/// The admin API's shared secret: 32 random bytes as 64 hex digits in DATA/admin.key
/// (mode 0600), created on a node's first start and sent by every client as
/// `Authorization: Bearer KEY`.
public struct AdminKey: Sendable, CustomStringConvertible {
    /// The key as clients send it. Never log it.
    public let value: String
    /// SHA-256 of the key: requests are compared digest to digest, in constant time.
    let digest: SHA256.Digest

    /// Keeps the key out of logs and interpolations.
    public var description: String { "AdminKey(redacted)" }

    /// The file that holds a data directory's key.
    public static func path(dataDirectory: String) -> String { "\(dataDirectory)/admin.key" }

    public init(value: String) {
        self.value = value
        digest = SHA256.hash(data: Array(value.utf8))
    }

    /// Whether a presented key is this one (constant time: swift-crypto compares digests safely).
    public func matches(_ presented: some StringProtocol) -> Bool {
        SHA256.hash(data: Array(presented.utf8)) == digest
    }

    /// Loads DATA/admin.key, creating it (0600, exclusively) when absent. A key readable by
    /// others, or a file that holds no key, is refused rather than used.
    public static func loadOrCreate(dataDirectory: String) throws(NodeError) -> AdminKey {
        let path = path(dataDirectory: dataDirectory)
        if FileManager.default.fileExists(atPath: path) { return try load(path: path) }
        let key = AdminKey(value: Hex.encode(SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }))
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        // Another process created it first: use that one.
        if fd < 0 && errno == EEXIST { return try load(path: path) }
        guard fd >= 0 else { throw .badConfiguration("cannot create the admin key \(path): errno \(errno)") }
        defer { close(fd) }
        let bytes = Array((key.value + "\n").utf8)
        fchmod(fd, 0o600)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        fsync(fd)
        guard written == bytes.count else { throw .badConfiguration("cannot write the admin key \(path): errno \(errno)") }
        return key
    }

    /// Reads a key file, checking that only its owner can read it.
    public static func load(path: String) throws(NodeError) -> AdminKey {
        guard let attrs = try? FileManager.default.attributesOfItem(atPath: path) else {
            throw .badConfiguration("the admin key \(path) is missing")
        }
        if let mode = (attrs[.posixPermissions] as? NSNumber)?.uint16Value, mode & 0o077 != 0 {
            throw .badConfiguration(
                "the admin key \(path) is readable by others (mode \(String(mode, radix: 8))); run: chmod 600 \(path)")
        }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw .badConfiguration("cannot read the admin key \(path)")
        }
        let value = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard value.count >= 32, value.allSatisfy({ $0.isASCII && !$0.isWhitespace }) else {
            throw .badConfiguration("the admin key \(path) holds no key; delete it and restart the node to make a new one")
        }
        return AdminKey(value: value)
    }
}
