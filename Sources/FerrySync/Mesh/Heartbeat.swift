import FerryCore
import Logging

/// How a connection notices a silent peer: it sends a heartbeat whenever it sent nothing
/// for `interval`, and closes when it received nothing at all for `deadAfter`.
///
/// Used only when both hellos list the `heartbeat` feature. Any message counts as life, so
/// a busy connection sends no heartbeats; an idle one sends one per `interval` each way.
public struct Liveness: Sendable, Equatable {
    /// Send a heartbeat when nothing was sent for this long. Default 1 s.
    public var interval: Duration = .seconds(1)
    /// Declare the peer dead and close when nothing was received for this long. Default 4 s.
    public var deadAfter: Duration = .seconds(4)
    /// Offer the `heartbeat` feature in hello. Default true; false behaves as a peer that
    /// predates heartbeats (no watchdog on either side).
    public var enabled = true
    public init() {}
}

extension SyncError {
    /// The peer sent nothing at all for `seconds`: its process is stopped, or the network
    /// between us dropped without a close. Transient: it may come back.
    public static func peerSilent(_ seconds: Double) -> SyncError {
        SyncError(
            .peerSilent, message: "the peer sent nothing for \(Self.formatSeconds(seconds)) s; link closed",
            isTransient: true)
    }

    static func formatSeconds(_ s: Double) -> String {
        let tenths = (s * 10).rounded() / 10
        return "\(tenths)"
    }
}

/// One connection's heartbeat settings, decided once hello showed both sides offer the feature.
struct LivenessPlan: Sendable {
    var settings: Liveness
    var clock: any Clock<Duration>
    /// Carries the peer's ID in its metadata; the one "went silent" line goes here.
    var logger: Logger
    /// The peer's node ID (proven or claimed in hello).
    var peerID: String
    /// Where the peer's reported links go and this node's own links come from; nil: none sent.
    var mesh: MeshRelay?
    /// Whether this side's half of the connection replicates every document both ways.
    var localFull: Bool
    /// The version of the group's access rules this node judges the peer by; nil: no rules.
    var rules: String? = nil
    /// Whether this side's half replicates, both ways, every document those rules grant the
    /// peer, nothing narrowed by hand (`PeerPolicy.followsGroupRules`).
    var localGrant = false
    /// Where this node's digest comes from and the peer's goes; nil: none sent or kept.
    var digests: MeshDigests? = nil
    /// On a half under the group's rules (`localGrant`) that does not replicate everything
    /// both ways, what both ends may read (the peer's read grant and this node's own): the
    /// documents the two must agree on, which `view` digests cover. Nil otherwise.
    var view: AccessRule? = nil

    /// The view of a half under the group's rules: `peerRead` (what this node lets the peer
    /// read) with `ownRead` (what this node's roles let it hold); nil when the half does not
    /// follow the rules, or the two admit everything (a full link's digests cover that).
    static func view(localGrant: Bool, peerRead: AccessRule, ownRead: AccessRule) -> AccessRule? {
        guard localGrant, let both = peerRead.intersection(ownRead), !both.admitsEverything else { return nil }
        return both
    }
}

/// What a heartbeat says of one of this side's digests (the whole store's or the view's): the
/// digest when it changed since the connection last carried it, and again every
/// `ReplicatorTuning.digestRepeat` heartbeats (one that arrived before the peer armed its watchdog was
/// dropped); once, that the last one sent no longer holds (the store changed since and no new
/// one is computed: the peer must not compare against a stale digest); or nothing.
enum DigestCarriage: Equatable {
    case send(String)
    case forget
    case nothing

    static func next(_ digest: String?, sent: inout String?, since: inout Int, mayForget: Bool) -> DigestCarriage {
        since += 1
        if let digest, digest != sent || since >= ReplicatorTuning.digestRepeat {
            sent = digest
            since = 0
            return .send(digest)
        }
        if digest == nil, sent != nil, mayForget {
            sent = nil
            return .forget
        }
        return .nothing
    }
}

