import Crypto
import FerryCore
import FerryStore

/// Which way a checkpoint's replication moves documents; part of its key.
package enum CheckpointDirection: String, Sendable {
    case pull, push
}

/// A sequence a checkpoint can record: the remote's (pull) or the local store's (push).
protocol CheckpointSequence: Sendable, Equatable {
    init?(checkpoint: JSON)
    var checkpointJSON: JSON { get }
    static var start: Self { get }
    /// Where to resume when the two copies differ; nil: start over.
    static func resume(local: Self, remote: Self) -> Self?
    /// Which replication keeps checkpoints of this kind of sequence.
    static var direction: CheckpointDirection { get }
    /// This position or `floor`, whichever is further (a floor only applies to numbered sequences).
    func raised(to floor: UInt64) -> Self
    /// The position as a number of a Ferry feed; nil for an opaque sequence.
    var number: UInt64? { get }
}

extension UInt64: CheckpointSequence {
    init?(checkpoint: JSON) {
        guard let n = checkpoint.intValue else { return nil }
        self = UInt64(Swift.max(0, n))
    }
    var checkpointJSON: JSON { .int(Int64(self)) }
    static var start: UInt64 { 0 }
    static func resume(local: UInt64, remote: UInt64) -> UInt64? { Swift.min(local, remote) }
    static var direction: CheckpointDirection { .push }
    func raised(to floor: UInt64) -> UInt64 { Swift.max(self, floor) }
    var number: UInt64? { self }
}

extension RemoteSequence: CheckpointSequence {
    init?(checkpoint: JSON) { self.init(checkpoint) }
    var checkpointJSON: JSON { json }
    /// Numbered sequences (Ferry's) resume from the lower; opaque ones only when both copies agree.
    static func resume(local: RemoteSequence, remote: RemoteSequence) -> RemoteSequence? {
        if local == remote { return local }
        guard let l = local.json.intValue, let r = remote.json.intValue else { return nil }
        return RemoteSequence(.int(Swift.min(l, r)))
    }
    static var direction: CheckpointDirection { .pull }
    func raised(to floor: UInt64) -> RemoteSequence {
        guard let n = number, n < floor else { return self }
        return RemoteSequence(floor)
    }
    var number: UInt64? { json.intValue.map { UInt64(Swift.max(0, $0)) } }
}

/// Keeps one direction's checkpoint: where to resume, and both copies (a local document
/// here, a local document on the other side), with the other side's copy deferred once a
/// continuous replication has caught up.
///
/// A pull whose intake is complete also raises this store's coverage of the remote
/// database (`Coverage`) whenever it writes both copies, and any checkpoint may start from
/// a floor above both copies: the coverage of the remote database (pull), or how far the
/// other side says it holds this one's feed (push, `holds`).
///
/// A checkpoint advances only past what is durably stored or deliberately rejected. Until
/// caught up, both copies are written after every batch; once caught up, changes come one
/// at a time and a checkpoint write each would cost more than the change, so the remote
/// copy (and, for push, the local one) waits up to `remoteCheckpointDelay`. A lagging copy
/// only makes a restart re-read change entries that are then skipped.
struct Checkpointer<Position: CheckpointSequence> {
    let key: String
    let store: DocumentStore
    let remote: any RemoteDatabase
    let delay: Duration
    let clock: any Clock<Duration>
    /// The remote database whose coverage saves raise (a pull with a complete intake); nil: none.
    var coverage: String?
    /// Pull: the relays the other side skipped, which coverage may not pass until held here.
    var hold = CoverageHold()
    /// Push: the relays this side skipped since the last remote write, reported with it.
    private var skipReport: [SkippedRelay] = []
    private var skipReportLost = false
    /// How far the replication has got (stored or deliberately skipped).
    private(set) var position = Position.start
    private(set) var localSaved = Position.start
    private(set) var remoteSaved = Position.start
    /// Time since the first batch the remote copy does not cover; nil when none.
    private var lag: Stopwatch?
    /// Positions the local copy held before its current one, newest first: the remote
    /// copy is written after the local one, so after a crash between the two it holds one
    /// of these, and an opaque sequence resumes from it instead of from the start.
    private var earlier: [JSON] = []
    static var earlierKept: Int { 8 }

    init(key: String, store: DocumentStore, remote: any RemoteDatabase, delay: Duration, clock: any Clock<Duration>) {
        self.key = key
        self.store = store
        self.remote = remote
        self.delay = delay
        self.clock = clock
    }

    /// The key: the hex SHA-256 of both database UUIDs, the direction, the filter's name and
    /// the sorted document IDs. Never an address: a peer that moves resumes where it was.
    static func key(
        localDatabase: String, remoteDatabase: String, direction: CheckpointDirection, filterName: String?,
        documentIDs: Set<DocumentID>?
    ) -> String {
        let ids = documentIDs.map { $0.map(\.rawValue).sorted().joined(separator: "\u{0}") } ?? ""
        var h = SHA256()
        h.update(data: Array("\(localDatabase)\u{0}\(remoteDatabase)\u{0}\(direction.rawValue)\u{0}\(filterName ?? "")\u{0}\(ids)".utf8))
        return Hex.encode(h.finalize())
    }

    static func localID(_ key: String) -> String { "checkpoint/\(key)" }

    /// The local copy, if any.
    static func local(_ store: DocumentStore, key: String) throws -> Position? {
        try store.localDocument(localID(key))?["seq"].flatMap(Position.init(checkpoint:))
    }

