import FerryCore
import FerryStore
import Foundation

/// Which group this node belongs to (DATA/group.json) and every signature-checked member
/// entry, address record and access entry it has seen (DATA/signed-entries.json): the
/// state the store's validator checks incoming entries against, made before the store so
/// that the store can be opened with it.
public final class MembershipLedger: Sendable {
    struct State {
        var group: String?
        /// Every signature-checked entry seen, by node (each signer's best): read from the store
        /// or DATA/signed-entries.json, or accepted by the validator.
        var ledger: [String: [MemberEntry]] = [:]
        var view: MembershipView?
        /// Dial URLs learned from a code (the inviter's reachable address), preferred over entries'.
        var urlOverrides: [String: String] = [:]
        /// Each node's newest signature-checked record of where it listens now.
        var addressRecords: [String: MemberAddresses] = [:]
        /// Access rules by name and role assignments by principal, each signer's best, of
        /// every entry accepted while its signer was an admin (MembershipLedger+Known).
        var rules: [String: [AccessRuleEntry]] = [:]
        var roles: [String: [RoleAssignment]] = [:]
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
        var s = State(group: group)
        try Self.loadKnown("\(dataDirectory)/\(Self.knownFileName)", into: &s)
        state = Locked(s)
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