/// A connection's heartbeat state, behind the connection's mutex.
struct LivenessState {
    let plan: LivenessPlan
    var running = false
    var elapsed: (@Sendable () -> Duration)?
    var lastSent: Duration = .zero
    var lastReceived: Duration = .zero
    var task: Task<Void, Never>?
    /// The links in the last heartbeat that carried them; nil before the first.
    var linksSent: [String]?
    /// The number of the last momentary withdrawal (`MeshView.withdrawMomentarily`) sent.
    var withdrawalsSent = 0
    /// This connection counts as a link in the mesh view (`countsAsLink`).
    var registeredLink = false
    var watchToken: Int?
    var ended = false
    /// The number of the last heartbeat whose links were applied: heartbeats are sent from
    /// separate tasks, so an older one may arrive after a newer one and must not undo it.
    var linksApplied: UInt64 = 0
    /// The peer said its half replicates everything (kept with or without a mesh view).
    var peerFull = false
    /// The peer said its half replicates what its rules of this version grant; nil: it did not.
    var peerGrant: String?
    /// The digest in the last heartbeat that carried one.
    var digestSent: String?
    /// Heartbeats sent since the last that carried the digest.
    var sinceDigest = 0
    /// As `digestSent` and `sinceDigest`, for the view digest.
    var viewSent: String?
    var sinceView = 0
}

extension LivenessState {
    /// Whether this connection counts as a link for relay suppression: both halves replicate
    /// everything, or both replicate what the same version of the group's rules grants (every
    /// node holding that version then sends the peer what this node would).
    var countsAsLink: Bool {
        (peerFull && plan.localFull) || (plan.localGrant && plan.rules != nil && peerGrant == plan.rules)
    }
}

extension HeartbeatMessage {
    /// Says what this side's half of the connection replicates.
    mutating func statesHalf(of plan: LivenessPlan) {
        full = plan.localFull
        rules = plan.rules
        grant = plan.localGrant && plan.rules != nil
    }
}

extension Connection {
    /// Arms heartbeats, to start once the reply being prepared (hello's) is sent. Heartbeats
    /// that arrive before then are already read.
    func armLiveness(_ plan: LivenessPlan) {
        let (armed, early) = state.withLock { s -> (Bool, Message?) in
            guard s.liveness == nil && s.closedWith == nil else { return (false, nil) }
            s.liveness = LivenessState(plan: plan)
            defer { s.earlyHeartbeat = nil }
            return (true, s.earlyHeartbeat)
        }
        guard armed else { return }
        plan.mesh?.view.connectionOpened(plan.peerID)
        // Applied in number order with any later one (`linksApplied`).
        // Unowned: applies one heartbeat that came before liveness started; short.
        if let early { Task { await self.receivedHeartbeat(early) } }
    }

    /// Starts heartbeats and the silence watchdog now.
    func startLiveness(_ plan: LivenessPlan) {
        armLiveness(plan)
        beginArmedLiveness()
    }

    /// Starts armed heartbeats (after the reply that armed them went out); does nothing otherwise.
    func beginArmedLiveness() {
        let plan = state.withLock { s -> LivenessPlan? in
            guard var l = s.liveness, !l.running, !l.ended, s.closedWith == nil else { return nil }
            let elapsed = Stopwatch.start(on: l.plan.clock).elapsed
            l.running = true
            l.elapsed = elapsed
            l.lastSent = .zero
            l.lastReceived = .zero
            s.liveness = l
            return l.plan
        }
        guard let plan else { return }
        let token = plan.mesh?.view.watchLocalLinks { [weak self] in self?.sendHeartbeat(onlyIfLinksChanged: true) }
        let task = Task { [weak self] () -> Void in await self?.watch() }
        let late = state.withLock { s -> Bool in
            guard s.liveness?.ended == false else { return true }
            s.liveness?.task = task
            s.liveness?.watchToken = token
            return false
        }
        if late {
            task.cancel()
            if let token { plan.mesh?.view.unwatch(token) }
            return
        }
        // The first heartbeat goes at once: it carries this side's links and half of the link's fullness.
        sendHeartbeat(onlyIfLinksChanged: false)
    }

    /// Records traffic for the watchdog (a clock read per message, only while heartbeats run).
    func noteTraffic(sent: Bool) {
        state.withLock { s in
            guard var l = s.liveness, l.running, let elapsed = l.elapsed else { return }
            if sent { l.lastSent = elapsed() } else { l.lastReceived = elapsed() }
            s.liveness = l
        }
    }

    /// Whether heartbeats run on this connection (both sides offered them).
    public var heartbeatsRunning: Bool { state.withLock { $0.liveness?.running == true && $0.closedWith == nil } }

