import NIOCore
import NIOWebSocket

/// Passes on each complete binary message and each close frame, answers pings, drops pongs,
/// and closes the connection, with the close code that says why, on a text frame, an unknown
/// opcode or a fragmented message that breaks `NIOWebSocketFrameAggregator`'s limits.
final class WebSocketMessageHandler: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    typealias InboundOut = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    /// The limits fragmented messages are reassembled under.
    struct Limits: Sendable {
        /// The largest message, whole or reassembled from fragments.
        var maxMessageSize: Int
        /// At most this many fragments make one message.
        var maxFragments = 4096
        /// A fragment other than the last carries at least this many bytes: many tiny
        /// fragments cost far more to hold than their bytes.
        var minFragmentSize = 1024
    }

    /// A client masks every frame it sends (RFC 6455 §5.3); a server masks none.
    let isClient: Bool
    let limits: Limits
    private var closing = false

    init(isClient: Bool, limits: Limits) {
        self.isClient = isClient
        self.limits = limits
    }

    /// Adds the aggregator and this handler to an upgraded channel, before the channel is
    /// wrapped for async use (the decoder's own frame limit is the upgrader's `maxFrameSize`).
    static func addHandlers(to channel: any Channel, isClient: Bool, limits: Limits) throws {
        try channel.pipeline.syncOperations.addHandlers(
            NIOWebSocketFrameAggregator(
                minNonFinalFragmentSize: limits.minFragmentSize, maxAccumulatedFrameCount: limits.maxFragments,
                maxAccumulatedFrameSize: limits.maxMessageSize),
            WebSocketMessageHandler(isClient: isClient, limits: limits))
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }
        let frame = unwrapInboundIn(data)
        switch frame.opcode {
        case .binary, .connectionClose:
            context.fireChannelRead(data)
        case .ping:
            let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: mask, data: frame.unmaskedData)
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
        case .pong:
            break
        case .text:
            refuse(context, .unacceptableData, "text frames are not part of the protocol")
        default:
            refuse(context, .protocolError, "unknown WebSocket opcode")
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let error = error as? NIOWebSocketFrameAggregator.Error else {
            context.fireErrorCaught(error)
            return
        }
        guard !closing else { return }
        switch error {
        case .accumulatedFrameSizeIsTooLarge:
            refuse(context, .messageTooLarge, "message exceeds \(limits.maxMessageSize) bytes")
        case .tooManyFragments:
            refuse(context, .policyViolation, "message in more than \(limits.maxFragments) fragments")
        case .nonFinalFragmentSizeIsTooSmall:
            refuse(context, .policyViolation, "a fragment other than the last under \(limits.minFragmentSize) bytes")
        case .receivedNewFrameWithoutFinishingPrevious:
            refuse(context, .protocolError, "a new message before the last one's final fragment")
        case .didReceiveFragmentBeforeReceivingTextOrBinaryFrame:
            refuse(context, .protocolError, "continuation frame without a message")
        }
    }

    private var mask: WebSocketMaskingKey? { isClient ? .random() : nil }

    /// Sends a close frame with `code` and `reason`, closes the channel once it is written,
    /// and reports the refusal to the endpoint as a `WebSocketRefusal`.
    private func refuse(_ context: ChannelHandlerContext, _ code: WebSocketErrorCode, _ reason: String) {
        closing = true
        var buffer = context.channel.allocator.buffer(capacity: 2 + reason.utf8.count)
        buffer.write(webSocketErrorCode: code)
        buffer.writeString(reason)  // every reason here fits a control frame's 125 bytes
        let frame = WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: mask, data: buffer)
        let bound = context.loopBound
        context.writeAndFlush(wrapOutboundOut(frame)).whenComplete { _ in bound.value.close(promise: nil) }
        context.fireErrorCaught(WebSocketRefusal(code: code, reason: reason))
    }
}

/// A connection closed because the peer sent what the protocol does not allow: the close
/// code and reason this side sent.
struct WebSocketRefusal: Error, Sendable, CustomStringConvertible {
    let code: WebSocketErrorCode
    let reason: String
    var description: String { reason }
}
