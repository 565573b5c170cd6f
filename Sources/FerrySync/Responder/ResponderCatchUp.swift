import FerryCore
import FerryStore
import Logging

/// One responder session's part in catch-up coordination: the pushing peer's coverage as
/// its hello stated it, and the session's place with the node's `CatchUpGate`.
final class ResponderCatchUp: Sendable {
    /// What the session knows of the pushing peer, behind the mutex.
    struct State {
        var peerDatabase = ""
        var peerCoverage: CoverageSnapshot?
        /// The peer lists the relays its pushes leave out (`skipReports`).
        var peerReportsSkips = false
        /// Whether the peer's hello lists `accessRemoval`.
        var peerAcceptsRemovals = false
        /// Those relays, until this store holds them: coverage stays below them.
        var hold = CoverageHold()
        /// The sequence of the peer's last push checkpoint write (where an unreported skip may start after).
        var lastWritten: UInt64 = 0
        var ticket: CatchUpTicket?
        /// The first push-direction checkpoint read was answered (only that one waits).
        var asked = false
        /// The peer's stated coverage was taken over (once per session).
        var adopted = false
        /// The session ended: a request still being answered must not take the lease then
        /// (its handler can outlive the session, and nothing would release it).
        var ended = false
    }

    let state = Locked(State())
}

extension ResponderSession {
    var gate: CatchUpGate? { options.catchUpGate }

    /// Whether the peer's hello lists `accessRemoval`.
    var acceptsRemovals: Bool { catchUp.state.withLock { $0.peerAcceptsRemovals } }

    /// Notes the peer's database and stated coverage from its hello.
    func noteHello(_ hello: HelloRequest) {
        catchUp.state.withLock {
            $0.peerDatabase = hello.database
            $0.peerCoverage = hello.coverage
            $0.peerReportsSkips = hello.features.contains(SyncProtocol.skipReportsFeature)
            $0.peerAcceptsRemovals = hello.features.contains(SyncProtocol.accessRemovalFeature)
        }
    }

    /// This node's coverage for the hello reply: only to a peer whose pulls it serves
    /// without restriction (what it covers is then what the peer may read).
    func coverageForHello(peerDatabase: String) -> CoverageSnapshot? {
        guard options.allowPull, policy.read.admitsEverything else { return nil }
        return try? Coverage.snapshot(of: store, leavingOut: peerDatabase)
    }

    /// Whether what this peer pushes reaches the store unrestricted: the peer pushes
    /// unfiltered (it stated its coverage), and its policy here and the node's incoming
    /// filter let every revision and deletion through.
    var pushIntakeIsComplete: Bool {
        // A peer that does not list the relays it skips could make coverage claim them.
        let stated = catchUp.state.withLock { $0.peerCoverage != nil && $0.peerReportsSkips }
        let p = policy
        return stated && p.write.admitsEverything && p.mayDelete && options.incomingFilter == nil && options.allowPush
            && !options.readOnly
    }

    /// Before a push-direction checkpoint read is answered: the first one of a peer that
    /// stated its coverage waits for the catch-up lease, and holds it while that peer's push
    /// catches this node up. Returns the `holds` floor for the answer.
    func pushCheckpointTurn() async throws -> UInt64? {
        let (database, coverage, first) = catchUp.state.withLock { s -> (String, CoverageSnapshot?, Bool) in
            defer { s.asked = true }
            return (s.peerDatabase, s.peerCoverage, !s.asked)
        }
        if first, let gate, let coverage {
            let ticket = gate.ticket(label: "push from \(peerForLog)")
            let ended = catchUp.state.withLock { s -> Bool in
                if !s.ended { s.ticket = ticket }
                return s.ended
            }
            if ended { throw SyncError.disconnected("the session ended") }
            do {
                try await gate.acquire(ticket)
            } catch {
                throw SyncError.disconnected("the session ended while waiting for another link's catch-up")
            }
            // Nothing to wait for when this node already holds the peer's feed that far.
            if coverage.sequence <= (try Coverage.of(database, in: store) ?? 0) { gate.release(ticket) }
        }
        guard !database.isEmpty else { return nil }
        return try Coverage.of(database, in: store)
    }

    /// After a push-direction checkpoint write through `sequence` of the peer's feed: the
    /// peer's push has stored that much here. Raises coverage when the intake is complete;
    /// once the push reached the end of the peer's feed (`caughtUp`), this node holds all the
    /// peer held at hello and takes over its stated coverage (once). The lease passes on then,
    /// or as soon as the push passed the feed's end as the hello stated it.
    func pushCheckpointWritten(
        through sequence: UInt64, caughtUp: Bool, skipped: [SkippedRelay] = [], skipsLost: Bool = false
    ) throws {
        let (database, coverage, ticket, adopt) = catchUp.state.withLock { s in
            (s.peerDatabase, s.peerCoverage, s.ticket, caughtUp && !s.adopted)
        }
        let complete = pushIntakeIsComplete
        // Coverage stays below the relays the push left out until this store holds them.
        var (hold, previous) = catchUp.state.withLock { ($0.hold, $0.lastWritten) }
        hold.note(skipped, lostFrom: skipsLost ? previous + 1 : nil)
        let coverable = try hold.coverable(through: sequence, store: store)
        catchUp.state.withLock {
            $0.hold = hold
            $0.lastWritten = sequence
        }
        if complete && coverable > 0 { try Coverage.raise(database, to: coverable, in: store) }
        // Its coverage counts the relays it skipped: taken over only once this store holds them.
        if adopt, complete, hold.isClear, let coverage {
            catchUp.state.withLock { $0.adopted = true }
            let raised = try Coverage.adopt(coverage, in: store)
            responder.logger.debug(
                "caught up by a peer's push; took over its coverage", metadata: ["peer": "\(peerForLog)", "raised": "\(raised)"])
        }
        if let ticket, ticket.holds, caughtUp || sequence >= (coverage?.sequence ?? 0) { gate?.release(ticket) }
    }

    /// The session ended: leave the line, or pass the lease on.
    func catchUpEnded() {
        let ticket = catchUp.state.withLock { s -> CatchUpTicket? in
            s.ended = true
            return s.ticket
        }
        if let ticket { gate?.release(ticket) }
    }
}
