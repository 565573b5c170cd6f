import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import FerryTransport

/// Fragment reassembly, control frames and refusals, frame by frame on an EmbeddedChannel
/// that holds what an upgraded connection holds after the frame decoder.
@Suite struct WebSocketMessageHandlerTests {
    static let limits = WebSocketMessageHandler.Limits(maxMessageSize: 4096, maxFragments: 4, minFragmentSize: 16)

    func channel(isClient: Bool = false) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try WebSocketMessageHandler.addHandlers(to: channel, isClient: isClient, limits: Self.limits)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    /// A client's frame as the decoder passes it on: its payload still masked.
    func frame(_ opcode: WebSocketOpcode, fin: Bool = true, _ bytes: [UInt8]) -> WebSocketFrame {
        let key = WebSocketMaskingKey.random()
        var payload = ByteBuffer(bytes: bytes)
        payload.webSocketMask(key)
        return WebSocketFrame(fin: fin, opcode: opcode, maskKey: key, data: payload)
    }

    func bytes(_ count: Int, _ value: UInt8) -> [UInt8] { [UInt8](repeating: value, count: count) }

    /// The close frame the handler wrote: its code and reason. Written frames carry their
    /// payload unmasked; the encoder masks it on the way out.
    func closeFrame(_ channel: EmbeddedChannel) throws -> (code: WebSocketErrorCode?, reason: String) {
        let sent = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        #expect(sent.opcode == .connectionClose)
        var data = sent.data
        let code = data.readWebSocketErrorCode()
        return (code, data.readString(length: data.readableBytes) ?? "")
    }

    @Test func aFragmentedBinaryMessageIsPassedOnOnceWholeAndUnmasked() throws {
        let channel = try channel()
        try channel.writeInbound(frame(.binary, fin: false, bytes(100, 1)))
        try channel.writeInbound(frame(.continuation, fin: false, bytes(100, 2)))
        #expect(try channel.readInbound(as: WebSocketFrame.self) == nil)
        try channel.writeInbound(frame(.continuation, bytes(5, 3)))
        let message = try #require(try channel.readInbound(as: WebSocketFrame.self))
        #expect(message.opcode == .binary && message.fin)
        #expect(Array(message.unmaskedData.readableBytesView) == bytes(100, 1) + bytes(100, 2) + bytes(5, 3))
        // An unfragmented message passes as it is.
        try channel.writeInbound(frame(.binary, bytes(3, 9)))
        #expect(try channel.readInbound(as: WebSocketFrame.self).map { Array($0.unmaskedData.readableBytesView) } == bytes(3, 9))
        #expect(channel.isActive)
        _ = try channel.finish()
    }

    @Test func aMessageOverTheLimitClosesTheConnectionWithMessageTooLarge() throws {
        let channel = try channel()
        try channel.writeInbound(frame(.binary, fin: false, bytes(3000, 1)))
        #expect(throws: WebSocketRefusal.self) { try channel.writeInbound(frame(.continuation, bytes(3000, 2))) }
        let close = try closeFrame(channel)
        #expect(close.code == .messageTooLarge)
        #expect(close.reason == "message exceeds 4096 bytes")
        #expect(try channel.readInbound(as: WebSocketFrame.self) == nil)
        #expect(!channel.isActive)
    }

    @Test func tooManyFragmentsCloseTheConnectionWithPolicyViolation() throws {
        let channel = try channel()
        try channel.writeInbound(frame(.binary, fin: false, bytes(16, 1)))
        try channel.writeInbound(frame(.continuation, fin: false, bytes(16, 1)))
        try channel.writeInbound(frame(.continuation, fin: false, bytes(16, 1)))
        // A fourth non-final fragment means a message of at least five.
        #expect(throws: WebSocketRefusal.self) { try channel.writeInbound(frame(.continuation, fin: false, bytes(16, 1))) }
        #expect(try closeFrame(channel).code == .policyViolation)
        #expect(try channel.readInbound(as: WebSocketFrame.self) == nil)
        #expect(!channel.isActive)
    }

    @Test func tinyNonFinalFragmentsCloseTheConnectionWithPolicyViolation() throws {
        let channel = try channel()
        #expect(throws: WebSocketRefusal.self) { try channel.writeInbound(frame(.binary, fin: false, bytes(1, 1))) }
        #expect(try closeFrame(channel).code == .policyViolation)
        #expect(!channel.isActive)
    }

    @Test func controlFramesBetweenFragmentsAreHandledAndTheMessageStillArrives() throws {
        let channel = try channel()
        try channel.writeInbound(frame(.binary, fin: false, bytes(20, 1)))
        try channel.writeInbound(frame(.ping, Array("are you there".utf8)))
        let pong = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        #expect(pong.opcode == .pong && pong.maskKey == nil)
        #expect(Array(pong.data.readableBytesView) == Array("are you there".utf8))
        try channel.writeInbound(frame(.pong, []))
        #expect(try channel.readOutbound(as: WebSocketFrame.self) == nil)
        try channel.writeInbound(frame(.continuation, bytes(4, 2)))
        let message = try #require(try channel.readInbound(as: WebSocketFrame.self))
        #expect(Array(message.unmaskedData.readableBytesView) == bytes(20, 1) + bytes(4, 2))
        // A close frame is passed on for the endpoint to answer.
        try channel.writeInbound(frame(.connectionClose, [0x03, 0xE8]))
        #expect(try channel.readInbound(as: WebSocketFrame.self)?.opcode == .connectionClose)
        #expect(channel.isActive)
        _ = try channel.finish()
    }

    @Test func aClientMasksItsPongs() throws {
        let channel = try channel(isClient: true)
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer(bytes: [7])))
        let pong = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        #expect(pong.opcode == .pong && pong.maskKey != nil)
        #expect(Array(pong.data.readableBytesView) == [7])
        _ = try channel.finish()
    }

    @Test func aTextFrameClosesTheConnectionWithUnacceptableData() throws {
        let channel = try channel()
        #expect(throws: WebSocketRefusal.self) { try channel.writeInbound(frame(.text, Array("hello".utf8))) }
        #expect(try closeFrame(channel).code == .unacceptableData)
        #expect(try channel.readInbound(as: WebSocketFrame.self) == nil)
        #expect(!channel.isActive)
    }

    @Test func aContinuationWithoutAMessageOrANewMessageMidwayIsAProtocolError() throws {
        let stray = try channel()
        #expect(throws: WebSocketRefusal.self) { try stray.writeInbound(frame(.continuation, bytes(4, 1))) }
        #expect(try closeFrame(stray).code == .protocolError)
        #expect(!stray.isActive)

        let interleaved = try channel()
        try interleaved.writeInbound(frame(.binary, fin: false, bytes(20, 1)))
        #expect(throws: WebSocketRefusal.self) { try interleaved.writeInbound(frame(.binary, bytes(4, 2))) }
        #expect(try closeFrame(interleaved).code == .protocolError)
        #expect(try interleaved.readInbound(as: WebSocketFrame.self) == nil)
        #expect(!interleaved.isActive)
    }
}
