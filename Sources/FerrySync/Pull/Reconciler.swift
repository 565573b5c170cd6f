import FerryCore

/// When a link compares digests with its peer and reconciles a difference (anti-entropy).
public struct AntiEntropy: Sendable, Equatable {
    /// Compare at all. Default true; it runs only on continuous replications with heartbeats
    /// whose both halves replicate every document (full links), or every document the same
    /// version of the group's rules grants (links under the rules, over what both may read).
    public var enabled = true
    /// How often the link looks. Default 1 s.
    public var checkInterval: Duration = .seconds(1)
    /// How long the same two different digests must stand, with the link idle, before a
    /// reconciliation. Default 3 s.
    public var settle: Duration = .seconds(3)
    /// After a reconciliation that did not end the difference, the next waits twice as long
    /// as the one before, up to this. Default 5 min.
    public var maxBackoff: Duration = .seconds(300)
    public init() {}
}

/// One link's anti-entropy: while the connection is up, compares this node's digest with
/// the one its peer last reported (over the whole stores on a full link, over what both may
/// read on a link under the group's rules); when the same two different digests stand for
/// `AntiEntropy.settle` with the link idle, it reconciles both ways from the start of each
/// feed (`Puller.sweep`, `Pusher.sweep`), ignoring checkpoints and coverage. A link
/// idle with differing digests is a bug in the shortcuts (coverage, relays, catch-up) or a
/// lost message; this is the fallback that does not depend on them.
struct Reconciler: Sendable {
    let context: ReplicationContext
    let connection: Connection
    let digests: MeshDigests
    let peerID: String
    let puller: Puller
    let pusher: Pusher

    var settings: AntiEntropy { context.configuration.wiring.antiEntropy }

    /// This node's digest and the peer's, over the same documents: the whole stores on a full
    /// link, the view both may read on a link under the group's rules; nil on any other link.
    func comparedDigests() -> (mine: String?, theirs: String?)? {
        if connection.isFullLink { return (digests.current(), digests.digest(of: peerID)) }
        guard let view = connection.comparedView else { return nil }
        return (digests.current(view: view), digests.digest(of: peerID, view: view))
    }

    /// Runs until cancelled (the connection's workers ended) or stopped.
    func run() async throws {
        let elapsed = Stopwatch.start(on: context.clock).elapsed
        var seen: (mine: String, theirs: String, since: Duration)?
        var backoff = settings.settle
        var notBefore = Duration.zero
        while !context.stopRequested {
            try await context.clock.sleep(for: settings.checkInterval)
            // Only once both loops went live and no link of this node is catching up: before
            // that a difference is the catch-up's to settle, and a sweep would duplicate it.
            let catchingUp = context.configuration.wiring.catchUpGate.map { $0.snapshot.holder != nil || $0.snapshot.waiting > 0 } ?? false
            guard let compared = comparedDigests(), puller.hasGoneLive, pusher.hasGoneLive, !catchingUp,
                context.progress.status.activity == .idle, let theirs = compared.theirs, let mine = compared.mine
            else {
                seen = nil
                continue
            }
            if mine == theirs {
                seen = nil
                backoff = settings.settle
                continue
            }
            let now = elapsed()
            guard let stood = seen, stood.mine == mine, stood.theirs == theirs else {
                seen = (mine, theirs, now)
                continue
            }
            guard now - stood.since >= settings.settle, now >= notBefore else { continue }
            context.configuration.wiring.metrics?.reconciliation()
            context.logger.warning(
                "link idle while the peer's digest differs; reconciling",
                metadata: ["peer": "\(LogText.escape(peerID))", "digest": "\(mine)", "peerDigest": "\(LogText.escape(theirs))"])
            // Under the rules the difference may be a copy this node may no longer hold: the
            // sweep asks about what it holds first, as a session's start does.
            let pulled = try await puller.sweep(checkingHeldAccess: connection.comparedView != nil)
            let pushed = try await pusher.sweep()
            context.logger.notice(
                "reconciled with the peer", metadata: ["peer": "\(LogText.escape(peerID))", "pulled": "\(pulled)", "pushed": "\(pushed)"])
            context.progress.markIdleIfCaughtUp()
            seen = nil
            notBefore = elapsed() + backoff
            backoff = min(backoff * 2, settings.maxBackoff)
        }
    }
}
