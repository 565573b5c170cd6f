import FerryCore
import FerryStore
import Logging

/// Runs the configured resolvers on the documents an insert left with more than one
/// leaf, after the insert and before the checkpoint, and counts what they found and wrote.
struct ConflictResolutionStep: Sendable {
    let store: DocumentStore
    let resolvers: ResolverSet
    let progress: ReplicationProgress
    let logger: Logger

    func run(on ids: Set<DocumentID>) throws {
        let (conflicts, written) = try store.resolveConflicts(in: ids, using: resolvers, logger: logger)
        progress.count {
            $0.conflicts += conflicts
            $0.resolved += written
        }
    }
}