    /// The view both halves of this connection compare digests over: both follow the same
    /// version of the group's rules (`countsAsLink` by grant), and this half is not full and
    /// restricted; nil otherwise.
    var comparedView: AccessRule? {
        state.withLock { s in
            guard let l = s.liveness, l.running, !l.ended, s.closedWith == nil, let view = l.plan.view, l.plan.localGrant,
                let rules = l.plan.rules, l.peerGrant == rules
            else { return nil }
            return view
        }
    }

    /// Whether both halves of this connection replicate every document both ways, as the
    /// heartbeats said: only then must the two nodes hold the same documents (digests and
    /// anti-entropy; a link complete under the group's rules is not enough for that).
    var isFullLink: Bool {
        state.withLock { s in
            guard let l = s.liveness, l.running, !l.ended, s.closedWith == nil else { return false }
            return l.plan.localFull && l.peerFull
        }
    }

    /// Reads a received heartbeat: its links go into the mesh view. A malformed one closes the connection.
    func receivedHeartbeat(_ message: Message) async {
        let decoded: HeartbeatMessage
        do { decoded = try HeartbeatMessage(body: message.body) } catch {
            await close(error: error)
            return
        }
        // Before this side armed its own heartbeats: kept for then (the latest only).
        let early = state.withLock { s -> Bool in
            guard s.liveness == nil, s.closedWith == nil else { return false }
            if message.number > (s.earlyHeartbeat?.number ?? 0) { s.earlyHeartbeat = message }
            return true
        }
        if early { return }
        if decoded.digest != nil || decoded.digestUnknown || decoded.view != nil || decoded.viewUnknown,
            let plan = state.withLock({ $0.liveness?.plan })
        {
            // A link under the rules compares views (a whole store's digest there means
            // nothing: the two hold different documents); any other compares whole stores.
            if let view = plan.view {
                if decoded.view != nil || decoded.viewUnknown { plan.digests?.peerReported(plan.peerID, digest: decoded.view, view: view) }
            } else if decoded.digest != nil || decoded.digestUnknown {
                plan.digests?.peerReported(plan.peerID, digest: decoded.digest)
            }
        }
        guard decoded.links != nil || decoded.full != nil else { return }
        // Applied in number order under the lock (the mesh view takes its own lock inside).
        let change = state.withLock { s -> (plan: LivenessPlan, register: Bool?)? in
            guard var l = s.liveness, !l.ended, message.number > l.linksApplied else { return nil }
            l.linksApplied = message.number
            if let full = decoded.full {
                l.peerFull = full
                l.peerGrant = decoded.grant ? decoded.rules : nil
            }
            guard let mesh = l.plan.mesh else {
                s.liveness = l
                return nil
            }
            if let links = decoded.links { mesh.peerReported(l.plan.peerID, links: Set(links), rules: decoded.rules) }
            guard decoded.full != nil else {
                s.liveness = l
                return (l.plan, nil)
            }
            let want = l.countsAsLink
            let register: Bool? = want != l.registeredLink ? want : nil
            l.registeredLink = want
            s.liveness = l
            return (l.plan, register)
        }
        guard let change, let mesh = change.plan.mesh else { return }
        switch change.register {
        case true?: mesh.view.linkUp(change.plan.peerID)
        case false?: mesh.view.linkDown(change.plan.peerID)
        case nil: break
        }
    }

