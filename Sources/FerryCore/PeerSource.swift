/// Where a node learned of a peer, a trust entry or a replication; the raw value is the
/// name the admin API, `trust.json` and the logs use.
public enum PeerSource: String, Sendable, Hashable, CaseIterable, Comparable {
    /// The config file (`trust[]`, `replications[]`).
    case config
    /// The admin API or the CLI's trust commands.
    case api
    /// Trust on first use: the first node discovered in the group.
    case tofu
    /// A static peer of the config file, trusted because it is dialled.
    case peer
    /// Found by DNS-SD browsing.
    case dnsSD = "dns-sd"
    /// A static peer URL, dialled without discovery.
    case `static`
    /// Known only because it dialled this node.
    case inbound
    /// A valid active member of this node's group (signed membership entries).
    case group

    public static func < (a: PeerSource, b: PeerSource) -> Bool { a.rawValue < b.rawValue }
}
