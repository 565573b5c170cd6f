import FerryCore
import Foundation

/// Byte counters of one lab host's `eth0`, read over netlink inside the host's namespace.
public struct LinkCounters: Sendable, Equatable {
    public var received: Int64
    public var sent: Int64
    /// Both directions together.
    public var total: Int64 { received + sent }

    public static func - (a: LinkCounters, b: LinkCounters) -> LinkCounters {
        LinkCounters(received: a.received - b.received, sent: a.sent - b.sent)
    }
}

extension Lab {
    /// Limits what `host` sends on its `eth0` with a token bucket (`tc … tbf`), as a slow
    /// link would: `rate` in tc's notation, such as "20mbit".
    public func limitLink(_ host: LabHost, rate: String, burst: String = "64kb", latency: String = "100ms") async throws {
        let r = try await run(host, ["/usr/sbin/tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", burst, "latency", latency])
        guard r.status == 0 else { throw HarnessError("tc tbf on \(host.name) failed: \(r.stderr)") }
    }

    /// The bytes `host`'s `eth0` has received and sent since it came up (link-layer frames,
    /// so TCP, TLS and WebSocket overheads are counted).
    public func counters(_ host: LabHost) async throws -> LinkCounters {
        let r = try await run(host, ["/usr/sbin/ip", "-j", "-s", "link", "show", "dev", "eth0"])
        guard r.status == 0, case .array(let links)? = try? JSON.parse(Array(r.stdout.utf8)), let stats = links.first?["stats64"],
            let rx = stats["rx"]?["bytes"]?.intValue, let tx = stats["tx"]?["bytes"]?.intValue
        else { throw HarnessError("cannot read eth0 counters on \(host.name): \(r.stderr)\(r.stdout)") }
        return LinkCounters(received: rx, sent: tx)
    }
}
