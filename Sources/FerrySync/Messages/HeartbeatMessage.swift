import FerryCore
import FerryStore

// heartbeat: the no-reply request that says a connection is alive, and which links its sender has.

/// The no-reply `heartbeat` request (docs/protocol.md §3): sent on an idle connection, and
/// at once when the sender's live links changed, which it then lists. An empty body says
/// nothing but "alive".
struct HeartbeatMessage: Sendable, Equatable {
    static let profile = SyncProtocol.Profile.heartbeat
    /// The node IDs of the sender's live full links, sorted; nil when unchanged since its last heartbeat.
    var links: [String]?
    /// Whether the sender's half of this connection replicates every document both ways; sent with `links`.
    var full: Bool?
    /// The version of the group's access rules at the sender (absent without rules); sent with `full`.
    var rules: String?
    /// Whether the sender's half replicates, both ways, every document those rules grant the
    /// peer, with nothing narrowed by hand; sent (true only) with `full`.
    var grant = false
    /// The sender's content digest (as `GET /` shows it) as of its latest commit; sent when
    /// it changed since the sender's last heartbeat on this connection (anti-entropy).
    var digest: String?
    /// The digest last sent no longer describes the sender's store, and no new one is known
    /// yet (wire: `"digest": null`): the receiver forgets it.
    var digestUnknown = false
    /// The sender's digest over the documents both ends may read under the group's rules
    /// (sent on a link under the rules in place of `digest`); same rules as `digest`.
    var view: String?
    /// As `digestUnknown`, for `view` (wire: `"view": null`).
    var viewUnknown = false

    init(links: [String]? = nil, full: Bool? = nil, digest: String? = nil) {
        self.links = links
        self.full = full
        self.digest = digest
    }

    /// Empty when there is nothing to say beyond "alive".
    var bytes: [UInt8] {
        var o: [String: JSON] = [:]
        if let links { o["links"] = .array(links.map { .string($0) }) }
        if let full { o["full"] = .bool(full) }
        if let rules { o["rules"] = .string(rules) }
        if grant { o["grant"] = true }
        if let digest { o["digest"] = .string(digest) } else if digestUnknown { o["digest"] = .null }
        if let view { o["view"] = .string(view) } else if viewUnknown { o["view"] = .null }
        return o.isEmpty ? [] : JSON.object(o).canonicalBytes
    }

    init(body: [UInt8]) throws(SyncError) {
        guard !body.isEmpty else { return }
        let o: JSON
        do { o = try JSON.parse(body) } catch { throw .protocolViolation("heartbeat body is not JSON") }
        guard case .object = o else { throw .protocolViolation("heartbeat body is not a JSON object") }
        switch o["links"] {
        case nil: break
        case .array(let items)?:
            var ids: [String] = []
            for item in items {
                guard let id = item.stringValue else { throw .protocolViolation("heartbeat links must be strings") }
                ids.append(id)
            }
            links = ids
        default: throw .protocolViolation("heartbeat links must be an array")
        }
        switch o["full"] {
        case nil: break
        case .bool(let b)?: full = b
        default: throw .protocolViolation("heartbeat full must be a boolean")
        }
        switch o["rules"] {
        case nil: break
        case .string(let v)? where !v.isEmpty && v.utf8.count <= 128: rules = v
        default: throw .protocolViolation("heartbeat rules must be a string of 1 to 128 bytes")
        }
        switch o["grant"] {
        case nil: break
        case .bool(let b)?: grant = b
        default: throw .protocolViolation("heartbeat grant must be a boolean")
        }
        switch o["digest"] {
        case nil: break
        case .string(let d)? where !d.isEmpty && d.utf8.count <= 128: digest = d
        case .null?: digestUnknown = true
        default: throw .protocolViolation("heartbeat digest must be null or a string of at most 128 bytes")
        }
        switch o["view"] {
        case nil: break
        case .string(let d)? where !d.isEmpty && d.utf8.count <= 128: view = d
        case .null?: viewUnknown = true
        default: throw .protocolViolation("heartbeat view must be null or a string of at most 128 bytes")
        }
    }
}
