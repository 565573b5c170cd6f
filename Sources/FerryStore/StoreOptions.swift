import FerryCore
import Foundation
import Logging

/// How a store behaves; every field has a documented default.
public struct StoreOptions: Sendable {
    /// How many generations of history each branch keeps (CouchDB's revs_limit). Default 100.
    public var maxRevisionDepth: Int = 100
    /// Non-leaf revisions keep their bodies this many generations above a leaf, for deltas
    /// and three-way merges. Default 2.
    public var retainedAncestorBodies: Int = 2
    /// The largest canonical body accepted, in bytes. Default 8 MiB.
    public var maxBodyBytes: Int = 8 << 20
    /// The most leaves (conflicting branches, live or deleted) a document may hold; a
    /// replicated revision that would add one more is rejected (`tooManyLeaves`). Every write
    /// to a document rewrites its whole tree, so this bounds what one write costs and how
    /// large one row grows. Default 20,000.
    public var maxLeavesPerDocument: Int = 20_000
    /// `.full` fsyncs every commit (survives power loss); `.normal` survives process
    /// crashes only. Default `.full`.
    public var durability: Durability = .full
    /// Called on every local and replicated write, inside the write transaction.
    public var validator: Validator?
    /// Wall-clock milliseconds since the Unix epoch, for hybrid logical clock timestamps.
    public var wallClock: @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1000) }
    public var logger: Logger = Logger(label: "ferry.store")

    public init() {}

    /// How hard each commit is made durable.
    public enum Durability: String, Sendable {
        case full, normal
    }
}

/// A revision about to be written, as a validator sees it.
public struct ProposedRevision: Sendable {
    /// Where a revision comes from.
    public enum Origin: Sendable, Equatable {
        case local
        case replicated
    }
    public let id: DocumentID
    public let revision: RevisionID
    public let deleted: Bool
    public let body: JSON
    public let origin: Origin
}

/// Decides whether a proposed revision may be stored; return a reason to reject it.
public struct Validator: Sendable {
    public let check: @Sendable (ProposedRevision) -> String?
    public init(_ check: @escaping @Sendable (ProposedRevision) -> String?) { self.check = check }
}
