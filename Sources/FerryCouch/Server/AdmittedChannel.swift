import HummingbirdCore
import Logging
import NIOCore

/// A Hummingbird child channel that asks `admit` about each accepted connection before any
/// TLS or HTTP work: a connection it refuses (and closes) is never set up or served.
struct AdmittedChannel<Inner: ServerChildChannel>: ServerChildChannel {
    typealias Value = Inner.Value
    let inner: Inner
    let admit: @Sendable (any Channel) -> Bool

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        // A failed set-up is dropped by the server: no task is made for the connection.
        guard admit(channel) else { return channel.eventLoop.makeFailedFuture(ChannelError.inputClosed) }
        return inner.setup(channel: channel, logger: logger)
    }

    func handle(value: Value, logger: Logger) async { await inner.handle(value: value, logger: logger) }
}
