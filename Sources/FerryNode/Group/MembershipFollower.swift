import FerryCore
import FerryStore
import Logging
import ServiceLifecycle

/// Follows the store's changes and re-applies the membership whenever a member document
/// changes (a replicated entry, a removal), so trust follows within the same second.
struct MembershipFollower: Service {
    let membership: GroupMembership
    let store: DocumentStore

    func run() async throws {
        let since = try store.lastSequence
        try? membership.loadFromStore()
        do {
            for try await change in store.liveChanges(since: since, idPrefixes: [MemberEntry.documentPrefix, MemberAddresses.documentPrefix]).cancelOnGracefulShutdown()
            where change.id.rawValue.hasPrefix(MemberEntry.documentPrefix) || change.id.rawValue.hasPrefix(MemberAddresses.documentPrefix) {
                do {
                    if MemberAddresses.node(inDocument: change.id) != nil {
                        try membership.rereadAddresses([change.id])
                    } else {
                        try membership.reread([change.id])
                    }
                    membership.apply()
                } catch {
                    membership.logger.error("cannot read a member entry", metadata: ["id": "\(change.id)", "error": "\(error)"])
                }
            }
        } catch is CancellationError {}
    }
}
