import FerryCore
import FerryStore
import Foundation
import Logging

// Where members listen: this node's addresses and signed record, the members' records, their dial URLs.
extension GroupMembership {
    /// Reads every live leaf of address record documents and keeps each node's newest record
    /// (the ledger keeps it even when a tree goes back to an older one).
    func rereadAddresses(_ ids: [DocumentID]) throws {
        let c = context
        var found: [MemberAddresses] = []
        for id in ids {
            guard let node = MemberAddresses.node(inDocument: id), let tree = try c.store.revisionTree(id) else { continue }
            for leaf in tree.leaves where !leaf.deleted {
                guard let doc = try? c.store.document(id, revision: leaf.id), let record = try? MemberAddresses(parsing: doc.body),
                    record.node == node, (try? record.verifySignature()) != nil
                else { continue }
                found.append(record)
            }
        }
        state.withLock { s in
            guard let group = s.group else { return }
            var changed = false
            for r in found where r.group == group { changed = s.remember(r) || changed }
            _ = ledger.persist(s, changed: changed)
        }
    }

    /// Writes a record of where this node listens now when that differs from what its peers
    /// know (its newest record, else its entry): so a member restarted on another port is
    /// dialled there. Nothing for a node outside a group or not yet bound.
    func announceOwnAddresses() throws {
        let c = context
        let me = c.identity.nodeID
        let current = c.listenAddresses()
        guard !current.isEmpty, let group = self.group, let view = self.view, view.isActiveMember(me) else { return }
        let (known, previous) = state.withLock { s in (s.addressRecords[me]?.addresses ?? view.selected[me]?.addresses, s.addressRecords[me]?.version ?? 0) }
        guard known != current else { return }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let record = try MemberAddresses.signed(group: group, addresses: current, version: max(now, previous + 1), by: c.identity)
        let id = MemberAddresses.documentID(me)
        try c.store.put(id, body: record.body, parent: try c.store.document(id)?.revision)
        try rereadAddresses([id])
        apply()
        logger.notice("this node listens somewhere new; telling the group", metadata: ["addresses": "\(current)"])
        let (overrides, records) = state.withLock { ($0.urlOverrides, $0.addressRecords) }
        addressAnnounced(id, Self.memberURLs(view, context: c, overrides: overrides, records: records))
    }

    /// The dial URL of each active member but this node. A member that moved since its
    /// entry was signed says where it is now (its address record); else a code's address
    /// (known to have worked) beats the entry's.
    static func memberURLs(
        _ view: MembershipView, context c: Context, overrides: [String: String], records: [String: MemberAddresses]
    ) -> [String: String] {
        var urls: [String: String] = [:]
        let scheme = c.insecure ? "ws" : "wss"
        for e in view.activeMembers where e.node != c.identity.nodeID {
            if let record = records[e.node], record.addresses != e.addresses, let address = record.addresses.first {
                urls[e.node] = "\(scheme)://\(address)/\(c.databaseName)/sync"
            } else if let url = overrides[e.node] {
                urls[e.node] = url
            } else if let address = e.addresses.first {
                urls[e.node] = "\(scheme)://\(address)/\(c.databaseName)/sync"
            }
        }
        return urls
    }

    /// The addresses this node can be reached at: the listener's interface when it is a
    /// specific one, else this host's non-loopback IPv4 addresses (loopback when it has none).
    static func listenAddresses(interface: String, port: Int) -> [String] {
        if interface != "0.0.0.0" && interface != "::" && !interface.isEmpty {
            return [interface.contains(":") ? "[\(interface)]:\(port)" : "\(interface):\(port)"]
        }
        var out: [String] = []
        var list: UnsafeMutablePointer<ifaddrs>?
        if getifaddrs(&list) == 0 {
            var cursor = list
            while let ifa = cursor {
                defer { cursor = ifa.pointee.ifa_next }
                guard let addr = ifa.pointee.ifa_addr, addr.pointee.sa_family == sa_family_t(AF_INET),
                    ifa.pointee.ifa_flags & UInt32(IFF_LOOPBACK) == 0, ifa.pointee.ifa_flags & UInt32(IFF_UP) != 0
                else { continue }
                var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
                if getnameinfo(addr, socklen_t(MemoryLayout<sockaddr_in>.size), &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0 {
                    let text = String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                    out.append("\(text):\(port)")
                }
            }
            freeifaddrs(list)
        }
        return out.isEmpty ? ["127.0.0.1:\(port)"] : out
    }
}