    /// Sends a heartbeat without waiting for it to go out (a send blocked by a stalled peer must
    /// not hold up the watchdog). It lists this node's links when they changed since the last.
    func sendHeartbeat(onlyIfLinksChanged: Bool) {
        // Read outside the lock: it may read the store. A half that is full sends the whole
        // store's digest; one under the rules, its view's (never the whole store's: the peer
        // may not read all of it).
        let plan = onlyIfLinksChanged ? nil : state.withLock { $0.liveness?.plan }
        let digest = plan.flatMap { $0.localFull && $0.view == nil ? $0.digests?.current() : nil }
        let view = plan.flatMap { p in p.view.flatMap { p.digests?.current(view: $0) } }
        var withdrawal: Message?
        let message = state.withLock { s -> Message? in
            guard var l = s.liveness, l.running, !l.ended, s.closedWith == nil else { return nil }
            var body = HeartbeatMessage()
            if let mesh = l.plan.mesh {
                let links = mesh.view.localLinks.sorted()
                // A momentary withdrawal goes first, in a heartbeat of its own; this one then
                // lists the links again.
                let (withdrawn, newest) = mesh.view.withdrawals(after: l.withdrawalsSent)
                l.withdrawalsSent = newest
                if l.linksSent != nil, links.contains(where: withdrawn.contains) {
                    var drop = HeartbeatMessage()
                    drop.links = links.filter { !withdrawn.contains($0) }
                    drop.statesHalf(of: l.plan)
                    l.linksSent = drop.links
                    withdrawal = Message(
                        kind: .request, number: s.nextNumber, flags: Message.flagNoReply,
                        properties: [("Profile", SyncProtocol.Profile.heartbeat)], body: drop.bytes)
                    s.nextNumber += 1
                }
                if links != l.linksSent {
                    body.links = links
                    body.statesHalf(of: l.plan)
                    l.linksSent = links
                }
            } else if l.linksSent == nil {
                // No mesh view: the first heartbeat still says whether this half is full.
                body.statesHalf(of: l.plan)
                l.linksSent = []
            }
            if onlyIfLinksChanged && body.links == nil { return nil }
            let mayForget = l.plan.digests != nil && !onlyIfLinksChanged
            switch DigestCarriage.next(digest, sent: &l.digestSent, since: &l.sinceDigest, mayForget: mayForget) {
            case .send(let d): body.digest = d
            case .forget: body.digestUnknown = true
            case .nothing: break
            }
            switch DigestCarriage.next(view, sent: &l.viewSent, since: &l.sinceView, mayForget: mayForget) {
            case .send(let d): body.view = d
            case .forget: body.viewUnknown = true
            case .nothing: break
            }
            if body.digest != nil || body.view != nil { body.statesHalf(of: l.plan) }
            s.liveness = l
            defer { s.nextNumber += 1 }
            return Message(
                kind: .request, number: s.nextNumber, flags: Message.flagNoReply,
                properties: [("Profile", SyncProtocol.Profile.heartbeat)], body: body.bytes)
        }
        guard let message else { return }
        // Unowned: sends one or two messages; a send on a closed connection fails at once.
        Task {
            if let withdrawal { try? await self.sendRaw(withdrawal) }
            try? await self.sendRaw(message)
        }
    }

    /// Sends heartbeats on an idle connection and closes it when the peer falls silent.
    private func watch() async {
        var plannedWake: Duration?
        while !Task.isCancelled {
            guard var l = state.withLock({ s in s.closedWith == nil ? s.liveness : nil }), l.running, !l.ended,
                let elapsed = l.elapsed
            else { return }
            let settings = l.plan.settings
            let now = elapsed()
            if let planned = plannedWake, now - planned > settings.interval {
                // This watchdog woke an interval or more late: this process was starved of
                // CPU, and so was its reading of the peer's messages. That time is not the
                // peer's silence; give it one interval from now.
                l.lastReceived = max(l.lastReceived, now - settings.interval)
                let granted = l.lastReceived
                state.withLock { s in
                    guard var live = s.liveness, live.running else { return }
                    live.lastReceived = max(live.lastReceived, granted)
                    s.liveness = live
                }
            }
            plannedWake = nil
            let silent = now - l.lastReceived
            if silent >= settings.deadAfter {
                let seconds = Double(silent.components.seconds) + Double(silent.components.attoseconds) / 1e18
                l.plan.logger.warning(
                    "peer went silent; link closed",
                    metadata: ["peer": "\(LogText.escape(l.plan.peerID))", "silentFor": "\(SyncError.formatSeconds(seconds))s"])
                await close(error: .peerSilent(seconds))
                return
            }
            if now - l.lastSent >= settings.interval {
                sendHeartbeat(onlyIfLinksChanged: false)
                // sendRaw notes the send when it runs; until then, count it as sent now.
                state.withLock { s in if s.liveness?.running == true { s.liveness?.lastSent = now } }
                continue
            }
            let wake = max(min(l.lastSent + settings.interval, l.lastReceived + settings.deadAfter) - now, .milliseconds(1))
            plannedWake = now + wake
            do { try await l.plan.clock.sleep(for: wake) } catch { return }
        }
    }

    /// Stops the watchdog and takes this connection out of the mesh view (the connection ended).
    func endLiveness() {
        let ended = state.withLock { s -> LivenessState? in
            guard var l = s.liveness, !l.ended else { return nil }
            l.ended = true
            s.liveness = l
            return l
        }
        guard let ended else { return }
        ended.task?.cancel()
        if let mesh = ended.plan.mesh {
            if let token = ended.watchToken { mesh.view.unwatch(token) }
            if ended.registeredLink { mesh.view.linkDown(ended.plan.peerID) }
            mesh.view.connectionClosed(ended.plan.peerID)
        }
    }
}