    /// Reads both copies and returns where to resume: from the start when either is
    /// missing, when `reset`, or when they disagree in a way the sequence cannot settle;
    /// then from `floor`, or the other side's `holds` (push), when further (not when `reset`).
    mutating func start(reset: Bool, floor: UInt64? = nil) async throws -> Position {
        var resume = Position.start
        var raised = resume
        if !reset {
            let localDoc = try store.localDocument(Self.localID(key))
            let local = localDoc?["seq"].flatMap(Position.init(checkpoint:))
            if case .array(let list)? = localDoc?["earlier"] { earlier = Array(list.prefix(Self.earlierKept)) }
            let answer = try await remote.checkpoint(key, direction: Position.direction)
            let remoteCopy = answer.value?["seq"].flatMap(Position.init(checkpoint:))
            if let local, let remoteCopy {
                if let settled = Position.resume(local: local, remote: remoteCopy) {
                    resume = settled
                } else if earlier.contains(remoteCopy.checkpointJSON) {
                    // The local copy got ahead of the remote one, which holds an earlier local position.
                    resume = remoteCopy
                }
            }
            // The other side's floor can only make this side send less to it: a side that
            // lies about what it holds only keeps documents from itself.
            let highest = Swift.max(floor ?? 0, Position.direction == .push ? answer.holds ?? 0 : 0)
            raised = resume.raised(to: highest)
        }
        position = raised
        // Both copies are behind a raised start, so the first batch (or the end) writes them.
        localSaved = resume
        remoteSaved = resume
        return raised
    }

    /// The remote copy lags behind the position.
    var remoteLags: Bool { remoteSaved != position }
    /// Time left before a deferred remote write is due; nil when none waits.
    var remaining: Duration? { lag.map { delay - $0.elapsed() } }
    /// A deferred remote write waits and its time has come.
    var isDue: Bool { remaining.map { $0 <= .zero } ?? false }

    /// Moves the position without writing either copy.
    mutating func advance(to sequence: Position) { position = sequence }

    /// Marks a batch past the remote copy: the deferred write is due `delay` after the first.
    mutating func deferRemote() { if lag == nil { lag = Stopwatch.start(on: clock) } }

    /// Writes the local copy at the position.
    mutating func saveLocal() throws {
        // Relaxed like the batch it covers: a power loss can only take both back together.
        if localSaved != position && localSaved != Position.start {
            earlier.insert(localSaved.checkpointJSON, at: 0)
            if earlier.count > Self.earlierKept { earlier.removeLast(earlier.count - Self.earlierKept) }
        }
        var body: [String: JSON] = ["seq": position.checkpointJSON]
        // Only opaque sequences need them: numbered ones resume from the lower copy.
        if position.number == nil && !earlier.isEmpty { body["earlier"] = .array(earlier) }
        try store.putLocalDocument(Self.localID(key), body: .object(body), durability: .normal)
        localSaved = position
    }

    /// Writes the local copy, then the remote one, at the position.
    mutating func saveBoth() async throws {
        try saveLocal()
        // A push tells the other side when it has reached the end of this side's feed: only
        // then does that side hold everything this one held when it said hello.
        let caughtUp = try Position.direction == .push && (position.number ?? 0) >= store.lastChangeSequence
        try await remote.putCheckpoint(
            key, value: ["seq": position.checkpointJSON], direction: Position.direction, caughtUp: caughtUp, skipped: skipReport,
            skipsLost: skipReportLost)
        skipReport = []
        skipReportLost = false
        remoteSaved = position
        lag = nil
        try raiseCoverage()
    }

    /// However a loop ends, the local copy covers what was stored (no network needed).
    mutating func saveLocalIfBehind() {
        if localSaved != position { try? saveLocal() }
        try? raiseCoverage()
    }

    /// Push: notes revisions left out as relays, for the next remote write to report.
    mutating func reportSkipped(_ skipped: [SkippedRelay]) {
        let room = SkippedRelay.maxReported - skipReport.count
        if skipped.count > room { skipReportLost = true }
        skipReport.append(contentsOf: skipped.prefix(max(0, room)))
    }

    /// Records the position as this store's coverage of the remote database, if it keeps one,
    /// held below any relay the other side skipped that this store does not hold yet.
    /// Only with both copies (or at the end): once live, every batch writes the local copy,
    /// and a coverage that lags a few seconds costs a restart no more than re-read entries.
    mutating func raiseCoverage() throws {
        guard let coverage, let n = position.number else { return }
        try Coverage.raise(coverage, to: try hold.coverable(through: n, store: store), in: store)
    }
}

/// A checkpoint copy as the other side answered it, with its floor for a push.
package struct RemoteCheckpoint: Sendable, Equatable {
    package var value: JSON?
    /// Push only: the sequence of this side's feed through which the other side says it
    /// holds everything; nil when it says nothing.
    package var holds: UInt64?

    package init(value: JSON?, holds: UInt64? = nil) {
        self.value = value
        self.holds = holds
    }
}

extension RemoteDatabase {
    /// A remote without directions or floors: its local document, no floor.
    package func checkpoint(_ id: String, direction: CheckpointDirection) async throws -> RemoteCheckpoint {
        RemoteCheckpoint(value: try await localDocument(id), holds: nil)
    }

    package func putCheckpoint(_ id: String, value: JSON, direction: CheckpointDirection, caughtUp: Bool) async throws {
        try await putLocalDocument(id, value: value)
    }
}
