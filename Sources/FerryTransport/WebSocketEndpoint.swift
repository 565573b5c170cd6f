import FerryCore
import FerrySync
import Logging
import NIOCore
import NIOWebSocket

/// A replication message endpoint over an upgraded WebSocket channel: each protocol
/// message is one binary WebSocket message. The channel's `WebSocketMessageHandler`
/// reassembles fragments, answers pings and closes the connection on frames the protocol
/// does not allow; this side answers the peer's close.
final class WebSocketEndpoint: MessageEndpoint {
    let transport: EndpointTransport = .messageStream
    let incoming: AsyncThrowingStream<[UInt8], any Error>
    private let continuation: AsyncThrowingStream<[UInt8], any Error>.Continuation
    private let outbound = Locked<NIOAsyncChannelOutboundWriter<WebSocketFrame>?>(nil)
    private let ready = Locked<[CheckedContinuation<Void, Never>]>([])
    private let channel: any Channel
    let isClient: Bool
    let remoteAddress: String?
    let maximumMessageSize: Int
    let logger: Logger
    let receiveActivity: ReceiveActivity? = ReceiveActivity()

    /// Sends a WebSocket ping this often while connected (nil: never), so idle links stay
    /// alive through the peer's idle timeout and dead ones are noticed.
    let pingInterval: Duration?

    init(
        _ asyncChannel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, isClient: Bool, maximumMessageSize: Int,
        logger: Logger, pingInterval: Duration? = nil
    ) {
        self.pingInterval = pingInterval
        (incoming, continuation) = AsyncThrowingStream.makeStream(of: [UInt8].self, throwing: (any Error).self)
        channel = asyncChannel.channel
        remoteAddress = channel.remoteAddress.map { a in a.ipAddress.map { "\($0):\(a.port ?? 0)" } ?? "\(a)" }
        self.isClient = isClient
        self.maximumMessageSize = maximumMessageSize
        self.logger = logger
        // Nearest the socket, so every read counts, including the fragments of a message
        // the aggregator is still assembling.
        let counter = ReadActivityHandler(activity: receiveActivity!)
        let pipeline = channel.pipeline
        channel.eventLoop.execute { try? pipeline.syncOperations.addHandler(counter, position: .first) }
        // Unowned: the pump ends when the channel closes (`executeThenClose`).
        Task { await self.pump(asyncChannel) }
        if let pingInterval {
            // Unowned: holds the endpoint weakly and ends once it is closed or gone.
            Task { [weak self] in
                while let self, !self.closed.withLock({ $0 }) {
                    try? await Task.sleep(for: pingInterval)
                    guard let writer = self.outbound.withLock({ $0 }) else { continue }
                    try? await writer.write(WebSocketFrame(fin: true, opcode: .ping, maskKey: self.mask, data: ByteBuffer()))
                }
            }
        }
    }

    private func pump(_ asyncChannel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>) async {
        do {
            try await asyncChannel.executeThenClose { inbound, outbound in
                self.outbound.withLock { $0 = outbound }
                let waiters = self.ready.withLock { w -> [CheckedContinuation<Void, Never>] in
                    defer { w.removeAll() }
                    return w
                }
                for w in waiters { w.resume() }
                // WebSocketMessageHandler passes on only whole binary messages and close frames.
                for try await frame in inbound {
                    switch frame.opcode {
                    case .binary:
                        self.continuation.yield(frame.unmaskedBytes)
                    case .connectionClose:
                        var data = frame.unmaskedData
                        let code = data.readInteger(as: UInt16.self) ?? 1000
                        let reason = data.readString(length: data.readableBytes) ?? ""
                        try? await outbound.write(WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: self.mask, data: ByteBuffer(integer: code)))
                        if code == 1000 || code == 1001 {
                            self.continuation.finish()
                        } else {
                            self.continuation.finish(throwing: SyncError.disconnected("peer closed the WebSocket (\(code)) \(reason)"))
                        }
                        return
                    default:
                        break
                    }
                }
                self.continuation.finish(throwing: SyncError.disconnected("the connection closed"))
            }
        } catch let refusal as WebSocketRefusal {
            logger.warning("closing WebSocket connection", metadata: ["reason": "\(refusal.reason)"])
            continuation.finish(throwing: SyncError.protocolViolation(refusal.reason))
        } catch {
            continuation.finish(throwing: SyncError.disconnected("\(error)"))
        }
        outbound.withLock { $0 = nil }
        let waiters = ready.withLock { w -> [CheckedContinuation<Void, Never>] in
            defer { w.removeAll() }
            return w
        }
        for w in waiters { w.resume() }
        closed.withLock { $0 = true }
    }

    private let closed = Locked(false)

    private var mask: WebSocketMaskingKey? { isClient ? .random() : nil }

    private func writer() async -> NIOAsyncChannelOutboundWriter<WebSocketFrame>? {
        if let w = outbound.withLock({ $0 }) { return w }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = outbound.withLock { $0 != nil } || closed.withLock { $0 }
            if now { c.resume() } else { ready.withLock { $0.append(c) } }
        }
        return outbound.withLock { $0 }
    }

    func send(_ message: [UInt8]) async throws(SyncError) {
        guard let writer = await writer() else { throw .disconnected("the WebSocket is closed") }
        do {
            try await writer.write(WebSocketFrame(fin: true, opcode: .binary, maskKey: mask, data: ByteBuffer(bytes: message)))
        } catch {
            throw .disconnected("WebSocket write failed: \(error)")
        }
    }

    /// Writes one raw frame, bypassing the protocol (for tests of hostile peers).
    func sendRawFrame(_ frame: WebSocketFrame) async throws {
        guard let writer = await writer() else { throw SyncError.disconnected("the WebSocket is closed") }
        try await writer.write(frame)
    }

    func close(error: SyncError?) async {
        // The reader learns of the end at once, whatever becomes of the close frame.
        continuation.finish()
        // A peer that stopped reading (a pulled cable, a frozen process) may never take the
        // close frame: the channel closes 2 s later regardless, not when TCP gives up.
        let channel = self.channel
        let deadline = channel.eventLoop.scheduleTask(in: .seconds(2)) { channel.close(promise: nil) }
        if let writer = outbound.withLock({ $0 }) {
            var buffer = ByteBuffer()
            buffer.write(webSocketErrorCode: error == nil ? .normalClosure : .unexpectedServerError)
            if let error { buffer.writeString(String(error.description.prefix(100))) }
            try? await writer.write(WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: mask, data: buffer))
        }
        deadline.cancel()
        try? await channel.close()
    }
}

/// Reports every inbound read to a `ReceiveActivity`, passing the bytes on untouched.
final class ReadActivityHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let activity: ReceiveActivity

    init(activity: ReceiveActivity) { self.activity = activity }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        activity.bytesArrived()
        context.fireChannelRead(data)
    }
}
