import FerryCore
import FerryStore
import Logging
import ServiceLifecycle

/// Follows the store's changes and re-reads the group's access documents whenever one (or a
/// member entry, which may make or unmake an admin) changes. When the rules in force change
/// (from here or from a peer), this node purges what it may no longer read and its links
/// start again under the new policies, so what became readable moves at once, without
/// waiting for another write.
struct AccessFollower: Service {
    let access: GroupAccess
    let store: DocumentStore
    /// Re-evaluates every link's policy (the peer manager's `trustChanged`).
    let policiesChanged: @Sendable () -> Void
    let logger: Logger

    func run() async throws {
        let snapshots = access.snapshots()
        let since = try store.lastSequence
        try? access.load(from: store)
        access.recompute()
        // Rules already in force at start (a restart after they changed): purge once.
        purge()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await snapshot in snapshots.cancelOnGracefulShutdown() {
                    logger.info("access rules changed", metadata: ["version": "\(snapshot.version)", "rules": "\(snapshot.rules.count)"])
                    purge()
                    policiesChanged()
                }
            }
            group.addTask { await follow(since: since) }
            await group.next()
            group.cancelAll()
        }
    }

    func follow(since: UInt64) async {
        do {
            for try await change in store.liveChanges(since: since, idPrefixes: [GroupAccess.documentPrefix, MemberEntry.documentPrefix]).cancelOnGracefulShutdown()
            where change.id.rawValue.hasPrefix(GroupAccess.documentPrefix) || change.id.rawValue.hasPrefix(MemberEntry.documentPrefix) {
                if change.id.rawValue.hasPrefix(GroupAccess.documentPrefix) {
                    do { try access.reread([change.id], from: store) } catch {
                        logger.error("cannot read an access entry", metadata: ["id": "\(change.id)", "error": "\(error)"])
                    }
                }
                access.recompute()
            }
        } catch {}
    }

    func purge() {
        do { try access.purgeUnreadable(in: store, logger: logger) } catch {
            logger.error("cannot purge documents this node may no longer read", metadata: ["error": "\(error)"])
        }
    }
}
