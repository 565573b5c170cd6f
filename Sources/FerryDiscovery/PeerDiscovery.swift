import FerryCore
import ServiceLifecycle

/// A peer seen by a discovery mechanism: who it claims to be and where it listens.
///
/// Discovery is only a hint: the node ID here comes from an unauthenticated TXT record,
/// so a connection still pins that ID inside the TLS handshake.
public struct DiscoveredPeer: Sendable, Equatable, Hashable {
    /// The service instance name (unique on the link), or a static peer's URL.
    public var instance: String
    /// Lowercase hex SHA-256 of the peer's certificate, as advertised.
    public var nodeID: String
    /// The group (database name) the peer serves.
    public var group: String
    /// The protocol version the peer advertises.
    public var protocolVersion: Int
    /// The host name the service points at.
    public var host: String
    /// Resolved IPv4 addresses (dotted quad), best first.
    public var addresses: [String]
    public var port: Int
    /// Where it was learned: `.dnsSD` or `.static`.
    public var source: PeerSource

    public init(
        instance: String, nodeID: String, group: String, protocolVersion: Int, host: String,
        addresses: [String], port: Int, source: PeerSource
    ) {
        self.instance = instance
        self.nodeID = nodeID
        self.group = group
        self.protocolVersion = protocolVersion
        self.host = host
        self.addresses = addresses
        self.port = port
        self.source = source
    }

    /// The instance name a node advertises: its name and the first 8 hex digits of its ID,
    /// so that two nodes of one name stay apart on the link.
    public static func instanceName(nodeName: String, nodeID: String) -> String { "\(nodeName)-\(nodeID.prefix(8))" }

    /// The node's own name, when the instance is named as `instanceName` names it (a
    /// renamed instance, after a clash on the link, or a static URL stays as it is).
    public var nodeName: String {
        let suffix = "-\(nodeID.prefix(8))"
        guard nodeID.count >= 8, instance.hasSuffix(suffix), instance.count > suffix.count else { return instance }
        return String(instance.dropLast(suffix.count))
    }
}

/// What a discovery mechanism reports over time.
public enum DiscoveryEvent: Sendable, Equatable {
    /// A peer appeared, or its address or TXT changed (the newest value wins).
    case appeared(DiscoveredPeer)
    /// The service instance went away.
    case disappeared(instance: String)
    /// Discovery is not working (for example, no avahi-daemon); the node goes on without it.
    case unavailable(reason: String)
    /// Discovery works (again).
    case available
}

/// A source of peers: a long-running Service that advertises this node and reports
/// the peers it sees. The peer manager consumes `events` (one consumer).
public protocol PeerDiscovery: Service {
    var events: AsyncStream<DiscoveryEvent> { get }
    /// Sets what to advertise; called before `run`, once the listener's port is known.
    /// A mechanism that announces nothing ignores it.
    func advertise(_ advertisement: Advertisement)
    /// Whether discovery works, once its first attempt to start is over; throws
    /// `CancellationError` if the task is cancelled first.
    func firstAvailability() async throws -> DiscoveryAvailability
}

/// Whether a discovery mechanism could start.
public enum DiscoveryAvailability: Sendable, Equatable {
    case available
    /// It could not start (for example, no avahi-daemon); it retries in the background.
    case unavailable(reason: String)
}

extension PeerDiscovery {
    /// A mechanism with nothing to start works at once.
    public func firstAvailability() async throws -> DiscoveryAvailability { .available }
}

/// What this node advertises.
public struct Advertisement: Sendable, Equatable {
    /// Instance name shown to browsers; avahi renames it on a collision.
    public var instanceName: String
    public var nodeID: String
    public var group: String
    public var protocolVersion: Int
    public var port: Int

    public init(instanceName: String, nodeID: String, group: String, protocolVersion: Int, port: Int) {
        self.instanceName = instanceName
        self.nodeID = nodeID
        self.group = group
        self.protocolVersion = protocolVersion
        self.port = port
    }

    /// The DNS-SD service type Ferry uses.
    public static let serviceType = "_ferry._tcp"

    /// TXT keys: `id` node ID, `proto` protocol version, `group` database/group name.
    public var txt: [String: String] {
        ["id": nodeID, "proto": String(protocolVersion), "group": group]
    }
}

/// A fixed list of peers, reported once at start: the stand-in for DNS-SD in tests,
/// and the way static peers can flow through the same path.
public final class StaticDiscovery: PeerDiscovery, Sendable {
    public let peers: [DiscoveredPeer]
    public let events: AsyncStream<DiscoveryEvent>
    let continuation: AsyncStream<DiscoveryEvent>.Continuation

    public init(peers: [DiscoveredPeer]) {
        self.peers = peers
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
    }

    /// A fixed list announces nothing.
    public func advertise(_ advertisement: Advertisement) {}

    /// Injects an event, as a test or another mechanism would.
    public func report(_ event: DiscoveryEvent) { continuation.yield(event) }

    public func run() async throws {
        continuation.yield(.available)
        for peer in peers { continuation.yield(.appeared(peer)) }
        try? await gracefulShutdown()
        continuation.finish()
    }
}
