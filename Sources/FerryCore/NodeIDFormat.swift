/// The one rule for a node ID as people write it: the 64 hex digits of a certificate's
/// SHA-256 fingerprint, in either case; nodes store and compare it in lowercase.
public enum NodeIDFormat {
    /// The ID in lowercase if `text` is 64 hex digits, else nil.
    public static func normalized(_ text: some StringProtocol) -> String? {
        guard text.utf8.count == 64, text.allSatisfy(\.isHexDigit) else { return nil }
        return text.lowercased()
    }

    /// What to tell someone whose node ID is malformed.
    public static let requirement = "a node ID is 64 hex digits (see `ferry id`)"
}
