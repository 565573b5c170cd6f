import FerryQuery
import NIOCore
import NIOPosix

/// The threads Mango queries run on: a query is synchronous store reads and matching, and on
/// Swift's cooperative pool (one thread per core) two long ones would stall every request of
/// both HTTP APIs; here they only wait for each other.
enum QueryWorkers {
    /// As many threads as cores (at least two); further queries queue, their deadlines running.
    static let pool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: max(2, System.coreCount))
        pool.start()
        return pool
    }()

    /// Runs `work` on the pool and returns its result.
    static func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await pool.runIfActive(work)
    }
}

/// Cancels a query's budget when its client closes the connection, or closes its sending side:
/// an HTTP/1.1 client that waits for an answer keeps that side open, and Hummingbird lets a
/// handler run on after its client went away. Sits first in the channel's pipeline, where the
/// channel's own events arrive before the HTTP handlers.
final class ClientDisconnectWatch: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    typealias InboundIn = Any

    private let channel: any Channel
    private let budget: QueryBudget

    private init(channel: any Channel, budget: QueryBudget) {
        self.channel = channel
        self.budget = budget
    }

    /// Watches `channel` until `remove()`; a channel already closed (its pipeline refuses the
    /// handler) cancels `budget` at once.
    static func install(on channel: any Channel, cancelling budget: QueryBudget) -> ClientDisconnectWatch {
        let watch = ClientDisconnectWatch(channel: channel, budget: budget)
        channel.pipeline.addHandler(watch, position: .first).whenFailure { _ in budget.cancel() }
        return watch
    }

    /// Stops watching (the query is over).
    func remove() { channel.pipeline.removeHandler(self, promise: nil) }

    /// NIO's HTTP/1 pipeline handler holds back reads while a response is pending, so the
    /// socket would not report the client's close: one read from here (below it) does. Data a
    /// pipelining client sends meanwhile goes up to the HTTP handlers, which buffer it as usual.
    func handlerAdded(context: ChannelHandlerContext) {
        context.read()
    }

    func channelInactive(context: ChannelHandlerContext) {
        budget.cancel()
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { budget.cancel() }
        context.fireUserInboundEventTriggered(event)
    }
}
