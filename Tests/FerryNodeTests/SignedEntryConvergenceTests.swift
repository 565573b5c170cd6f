import FerryCore
import FerryStore
import FerryTransport
import Foundation
import Logging
import Testing

@testable import FerryNode

/// Seeded property tests over the group's signed entries (member entries, address records,
/// access rules and role assignments): a history of valid entries by several admins is
/// delivered to several nodes, each a different subset in a different order, with replays
/// of old entries as children of the current revision, as conflict branches and as new
/// roots, and tombstones, sometimes across a restart. Every node must end in the state the
/// highest versions of the entries it received define, whatever its revision trees say.
///
/// Each run draws a fresh base seed; `FERRY_ENTRY_SEED=S` replays one seed,
/// `FERRY_ENTRY_SEEDS=N` runs N seeds (default 24).
@Suite(.timeLimit(.minutes(entryConvergenceMinutes))) struct SignedEntryConvergenceTests {
    @Test func everyNodeEndsInTheStateTheHighestVersionsItReceivedDefine() throws {
        let env = ProcessInfo.processInfo.environment
        let seeds: [UInt64]
        if let one = env["FERRY_ENTRY_SEED"].flatMap(UInt64.init) {
            seeds = [one]
        } else {
            let base = UInt64.random(in: 1...(UInt64.max / 2))
            seeds = (0..<UInt64(env["FERRY_ENTRY_SEEDS"].flatMap(Int.init) ?? 24)).map { base + $0 }
        }
        let cast = try EntryCast.shared()
        for seed in seeds {
            var history = EntryHistoryRun(seed: seed, cast: cast)
            do { try history.run() } catch {
                Issue.record("signed-entry seed \(seed) failed: \(error)\nreplay: FERRY_ENTRY_SEED=\(seed) swift test --filter SignedEntryConvergenceTests")
                return
            }
        }
    }
}

/// The time limit: 2 minutes, or about a second a seed when more are asked for.
let entryConvergenceMinutes = max(2, (ProcessInfo.processInfo.environment["FERRY_ENTRY_SEEDS"].flatMap(Int.init) ?? 0) / 60)

/// The identities of one group, made once: the founder, two more admins, three members.
struct EntryCast: @unchecked Sendable {
    let founder: NodeIdentity
    let admins: [NodeIdentity]
    let members: [NodeIdentity]
    var signers: [NodeIdentity] { [founder] + admins }
    var group: String { founder.nodeID }

    private static let made = Result { try EntryCast() }
    static func shared() throws -> EntryCast { try made.get() }

    private init() throws {
        founder = try MembershipFixture.identity()
        admins = try (0..<2).map { _ in try MembershipFixture.identity() }
        members = try (0..<3).map { _ in try MembershipFixture.identity() }
    }
}

/// A failed property: what differed, on which node.
struct ConvergenceFailure: Error, CustomStringConvertible {
    let description: String
}

/// One signed entry of the history, as the document and body it travels in.
struct HistoryEntry {
    enum Kind { case member(MemberEntry), address(MemberAddresses), rule(AccessRuleEntry), roles(RoleAssignment) }
    let kind: Kind
    var id: DocumentID {
        switch kind {
        case .member(let e): MemberEntry.documentID(e.node)
        case .address(let r): MemberAddresses.documentID(r.node)
        case .rule(let r): AccessRuleEntry.documentID(r.name)
        case .roles(let a): RoleAssignment.documentID(a.principal)
        }
    }
    var body: JSON {
        switch kind {
        case .member(let e): e.body
        case .address(let r): r.body
        case .rule(let r): r.body
        case .roles(let a): a.body
        }
    }
}

/// A node under test: its data directory, ledger, store (aggressive body pruning, so an old
/// body pushed on top soon leaves the newer one only in what the node remembers) and access.
final class EntryNode {
    let directory: String
    let identity: NodeIdentity
    /// The ledger the store's validator asks; a restart swaps in a new one read from disk.
    let current: Locked<MembershipLedger>
    let store: DocumentStore
    var access: GroupAccess

    init(group: String, identity: NodeIdentity) throws {
        directory = try Replay.forgetfulDirectory(group: group)
        self.identity = identity
        let ledger = try MembershipLedger(dataDirectory: directory)
        current = Locked(ledger)
        access = GroupAccess(ledger: ledger, nodeID: identity.nodeID)
        var options = StoreOptions()
        options.retainedAncestorBodies = 0
        options.durability = .normal
        let box = current
        options.validator = Validator { proposed in box.withLock { $0 }.validate(proposed) }
        store = try DocumentStore.open(directory: directory, options: options)
    }

    var ledger: MembershipLedger { current.withLock { $0 } }

