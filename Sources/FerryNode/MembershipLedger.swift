import FerryCore
import FerryStore
import Foundation

/// Which group this node belongs to (DATA/group.json) and every signature-checked member
/// entry and address record it has seen: the state the store's validator checks incoming
/// entries against, made before the store so that the store can be opened with it.
public final class MembershipLedger: Sendable {
    struct State {
        var group: String?
        /// Every signature-checked entry seen, by node: read from the store or accepted by the validator.
        var ledger: [String: [MemberEntry]] = [:]
        var view: MembershipView?
        /// Dial URLs learned from a code (the inviter's reachable address), preferred over entries'.
        var urlOverrides: [String: String] = [:]
        /// Each node's newest signature-checked record of where it listens now.
        var addressRecords: [String: MemberAddresses] = [:]
    }

    let directory: String
    let file: String
    let state: Locked<State>

    /// Reads DATA/group.json (absent: no group yet).
    public init(dataDirectory: String) throws(NodeError) {
        directory = dataDirectory
        file = "\(dataDirectory)/group.json"
        var group: String?
        if let data = FileManager.default.contents(atPath: file) {
            guard let json = try? JSON.parse(Array(data)), let g = json["group"]?.stringValue, let id = NodeIDFormat.normalized(g) else {
                throw .badConfiguration("\(file) is corrupt: it must hold {\"group\": <founder node ID>}")
            }
            group = id
        }
        state = Locked(State(group: group))
    }

    public var group: String? { state.withLock { $0.group } }
}

extension MembershipLedger {
    /// The nodes whose selected entry says they were removed from the group.
    public func removedMembers() -> Set<String> {
        state.withLock { s in
            guard let group = s.group else { return [] }
            let view = s.view ?? MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true)
            return Set(view.selected.values.filter { $0.state == .removed }.map(\.node))
        }
    }

    /// The founder and the admins active now (empty without a group).
    public func activeAdmins() -> Set<String> {
        state.withLock { s in
            guard let group = s.group else { return [] }
            let view = s.view ?? MembershipView(group: group, entries: s.ledger.values.joined(), signaturesChecked: true)
            return view.activeAdmins
        }
    }
}
