import NIOCore
import NIOWebSocket
import Testing

@testable import FerryTransport

/// Frames a peer receives are unmasked by Ferry's word-at-a-time loop; it must agree with NIO's.
@Suite struct WebSocketUnmaskTests {
    @Test func unmaskingEightBytesAtATimeAgreesWithNIOForEveryKeyAndLength() {
        var random = SystemRandomNumberGenerator()
        for length in Array(0...70) + [4096, 65_537] {
            let payload = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
            let key = WebSocketMaskingKey.random(using: &random)
            var masked = ByteBuffer(bytes: payload)
            masked.webSocketMask(key)
            let frame = WebSocketFrame(fin: true, opcode: .binary, maskKey: key, data: masked)
            #expect(frame.unmaskedBytes == Array(frame.unmaskedData.readableBytesView), "length \(length)")
            #expect(frame.unmaskedBytes == payload, "length \(length)")
        }
        let plain = WebSocketFrame(fin: true, opcode: .binary, data: ByteBuffer(bytes: [1, 2, 3]))
        #expect(plain.unmaskedBytes == [1, 2, 3])
    }
}