    /// Forgets everything held in memory and reads it back as a starting node does
    /// (`FerryNode.init`: the membership from the store, then the access documents).
    func restart() throws {
        let ledger = try MembershipLedger(dataDirectory: directory)
        current.withLock { $0 = ledger }
        try Replay.loadMembers(store, into: ledger, identity: identity)
        access = GroupAccess(ledger: ledger, nodeID: identity.nodeID)
        try access.load(from: store)
    }

    /// Inserts `body` (or a tombstone) as a new revision of `id`: a child of the current
    /// revision, a branch off a random revision of the tree, or a new root.
    func deliver(_ id: DocumentID, body: JSON, shape: Int, deleted: Bool = false, rng: inout SeededGenerator) throws {
        let tree = try store.revisionTree(id)
        var parent: RevisionID?
        if let tree, let w = tree.winnerIndex {
            switch shape {
            case 0, 1, 2: parent = tree.revisions[w].id
            case 3: parent = tree.revisions.randomElement(using: &rng)?.id
            default: parent = nil
            }
        }
        // A sibling of a deleted leaf may be extended; a deleted parent only by the store's rules.
        let canonical = (deleted ? JSON.object([:]) : body).canonicalBytes
        var rev = RevisionID.compute(parent: parent, deleted: deleted, canonicalBody: canonical)
        var history = parent.flatMap { p in tree?.history(of: p) } ?? []
        // A new root needs a generation-1 ID the tree does not hold; salt it through its body.
        if let tree, tree.contains(rev) {
            guard !deleted else { return }
            parent = nil
            history = []
            rev = RevisionID.compute(parent: nil, deleted: false, canonicalBody: canonical)
            if tree.contains(rev) { return }
        }
        guard let incoming = IncomingRevision.verified(
            id: id, revision: rev, history: history, deleted: deleted, body: deleted ? .object([:]) : body,
            hlc: HLCTimestamp(rawValue: 0), canonicalBody: canonical)
        else { throw ConvergenceFailure(description: "could not build a revision of \(id)") }
        _ = try store.insertRevisions([incoming])
    }
}

/// One seeded run: a history, three nodes, deliveries, and the check.
struct EntryHistoryRun {
    let seed: UInt64
    let cast: EntryCast
    var rng: SeededGenerator

    init(seed: UInt64, cast: EntryCast) {
        self.seed = seed
        self.cast = cast
        rng = SeededGenerator(seed: seed)
    }

    /// The founder and both admins: fixed before anything else, so who signs with authority
    /// never changes while the history is delivered.
    func bootstrap() throws -> [HistoryEntry] {
        var out = [HistoryEntry(kind: .member(try MemberEntry.signed(
            group: cast.group, node: cast.group, name: "founder", state: .member, admin: true, version: 1, addresses: [], by: cast.founder)))]
        for a in cast.admins {
            out.append(HistoryEntry(kind: .member(try MemberEntry.signed(
                group: cast.group, node: a.nodeID, name: nil, state: .member, admin: true, version: 1, addresses: [], by: cast.founder))))
        }
        return out
    }

    /// Valid signed entries by random admins: versions rise by 0 or 1 per name (equal
    /// versions by different admins are concurrent writes), with removals and withdrawals.
    mutating func history(count: Int) throws -> [HistoryEntry] {
        var versions: [String: Int64] = [:]
        var out: [HistoryEntry] = []
        let principals = cast.members.map(\.nodeID) + ["user:nurse"]
        let roleNames = ["ward-a", "ward-b", "supervisor"]
        for _ in 0..<count {
            let signer = cast.signers.randomElement(using: &rng)!
            switch Int.random(in: 0..<4, using: &rng) {
            case 0:
                let node = cast.members.randomElement(using: &rng)!.nodeID
                let v = bump(&versions, "m" + node)
                let state: MemberEntry.State = Bool.random(using: &rng) ? .member : .removed
                out.append(HistoryEntry(kind: .member(try MemberEntry.signed(
                    group: cast.group, node: node, name: nil, state: state, admin: false, version: v, addresses: [], by: signer))))
            case 1:
                let who = cast.signers.randomElement(using: &rng)!
                let v = bump(&versions, "a" + who.nodeID)
                out.append(HistoryEntry(kind: .address(try MemberAddresses.signed(
                    group: cast.group, addresses: ["10.0.0.\(Int.random(in: 1...200, using: &rng)):4985"], version: v, by: who))))
            case 2:
                let name = ["r1", "r2"].randomElement(using: &rng)!
                let v = bump(&versions, "r" + name)
                let roles = Array(roleNames.shuffled(using: &rng).prefix(Int.random(in: 1...2, using: &rng)))
                let read = Bool.random(using: &rng) ? AccessMatch() : AccessMatch(selector: ["ward": .string(String(Int.random(in: 0...3, using: &rng)))])
                out.append(HistoryEntry(kind: .rule(try AccessRuleEntry.signed(
                    group: cast.group, name: name, roles: roles, read: read, write: nil, delete: false,
                    state: Int.random(in: 0..<3, using: &rng) == 0 ? .removed : .active, version: v, by: signer))))
            default:
                let p = principals.randomElement(using: &rng)!
                let v = bump(&versions, "p" + p)
                let roles = Array(roleNames.shuffled(using: &rng).prefix(Int.random(in: 0...2, using: &rng)))
                out.append(HistoryEntry(kind: .roles(try RoleAssignment.signed(group: cast.group, principal: p, roles: roles, version: v, by: signer))))
            }
        }
        return out
    }

