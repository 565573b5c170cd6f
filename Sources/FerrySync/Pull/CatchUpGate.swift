import FerryCore
import Logging

/// A node-wide exclusive lease on catching up: one link at a time does its first bulk pull
/// after connecting, and the others wait their turn, so that a joining node fetches each
/// revision once and the links after the first start from the coverage it leaves behind.
///
/// Who waits: a replicator's pull before it reads its checkpoint, and the responder's
/// answer to a pushing peer's first push-direction `getCheckpoint`. Pushes out and the
/// serving of pulls never wait, so no two gates can wait on each other. A holder releases
/// when its first catch-up ends or its link ends; a waiter whose link ends leaves the queue.
/// Turns are granted in arrival order.
public final class CatchUpGate: Sendable {
    /// Who holds the lease and who waits, behind the mutex.
    struct State {
        var holder: CatchUpTicket?
        var queue: [(ticket: CatchUpTicket, waiter: CheckedContinuation<Void, any Error>)] = []
    }

    private let state = Locked(State())
    let logger: Logger

    public init(logger: Logger = Logger(label: "ferry.sync.catchup")) { self.logger = logger }

    /// A new place in line, not yet taken: pass it to `acquire` and, however things end, to `release`.
    func ticket(label: String) -> CatchUpTicket { CatchUpTicket(label: label) }

    /// Returns once `ticket` holds the lease. Throws `CancellationError` when the task is
    /// cancelled or the ticket is released first (a released ticket never takes the lease).
    func acquire(_ ticket: CatchUpTicket) async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                enum Outcome { case granted, waits, gone }
                let outcome = state.withLock { s -> Outcome in
                    guard ticket.phase == .new, !Task.isCancelled else {
                        ticket.phase = .done
                        return .gone
                    }
                    if s.holder == nil {
                        s.holder = ticket
                        ticket.phase = .holding
                        return .granted
                    }
                    s.queue.append((ticket, c))
                    ticket.phase = .waiting
                    return .waits
                }
                switch outcome {
                case .granted: c.resume()
                case .gone: c.resume(throwing: CancellationError())
                case .waits: logger.debug("waiting for another link's catch-up", metadata: ["link": "\(ticket.label)"])
                }
            }
        } onCancel: {
            release(ticket)
        }
    }

    /// Gives up `ticket`: ends its lease (the next in line takes it) or its wait. Idempotent.
    func release(_ ticket: CatchUpTicket) {
        let (cancelled, granted) = state.withLock { s -> (CheckedContinuation<Void, any Error>?, CheckedContinuation<Void, any Error>?) in
            let phase = ticket.phase
            ticket.phase = .done
            switch phase {
            case .new, .done: return (nil, nil)
            case .waiting:
                guard let i = s.queue.firstIndex(where: { $0.ticket === ticket }) else { return (nil, nil) }
                return (s.queue.remove(at: i).waiter, nil)
            case .holding:
                s.holder = nil
                guard !s.queue.isEmpty else { return (nil, nil) }
                let next = s.queue.removeFirst()
                s.holder = next.ticket
                next.ticket.phase = .holding
                return (nil, next.waiter)
            }
        }
        cancelled?.resume(throwing: CancellationError())
        granted?.resume()
    }

    /// The holder's label, if any, and how many wait: for tests and status.
    var snapshot: (holder: String?, waiting: Int) {
        state.withLock { s in (s.holder?.label, s.queue.count) }
    }
}

/// One link's place with a `CatchUpGate`, from asking for the lease to giving it up.
final class CatchUpTicket: Sendable {
    /// Where a ticket is; changed only under its gate's lock.
    enum Phase { case new, waiting, holding, done }

    let label: String
    private let phaseState = Locked(Phase.new)

    init(label: String) { self.label = label }

    var phase: Phase {
        get { phaseState.withLock { $0 } }
        set { phaseState.withLock { $0 = newValue } }
    }
    var holds: Bool { phase == .holding }
}