    mutating func bump(_ versions: inout [String: Int64], _ key: String) -> Int64 {
        let v = (versions[key] ?? 0) + (versions[key] == nil ? 1 : Int64.random(in: 0...1, using: &rng))
        versions[key] = v
        return v
    }

    mutating func run() throws {
        let boot = try bootstrap()
        let entries = try history(count: 36)
        for n in 0..<3 {
            let node = try EntryNode(group: cast.group, identity: cast.members[n])
            for e in boot { try node.deliver(e.id, body: e.body, shape: 0, rng: &rng) }
            // A subset, in a random order, with replays of what was already delivered.
            var received: [HistoryEntry] = []
            var plan = entries.filter { _ in Int.random(in: 0..<5, using: &rng) != 0 }.shuffled(using: &rng)
            // Mostly in history order, as replication brings them, but not always.
            if Bool.random(using: &rng) { plan = entries.filter { e in plan.contains { $0.body == e.body } } }
            for e in plan {
                try node.deliver(e.id, body: e.body, shape: Int.random(in: 0..<5, using: &rng), rng: &rng)
                received.append(e)
                let r = Int.random(in: 0..<10, using: &rng)
                if r < 3, let old = received.randomElement(using: &rng) {
                    try node.deliver(old.id, body: old.body, shape: Int.random(in: 0..<5, using: &rng), rng: &rng)
                } else if r == 3 {
                    try node.deliver(e.id, body: e.body, shape: 0, deleted: true, rng: &rng)
                } else if r == 4 {
                    try node.restart()
                }
            }
            // Replays of old bodies on top, enough to push the newer bodies out of the tree.
            for _ in 0..<6 {
                if let old = received.randomElement(using: &rng) { try node.deliver(old.id, body: old.body, shape: 0, rng: &rng) }
            }
            try check(node, received: boot + received, when: "after delivery")
            try node.restart()
            try check(node, received: boot + received, when: "after a restart")
        }
    }

    /// The node's ledger and access snapshot against what the received entries define,
    /// computed here from the entries alone (protocol.md §9): the view of the member entries,
    /// each node's highest address record, and for each rule and principal the highest entry.
    func check(_ node: EntryNode, received: [HistoryEntry], when: String) throws {
        let ledger = node.ledger
        var members: [MemberEntry] = []
        var addresses: [String: MemberAddresses] = [:]
        var rules: [String: AccessRuleEntry] = [:]
        var roles: [String: RoleAssignment] = [:]
        // Highest version; at equal versions the removal (or withdrawal), then the greater signature.
        func above(_ v: Int64, _ removal: Bool, _ sig: [UInt8], _ w: Int64, _ wRemoval: Bool, _ wSig: [UInt8]) -> Bool {
            if v != w { return v > w }
            if removal != wRemoval { return removal }
            return sig != wSig && !sig.lexicographicallyPrecedes(wSig)
        }
        for e in received {
            switch e.kind {
            case .member(let m): members.append(m)
            case .address(let r):
                if let o = addresses[r.node], !above(r.version, false, r.signature, o.version, false, o.signature) { continue }
                addresses[r.node] = r
            case .rule(let r):
                if let o = rules[r.name], !above(r.version, r.state == .removed, r.signature, o.version, o.state == .removed, o.signature) { continue }
                rules[r.name] = r
            case .roles(let a):
                if let o = roles[a.principal], !above(a.version, a.roles.isEmpty, a.signature, o.version, o.roles.isEmpty, o.signature) { continue }
                roles[a.principal] = a
            }
        }
        let expectedView = MembershipView(group: cast.group, entries: members)
        let (actualView, actualAddresses) = ledger.state.withLock { s in
            (MembershipView(group: cast.group, entries: s.ledger.values.joined(), signaturesChecked: true), s.addressRecords)
        }
        guard actualView.selected == expectedView.selected else {
            throw ConvergenceFailure(description: "\(when): members differ on \(node.identity.nodeID.prefix(8)): \(summary(actualView)) != \(summary(expectedView))")
        }
        guard actualAddresses == addresses else {
            throw ConvergenceFailure(description: "\(when): address records differ: \(actualAddresses.mapValues(\.version)) != \(addresses.mapValues(\.version))")
        }
        // Every signer is an admin throughout; a removed member keeps no role.
        let removed = Set(expectedView.selected.values.filter { $0.state == .removed }.map(\.node))
        var expected = AccessSnapshot()
        for (name, r) in rules where r.state == .active { expected.rules[name] = r }
        for (p, a) in roles where !a.roles.isEmpty && !removed.contains(p) { expected.roles[p] = a.roles }
        node.access.recompute()
        guard node.access.snapshot == expected else {
            throw ConvergenceFailure(description: "\(when): access differs: \(describe(node.access.snapshot)) != \(describe(expected))")
        }
    }

    func summary(_ v: MembershipView) -> String {
        v.selected.sorted { $0.key < $1.key }.map { k, e in
            "\(k.prefix(6)):v\(e.version)\(e.state == .removed ? "x" : "")/\(e.signer.prefix(4))\(Hex.encode(e.signature.suffix(2)))"
        }.joined(separator: " ")
    }

    func describe(_ s: AccessSnapshot) -> String {
        let rules = s.rules.sorted { $0.key < $1.key }.map { "\($0.key)@v\($0.value.version)" }
        let roles = s.roles.sorted { $0.key < $1.key }.map { "\($0.key.prefix(8))=\($0.value)" }
        return "rules \(rules) roles \(roles)"
    }
}

/// Replays as a member would push them: a body as a new revision of a document held here.
enum Replay {
    /// Where a pushed revision goes: a child of the current revision, a new root, or a conflict
    /// branch off the oldest revision held.
    enum Shape { case child, root, branch }

    /// Inserts `body` (or a bare tombstone) as a new revision of `id`, as replication would.
    static func push(_ body: JSON, to id: DocumentID, in store: DocumentStore, deleted: Bool = false, as shape: Shape = .child) throws
        -> InsertOutcome
    {
        let tree = try store.revisionTree(id)
        let parent: RevisionID? =
            switch shape {
            case .child: tree.flatMap { t in t.winnerIndex.map { t.revisions[$0].id } }
            case .root: nil
            case .branch: tree?.revisions.min { $0.id.generation < $1.id.generation }?.id
            }
        let sent = deleted ? JSON.object([:]) : body
        let canonical = sent.canonicalBytes
        let rev = RevisionID.compute(parent: parent, deleted: deleted, canonicalBody: canonical)
        let history = parent.flatMap { p in tree?.history(of: p) } ?? []
        let incoming = try #require(IncomingRevision.verified(
            id: id, revision: rev, history: history, deleted: deleted, body: sent, hlc: HLCTimestamp(rawValue: 0), canonicalBody: canonical))
        return try store.insertRevisions([incoming])[0]
    }

    /// A store that checks nothing and keeps no ancestor bodies: a tree as a replay that slipped
    /// in would leave it, once the newer body is pruned.
    static func bareStore() throws -> DocumentStore {
        var options = StoreOptions()
        options.retainedAncestorBodies = 0
        options.durability = .normal
        return try DocumentStore.open(directory: MembershipFixture.tempDir(), options: options)
    }

    /// A data directory of the same group holding only group.json: a node that remembers nothing.
    static func forgetfulDirectory(group: String) throws -> String {
        let dir = MembershipFixture.tempDir()
        try Data(JSON.object(["group": .string(group)]).canonicalBytes).write(to: URL(fileURLWithPath: dir + "/group.json"))
        return dir
    }

    /// Reads the member entries and address records of `store` into `ledger` as a starting
    /// node does (`GroupMembership.loadFromStore`).
    static func loadMembers(_ store: DocumentStore, into ledger: MembershipLedger, identity: NodeIdentity? = nil) throws {
        let me = try identity ?? MembershipFixture.identity()
        let access = GroupAccess(ledger: ledger, nodeID: me.nodeID)
        let membership = GroupMembership(
            ledger: ledger,
            context: .init(
                store: store, identity: me, trust: try TrustStore(dataDirectory: MembershipFixture.tempDir(), configuration: NodeConfiguration(), access: access),
                databaseName: "ferry", name: "restarted", insecure: false, listenAddresses: { [] }),
            logger: Logger(label: "test"))
        try membership.loadFromStore()
    }

    static func rejected(_ outcome: InsertOutcome) -> String? {
        if case .rejected(let e) = outcome { return e.description }
        return nil
    }
}
